#include "bench/decode_bench.h"

#include <algorithm>
#include <chrono>

#include "model/schema.h"

namespace fb::bench {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One draft block as a greedy generator asks for it (ids and confidences, no Markov-corrected rows).
Status greedy_draft(model::Executor& ex, model::SessionState& s, const uint16_t* tap, int64_t p) {
  model::DraftJob job;
  job.session = &s;
  job.anchor = 5;
  job.tap_row = tap;
  job.p = p;
  job.want_logits = false;
  return ex.draft_many({job})[0].status();
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<DecodeTiming> time_decode(model::Executor& ex, model::SessionState& s, int steps, int max_verify_rows) {
  DecodeTiming out;
  const model::Config& c = ex.config();
  std::vector<model::SessionState*> ss{&s};
  const int64_t L = s.n_pos();
  auto rows = [&](int r) {
    model::Step st;
    for (int i = 0; i < r; ++i) {
      model::Row row;
      row.pos = L + i;
      row.token = int32_t((L * 31 + i * 7919) % c.vocab_size);
      row.kind = model::RowKind::kDecode;
      row.want_logits = true;
      st.rows.push_back(row);
    }
    return st;
  };
  // Warm-up, then interleave: one decode and every verify size per round, rolled back each time.
  for (int w = 0; w < 2; ++w) {
    FB_TRY(ex.forward(rows(1), ss));
    FB_RETURN_IF_ERROR(s.rollback(L));
  }
  std::vector<std::vector<double>> t(size_t(std::max(1, max_verify_rows)));
  std::vector<double> td, te;
  for (int k = 0; k < steps; ++k) {
    for (int r = 1; r <= std::max(1, max_verify_rows); ++r) {
      const double t0 = now_ms();
      FB_TRY(ex.forward(rows(r), ss));  // returns logits to the host: synchronous
      t[size_t(r - 1)].push_back(now_ms() - t0);
      if (r == 1) te.push_back(ex.last_enqueue_ms());
      FB_RETURN_IF_ERROR(s.rollback(L));
    }
    if (c.n_mtp_layers > 0 && L >= 2) {
      std::vector<uint16_t> tap(size_t(c.dspark_target_layer_ids.size()) * size_t(c.dim), 0x3C00);  // 1.0
      const double t0 = now_ms();
      FB_RETURN_IF_ERROR(greedy_draft(ex, s, tap.data(), L - 1));
      td.push_back(now_ms() - t0);
    }
  }
  out.decode_ms = median(t[0]);
  for (auto& v : t) out.verify_ms.push_back(median(v));
  out.draft_ms = median(td);
  out.enqueue_ms = median(te);
  return out;
}

model::Step decode_row_step(const model::Config& c, int64_t L, int k) {
  model::Step st;
  model::Row row;
  row.pos = L;
  row.token = int32_t((L * 31 + int64_t(k) * 7919) % c.vocab_size);
  row.kind = model::RowKind::kDecode;
  row.want_logits = true;
  st.rows.push_back(row);
  return st;
}

Status run_decode_steps(model::Executor& ex, model::SessionState& s, int steps, int rows, std::vector<double>* ms, const std::function<void()>& on_step) {
  std::vector<model::SessionState*> ss{&s};
  const int64_t L = s.n_pos();
  for (int k = 0; k < steps; ++k) {
    model::Step st;
    for (int r = 0; r < std::max(1, rows); ++r) {
      model::Step one = decode_row_step(ex.config(), L + r, k);
      st.rows.push_back(one.rows[0]);
    }
    const double t0 = now_ms();
    FB_TRY(ex.forward(st, ss));
    if (ms) ms->push_back(now_ms() - t0);
    FB_RETURN_IF_ERROR(s.rollback(L));
    if (on_step) on_step();
  }
  return Status();
}

Status run_drafts(model::Executor& ex, model::SessionState& s, int n) {
  const model::Config& c = ex.config();
  const int64_t L = s.n_pos();
  if (c.n_mtp_layers == 0 || L < 2) return Status();
  std::vector<uint16_t> tap(size_t(c.dspark_target_layer_ids.size()) * size_t(c.dim), 0x3C00);  // 1.0
  for (int k = 0; k < n; ++k) FB_RETURN_IF_ERROR(greedy_draft(ex, s, tap.data(), L - 1));
  return Status();
}

StepCost decode_step_cost(const model::Config& c, int64_t L, bool wo_a_bf16) {
  StepCost k;
  for (const auto& s : model::expected_tensors(c)) {
    if (s.klass == model::ByteClass::kVision || s.klass == model::ByteClass::kDraft || s.klass == model::ByteClass::kEmbed) continue;
    if (s.klass == model::ByteClass::kRoutedExperts) continue;  // counted per active expert below
    if (s.klass == model::ByteClass::kEngramTables) continue;   // 24 rows per table below
    double b = double(s.nbytes());
    if (wo_a_bf16 && s.name.find("attn.wo_a.weight") != std::string::npos) b *= 2;
    if (wo_a_bf16 && s.name.find("attn.wo_a.scale") != std::string::npos) b = 0;
    k.weight_bytes += b;
    if (s.shape.size() == 2 && s.klass != model::ByteClass::kMhc) k.flops += 2.0 * double(s.shape[0]) * double(s.shape[1]);
  }
  const double expert_bytes = 3.0 * (double(c.moe_inter_dim) * c.dim / 2 + double(c.moe_inter_dim) * c.dim / 32);
  k.weight_bytes += double(c.n_layers) * c.n_activated_experts * expert_bytes;
  k.flops += double(c.n_layers) * c.n_activated_experts * 3.0 * 2.0 * c.moe_inter_dim * c.dim;
  const int n_cols = (c.engram_max_ngram - 1) * c.engram_n_heads;
  k.weight_bytes += double(c.engram_layer_ids.size()) * n_cols * (c.engram_head_dim + c.engram_head_dim / 32);
  k.weight_bytes += double(c.dim) * 2;  // the embedding row
  // caches (spec/12 §2.1): window rows, selected compressed rows, index keys scanned
  const double ring = double(c.head_dim + c.head_dim / 32), comp = double(c.head_dim / 2 + c.head_dim / 16),
               key = double(c.index_head_dim / 2 + c.index_head_dim / 32);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& r = c.roles[size_t(l)];
    k.cache_bytes += double(std::min<int64_t>(L, c.window_size)) * ring;
    if (r.ratio == 0) continue;
    const int64_t n = L / r.ratio;
    k.cache_bytes += double(std::min<int64_t>(n, c.index_topk)) * comp;
    if (r.index_source) {
      const int64_t scanned = r.pool_restricted ? std::min<int64_t>(n, int64_t(c.candidate_topk_blocks) * c.candidate_block_size) : n;
      k.cache_bytes += double(scanned) * key;
      k.flops += double(scanned) * c.index_n_heads * c.index_head_dim * 2;
    }
    k.flops += double(c.n_heads) * c.head_dim * 4.0 * (std::min<int64_t>(L, c.window_size) + std::min<int64_t>(n, c.index_topk));
  }
  return k;
}

}  // namespace fb::bench
