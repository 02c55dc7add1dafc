// TimedOps<Ex>: an executor step object for run_backbone (model/forward.h) that forwards every op
// to `Ex` with a steady_clock reading around it and adds the time to the op's family (issue 24's
// step time by op family). It changes no numerics and no order. Host clock only: it measures an
// op's whole cost where the op computes while it is called (the CPU executor); a backend that
// only enqueues (CUDA) would measure its launch time, so it keeps its own event profiler instead.
// Cost: two clock reads per op, ~14 ops per layer (docs/serving.md has the measured share).
#pragma once

#include <chrono>

#include "model/executor_stats.h"
#include "model/forward.h"

namespace fb::model {

template <class Ex>
class TimedOps {
 public:
  TimedOps(Ex& ex, OpTimes& t) : ex_(ex), t_(t) {}

  void embed() { time(OpFamily::kEmbed, [&] { ex_.embed(); }); }
  void engram_hash() { time(OpFamily::kEngram, [&] { ex_.engram_hash(); }); }
  void engram(int l) { time(OpFamily::kEngram, [&] { ex_.engram(l); }); }
  void dspark_tap(int i) { time(OpFamily::kMhc, [&] { ex_.dspark_tap(i); }); }
  bool leave_begin(int l) {
    bool r = false;
    time(OpFamily::kOther, [&] { r = ex_.leave_begin(l); });
    return r;
  }
  void leave_end(int l) { time(OpFamily::kOther, [&] { ex_.leave_end(l); }); }
  void hc_mixes(int l, Site s) { time(OpFamily::kMhc, [&] { ex_.hc_mixes(l, s); }); }
  void hc_collapse_norm(int l, Site s) { time(OpFamily::kMhc, [&] { ex_.hc_collapse_norm(l, s); }); }
  void hc_expand(int l, Site s) { time(OpFamily::kMhc, [&] { ex_.hc_expand(l, s); }); }
  void attn_q(int l) { time(OpFamily::kAttnProj, [&] { ex_.attn_q(l); }); }
  void attn_kv(int l) { time(OpFamily::kAttnProj, [&] { ex_.attn_kv(l); }); }
  void attn_output(int l) { time(OpFamily::kAttnProj, [&] { ex_.attn_output(l); }); }
  void compress(int l) { time(OpFamily::kIndex, [&] { ex_.compress(l); }); }
  void index_select(int l) { time(OpFamily::kIndex, [&] { ex_.index_select(l); }); }
  void attention(int l) { time(OpFamily::kAttention, [&] { ex_.attention(l); }); }
  void moe(int l) { time(OpFamily::kMoe, [&] { ex_.moe(l); }); }
  void end_layer(int l) { time(OpFamily::kOther, [&] { ex_.end_layer(l); }); }
  void head() { time(OpFamily::kHead, [&] { ex_.head(); }); }

 private:
  template <class F>
  void time(OpFamily f, F&& op) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    t_.s[size_t(f)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t_.calls[size_t(f)];
  }
  Ex& ex_;
  OpTimes& t_;
};

// run_backbone with every op timed into `t` (one more step counted).
template <class Ex>
void run_backbone_timed(Ex& ex, const Config& c, OpTimes& t) {
  TimedOps<Ex> timed(ex, t);
  run_backbone(timed, c);
  ++t.steps;
}

}  // namespace fb::model
