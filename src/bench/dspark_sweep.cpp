#include "bench/dspark_sweep.h"

namespace fb::bench {

Result<std::vector<engine::ForcedAcceptanceReport>> dspark_sweep(model::Executor& ex, int64_t prompt_len, int64_t n_tokens,
                                                                 const std::vector<double>& ps, int verify_rows, const ProgressFn& progress) {
  const model::Config& c = ex.config();
  if (c.n_mtp_layers == 0) return FB_ERROR(kUnsupported) << "the model has no DSpark stages";
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < prompt_len; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 17) % c.vocab_size);
  engine::GeneratorOptions opt;
  opt.prefill_chunk = 256;
  opt.dspark_verify = verify_rows;  // forced length (the speed model is checkable); -1: the scheduler
  const std::string phase = verify_rows < 0 ? "bench dspark sweep (scheduled)" : "bench dspark sweep";
  if (progress) progress(phase, 0, 1 + int64_t(ps.size()), "runs");
  return engine::run_forced_acceptance(ex, prompt, n_tokens, ps, opt, 1, [&](int64_t done, int64_t total) {
    if (progress) progress(phase, done, total, "runs");
  });
}

}  // namespace fb::bench
