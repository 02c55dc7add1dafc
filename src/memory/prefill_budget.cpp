// prefill_step_bytes / prefill_chunk_rows (prefill_budget.h): a replay of the CUDA tensor-core
// prefill step's allocations (cuda/layer_ops.h CudaLayerOps and Arena, cuda/executor.cu CudaStep,
// model::run_backbone's op order) at a config's shape.
#include "memory/prefill_budget.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "model/hc_mix.h"
#include "model/session_layout.h"

namespace fb::memory {

namespace {

// cuda/layer_ops.h Arena: a bump allocator rounding each buffer to 256 bytes (at least one
// element); a frame hands everything allocated inside it back when the op ends.
class ArenaReplay {
 public:
  explicit ArenaReplay(PrefillStepBytes* b) : b_(b) {}
  void alloc(const std::string& name, uint64_t elems, uint64_t elem_bytes) {
    const uint64_t bytes = (std::max<uint64_t>(elems, 1) * elem_bytes + 255) & ~uint64_t(255);
    need_ += bytes;
    peak_ = std::max(peak_, need_);
    if (frame_.empty()) {
      held_[name] += bytes;
      b_->step += bytes;
    } else {
      open_[name] += bytes;
    }
  }
  // CudaLayerOps::upload_all: the vectors packed at 16-byte offsets, one upload.
  void upload_all(const std::string& name, std::initializer_list<uint64_t> vector_bytes) {
    uint64_t total = 0;
    for (uint64_t v : vector_bytes) total += (v + 15) / 16 * 16;
    alloc(name, std::max<uint64_t>(total, 1), 1);
  }
  void open(const std::string& op) {
    frame_ = op;
    mark_ = need_;
  }
  // Ends the op's frame: its temporaries (largest call) are kept by name; `kind` gets the frame's size.
  void close(uint64_t* kind) {
    uint64_t sum = 0;
    for (const auto& [n, v] : open_) {
      temp_[n] = std::max(temp_[n], v);
      sum += v;
    }
    if (kind) *kind = std::max(*kind, sum);
    open_.clear();
    frame_.clear();
    need_ = mark_;
  }
  void finish() {
    b_->arena_peak = peak_;
    for (const auto& [n, v] : held_) b_->buffers.push_back({n, v, true});
    for (const auto& [n, v] : temp_) b_->buffers.push_back({n, v, false});
  }

 private:
  PrefillStepBytes* b_;
  uint64_t need_ = 0, peak_ = 0, mark_ = 0;
  std::string frame_;
  std::map<std::string, uint64_t> held_, temp_, open_;
};

// cuda/tc_gemm.cu TcGemm::scratch_bytes: slot s grows to 9/8 of its largest request.
struct TcSlots {
  uint64_t req[8] = {};
  void want(int slot, uint64_t bytes) { req[slot] = std::max(req[slot], std::max<uint64_t>(bytes, 16)); }
};

}  // namespace

PrefillStepBytes prefill_step_bytes(const model::Config& c, int64_t rows, int64_t context) {
  PrefillStepBytes b;
  const uint64_t T = uint64_t(std::max<int64_t>(rows, 0));
  const uint64_t N = uint64_t(std::max<int64_t>({context, rows, int64_t(1)}));
  if (T == 0) return b;
  const uint64_t D = uint64_t(c.dim), hc = uint64_t(c.hc_mult), I = uint64_t(c.moe_inter_dim), hd = uint64_t(c.head_dim);
  const uint64_t qd = uint64_t(c.q_dim()), ql = uint64_t(c.q_lora_rank), ihd = uint64_t(c.index_head_dim), IH = uint64_t(c.index_n_heads);
  const uint64_t G = uint64_t(c.o_groups), OR = uint64_t(c.o_lora_rank), W = uint64_t(c.window_size), H = uint64_t(c.n_heads);
  const uint64_t n_taps = uint64_t(c.dspark_target_layer_ids.size());
  uint64_t max_active = 1;
  for (const model::LayerRole& r : c.roles) max_active = std::max<uint64_t>(max_active, uint64_t(r.n_active));
  ArenaReplay a(&b);
  TcSlots tc;
  auto fp8 = [&](uint64_t M, uint64_t n_out, uint64_t k_in) {  // tc_fp8_gemm_q: expanded input and weight
    tc.want(3, M * k_in * 2);
    tc.want(0, n_out * k_in * 2);
  };
  // CudaLayerOps(): the step's activations and act_quant buffers.
  a.alloc("step.X", T * hc * D, 2);
  a.alloc("step.residual", T * hc * D, 2);
  a.alloc("step.pre", T * hc, 4);
  a.alloc("step.mix_a", T, sizeof(model::HcMix));
  a.alloc("step.mix_f", T, sizeof(model::HcMix));
  a.alloc("step.u", T * D, 2);
  a.alloc("step.y", T * D, 2);
  a.alloc("step.h", T * D, 2);
  a.alloc("step.qr", T * ql, 2);
  a.alloc("step.q", T * qd, 2);
  a.alloc("step.kv", T * hd, 2);
  a.alloc("step.kv_raw", T * hd, 2);
  a.alloc("step.kv_codes", T * (hd + hd / 32), 1);
  a.alloc("step.o", T * qd, 2);
  const uint64_t k_max = std::max<uint64_t>({D, ql, G * OR, I, hd, uint64_t(c.engram_cat_dim()), n_taps * D});
  const uint64_t qcap = T * std::max<uint64_t>(k_max, max_active * I);
  a.alloc("step.q_buf.codes", qcap, 1);
  a.alloc("step.q_buf.scales", qcap / 32 + 1, 4);
  a.alloc("step.uq.codes", T * D, 1);
  a.alloc("step.uq.scales", T * D / 32 + 1, 4);
  a.alloc("step.qrq.codes", T * ql, 1);
  a.alloc("step.qrq.scales", T * ql / 32 + 1, 4);
  // CudaStep(): positions and image flags (one upload), the DSpark tap rows.
  a.upload_all("step.rows", {T * 8, T});
  a.alloc("step.taps", T * n_taps * D, 2);
  // embed(), engram_hash()
  a.alloc("embed.src", T, 8);
  const uint64_t n_tab = uint64_t(c.engram_layer_ids.size()), n_ord = uint64_t(std::max(c.engram_max_ngram - 1, 0));
  if (n_tab > 0) a.alloc("engram.hashes", T * n_tab * n_ord * uint64_t(c.engram_n_heads), 8);
  const uint64_t n_mix = (2 + hc) * hc;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerRole& r = c.roles[size_t(l)];
    if (r.engram_table >= 0) {  // engram(l), tables in HBM
      const uint64_t n_cols = n_ord * uint64_t(c.engram_n_heads), ehd = uint64_t(c.engram_head_dim);
      a.open("engram");
      a.alloc("engram.E", T * n_cols * ehd, 2);
      a.alloc("engram.kv", T * (1 + hc) * D, 2);
      a.close(nullptr);
      fp8(T, (1 + hc) * D, n_cols * ehd);
    }
    // hc_mixes on tensor cores (tc_hc_mixes): split weights and dots in scratch
    tc.want(6, 3 * n_mix * hc * D * 2);
    tc.want(7, T * n_mix * 4);
    a.open("attn_q");
    a.alloc("attn_q.a", T * ql, 2);
    a.close(nullptr);
    fp8(T, ql, D);   // wq_a
    fp8(T, hd, D);   // wkv
    fp8(T, qd, ql);  // wq_b
    if (r.kv_source) {  // compress(l): no frame, its buffers stay until the step ends
      const uint64_t ratio = uint64_t(std::max(r.ratio, 1)), E = T / ratio;
      const uint64_t kvb = uint64_t(model::comp_kv_bytes(c)), keyb = uint64_t(model::comp_key_bytes(c));
      if (r.ratio == 2) a.alloc("compress.kg", T * 2 * hd, 4);
      else a.alloc("compress.lat1", T * hd, 2);
      if (E > 0) {
        a.alloc("compress.latent", E * hd, 2);
        a.alloc("compress.tmp", E * ihd, 2);
        a.alloc("compress.key", E * ihd, 2);
        a.alloc("compress.kv_stage", E * kvb, 1);
        a.alloc("compress.key_stage", E * keyb, 1);
        a.alloc("compress.gpos", E, 8);
        if (r.ratio == 2) {
          a.alloc("compress.pooled", E * hd, 2);
          a.upload_all("compress.even_odd", {E * 8, E * 8});
        }
        a.upload_all("compress.copy_lists", {E * 8, E * 8, E * 8, E * 8});
      }
      if (r.ratio == 2) {
        const uint64_t tails = std::min<uint64_t>(T, model::kTailSlots);
        a.upload_all("compress.tails", {tails * 8, tails * 8});
      }
    }
    if (r.index_source) {  // index_select(l): selection, n_scored and the pool outlive the op
      const uint64_t ratio = uint64_t(std::max(r.ratio, 1)), ld = std::max<uint64_t>(N / ratio, 1);
      a.alloc("index.sel_ids", T * uint64_t(c.index_topk), 4);
      a.alloc("index.sel_count", T, 4);
      a.alloc("index.n_scored", T, 8);
      if (r.candidate_source) a.alloc("index.pool", T * ld, 1);
      a.open("index");
      a.alloc("index.iq", T * IH * ihd, 2);
      a.alloc("index.wts", T * IH, 2);
      a.alloc("index.scores", T * ld, 4);
      a.upload_all("index.lists", {T * 8, T * 8});
      a.close(&b.attention);
      fp8(T, IH * ihd, ql);  // idx_wq_b
      // tc_index_scores: expanded keys and the bf16 dots of R rows (about 1 GiB)
      const uint64_t nk = std::max<uint64_t>(8, (N / ratio + 7) / 8 * 8);
      const uint64_t R = std::max<uint64_t>(1, std::min<uint64_t>(T, (uint64_t(1) << 30) / (IH * nk * 2)));
      tc.want(4, nk * ihd * 2);
      tc.want(5, R * IH * nk * 2);
    }
    {  // attention(l): key lists; tc_sparse_attention's gathered keys, scores, P, partial sums
      const uint64_t width = std::min<uint64_t>(N, W);
      a.open("attention");
      a.upload_all("attention.keys", {T * width * 8, (T + 1) * 4, T * 8});
      a.close(&b.attention);
      const uint64_t max_keys = width + (r.ratio > 0 ? uint64_t(c.index_topk) : 0);
      const uint64_t NB = (max_keys + 63) / 64, NK = NB * 64;
      const uint64_t per_row = NK * hd * 2 + H * NK * 4 + NK * H * 2 + NB * H * hd * 4 + NK + H * (NB + 1) * 4;
      const uint64_t R = std::max<uint64_t>(1, std::min<uint64_t>(T, (uint64_t(1) << 30) / per_row));
      auto al = [](uint64_t x) { return (x + 255) / 256 * 256; };
      tc.want(4, R * NK * hd * 2);
      tc.want(5, R * H * NK * 4);
      tc.want(6, al(R * NB * H * 64 * 2) + al(R * H * NB * 4) + al(R * H * 4) + R * NK);
      tc.want(7, R * NB * H * hd * 4);
    }
    a.open("attn_output");
    a.alloc("attn_output.z", T * G * OR, 2);
    a.close(nullptr);
    fp8(T, D, G * OR);  // wo_b
    {  // moe(l) on the tensor-core path (tiered or not: the same buffers)
      const uint64_t K = uint64_t(std::max(r.n_active, 1)), n = T * K, E = uint64_t(std::max(r.n_experts, 1));
      a.open("moe");
      a.alloc("moe.experts", n, 4);
      a.alloc("moe.weights", n, 4);
      a.alloc("moe.a", T * I, 2);
      a.alloc("moe.b", T * I, 2);
      a.alloc("moe.ye", n * D, 2);
      a.alloc("moe.ys", T * D, 2);
      a.alloc("moe.route_scratch", 2 * T * E, 4);
      a.alloc("moe.perm", n, 4);
      a.alloc("moe.xp", n * D, 2);
      a.alloc("moe.ap", n * I, 2);
      a.alloc("moe.bp", n * I, 2);
      a.alloc("moe.hp", n * I, 2);
      a.alloc("moe.yp", n * D, 2);
      a.alloc("moe.wp", n, 4);
      a.close(&b.moe);
      tc.want(0, I * D * 2);  // expanded w1 / w3 / w2 of one expert
      tc.want(1, I * D * 2);
      tc.want(2, D * I * 2);
      fp8(T, I, D);  // shared w1, w3
      fp8(T, D, I);  // shared w2
    }
    // end_layer(l): the ring writes' copy lists (no frame)
    const uint64_t ring = std::min<uint64_t>(T, W + model::kRingHeadroom);
    a.upload_all("end_layer.ring_lists", {ring * 8, ring * 8});
  }
  // head(): the last prompt row's logits (the chunk that holds it)
  a.alloc("head.logits", uint64_t(c.vocab_size), 4);
  a.alloc("head.hrows", D, 2);
  a.alloc("head.nrm", D, 2);
  a.alloc("head.rows", 1, 4);
  a.finish();
  for (int s = 0; s < 8; ++s) {
    const uint64_t held = tc.req[s] > 0 ? tc.req[s] + tc.req[s] / 8 : 0;
    b.tc += held;
    if (held) b.buffers.push_back({"tc.slot" + std::to_string(s), held, true});
  }
  const uint64_t lt_workspace = uint64_t(64) << 20;  // tc_gemm.cu kWorkspaceBytes
  b.tc += lt_workspace;
  b.buffers.push_back({"tc.cublaslt_workspace", lt_workspace, true});
  // Session state for `context` positions: compressed KV and index keys (a reallocation holds the
  // old copy beside the new one of up to twice the entries: 3x), ratio-2 tails, window rings.
  uint64_t comp = 0, rings = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerRole& r = c.roles[size_t(l)];
    if (!r.kv_source) continue;
    const uint64_t entries = std::max<uint64_t>(N / uint64_t(std::max(r.ratio, 1)), 64);
    comp += 3 * entries * uint64_t(model::comp_kv_bytes(c) + model::comp_key_bytes(c));
    if (r.ratio == 2) comp += uint64_t(model::kTailSlots) * 2 * hd * 4;
  }
  rings = (uint64_t(c.n_layers) * (W + model::kRingHeadroom) + uint64_t(c.n_mtp_layers) * W) * (hd + hd / 32);
  // RoPE tables (plain and YaRN; cos and sin; growth holds old and new: 3x the positions).
  const uint64_t rope = 2 * 2 * 3 * N * uint64_t(c.rope_head_dim / 2) * 4;
  b.session = comp + rings + rope;
  b.buffers.push_back({"session.compressed", comp, true});
  b.buffers.push_back({"session.rings", rings, true});
  b.buffers.push_back({"session.rope", rope, true});
  return b;
}

int64_t prefill_chunk_rows(const model::Config& c, uint64_t budget_bytes, int64_t context, int64_t max_rows, int64_t quantum) {
  quantum = std::max<int64_t>(quantum, 1);
  int64_t best = 0;
  for (int64_t r = quantum; r <= max_rows; r += quantum) {
    if (prefill_step_bytes(c, r, std::max(context, r)).total() > budget_bytes) break;
    best = r;
  }
  return best;
}

int64_t prefill_balanced_chunk(int64_t max_rows, int64_t prompt, int64_t quantum) {
  if (max_rows <= 0 || prompt <= 0) return 0;
  if (prompt <= max_rows) return prompt;
  quantum = std::max<int64_t>(quantum, 1);
  const int64_t chunks = (prompt + max_rows - 1) / max_rows;
  const int64_t even = ((prompt + chunks - 1) / chunks + quantum - 1) / quantum * quantum;
  return std::min(even, max_rows);
}

uint64_t prefill_budget_from_free(uint64_t free_bytes, uint64_t total_bytes, uint64_t margin_bytes, double margin_frac) {
  const uint64_t margin = margin_bytes + uint64_t(double(total_bytes) * std::max(0.0, margin_frac));
  return free_bytes > margin ? free_bytes - margin : 0;
}

ColdPrefillEstimate cold_prefill_estimate(int64_t prompt, int64_t chunk, int n_layers, int decoder_start, int64_t window, int experts, int slots,
                                          int top_k, double expert_bytes, double h2d_bytes_per_s, const ColdPrefillCompute& compute,
                                          bool replay_stages_all) {
  ColdPrefillEstimate e;
  const double rate = h2d_bytes_per_s * compute.copy_efficiency;
  if (prompt <= 0 || chunk <= 0 || n_layers <= 0 || experts <= 0 || !(rate > 0)) return e;
  const double E = experts, missing = std::max(0, experts - slots);
  const double layer_copy_s = missing * expert_bytes / rate;
  e.copy_s = n_layers * layer_copy_s;
  // A streamed layer step: the longer of its compute and its copies (+ what a copy-bound step
  // leaves exposed); nothing to copy, nothing exposed.
  const auto streamed = [&](double compute_s, double copy_s) {
    return copy_s > 0 ? std::max(compute_s, copy_s + compute.exposed_copy_ms * 1e-3) : compute_s;
  };
  const bool replay = decoder_start > 0 && decoder_start < n_layers;
  const int64_t W = std::min(window, prompt);
  for (int64_t s0 = 0; s0 < prompt; s0 += chunk, ++e.chunks) {
    const int64_t n = std::min(chunk, prompt - s0);
    const double layer_s = compute.layer_ms(double(n), double(s0) + 0.5 * double(n)) * 1e-3;
    e.serial_s += n_layers * (layer_s + layer_copy_s);
    e.streamed_s += n_layers * streamed(layer_s, layer_copy_s);
    if (!replay) continue;
    e.replay_s += decoder_start * streamed(layer_s, layer_copy_s);
    const int64_t d = std::max<int64_t>(0, s0 + n - std::max(s0, prompt - W));  // this chunk's rows that run the decoder
    if (d == 0) continue;
    const double distinct = E * (1.0 - std::pow(1.0 - double(top_k) / E, double(d)));
    const double dec_copy_s = replay_stages_all ? layer_copy_s : distinct * missing / E * expert_bytes / rate;
    const double dec_s = compute.layer_ms(double(d), double(prompt) - 0.5 * double(d)) * 1e-3;
    e.replay_s += (n_layers - decoder_start) * streamed(dec_s, dec_copy_s);
  }
  return e;
}

}  // namespace fb::memory
