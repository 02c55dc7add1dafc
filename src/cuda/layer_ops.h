// Private to the CUDA executor (included by executor.cu and draft.cu only): the per-step
// device arena and CudaLayerOps, the sublayer ops shared by the backbone step (executor.cu,
// CudaStep) and the DSpark draft step (draft.cu, CudaDraftStep); the mirror of cpu::CpuLayerOps.
// Host work is bookkeeping only; all arithmetic is in the kernels of ops.h, fast_gemv.h and
// fast_small.h. Errors stick in the step's Status and skip later ops.
#pragma once

#include "cuda/executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

#include "base/check.h"
#include "model/session_layout.h"
#include "cuda/step_arena.h"
#include "cuda/fast_attention.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_small.h"
#include "cuda/tc_gemv.h"
#include "model/forward.h"
#include "model/selection.h"

namespace fb::cuda {

using model::Config;
using model::LayerRole;
using model::Row;
using model::RowKind;
using model::Site;

inline uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// ---------------------------------------------------------------------------------------------
// Sublayer ops shared by the backbone and the draft (cpu::CpuLayerOps). Activations are device
// arrays [rows, ...]; each row carries its position.
class CudaLayerOps {
 public:
  CudaLayerOps(const CudaExecutor& m, int64_t n_rows) : m_(m), c_(m.cfg_), T_(n_rows), st_(m.stream_), arena_(m.stream_, &m.ws_) {
    if (m_.profile_) prof_begin_ = event();
    if (m_.kernel_profile_) kprof_begin(st_);
    const int64_t D = c_.dim, hc = c_.hc_mult;
    X_ = alloc<uint16_t>(T_ * hc * D);
    residual_ = alloc<uint16_t>(T_ * hc * D);
    pre_ = alloc<float>(T_ * hc);
    mix_a_ = alloc<HcMix>(T_);
    mix_f_ = alloc<HcMix>(T_);
    u_ = alloc<uint16_t>(T_ * D);
    y_ = alloc<uint16_t>(T_ * D);
    h_ = alloc<uint16_t>(T_ * D);
    qr_ = alloc<uint16_t>(T_ * c_.q_lora_rank);
    q_ = alloc<uint16_t>(T_ * c_.q_dim());
    kv_ = alloc<uint16_t>(T_ * c_.head_dim);
    kv_raw_ = alloc<uint16_t>(T_ * c_.head_dim);
    kv_codes_ = alloc<uint8_t>(T_ * row_bytes());
    o_ = alloc<uint16_t>(T_ * c_.q_dim());
    // act_quant scratch: the widest GEMM input of any op, times the rows that feed it.
    int64_t k_max = std::max<int64_t>({D, c_.q_lora_rank, int64_t(c_.o_groups) * c_.o_lora_rank, c_.moe_inter_dim, c_.head_dim,
                                       int64_t(c_.engram_cat_dim()), int64_t(c_.dspark_target_layer_ids.size()) * D});
    int max_active = 1;
    for (const LayerRole& r : c_.roles) max_active = std::max(max_active, r.n_active);
    q_buf_.capacity = T_ * std::max<int64_t>(k_max, int64_t(max_active) * c_.moe_inter_dim);
    if (m_.defer_combine_ && T_ <= kFastSmallMaxRows) {  // the MoE's outputs outlive its op (defer_combine)
      ye_keep_ = alloc<uint16_t>(T_ * max_active * D);
      ys_keep_ = alloc<uint16_t>(T_ * D);
    }
    q_buf_.codes = alloc<uint8_t>(q_buf_.capacity);
    q_buf_.scales = alloc<float>(q_buf_.capacity / 32 + 1);
    uq_.capacity = T_ * D;
    uq_.codes = alloc<uint8_t>(uq_.capacity);
    uq_.scales = alloc<float>(uq_.capacity / 32 + 1);
    qrq_.capacity = T_ * c_.q_lora_rank;
    qrq_.codes = alloc<uint8_t>(qrq_.capacity);
    qrq_.scales = alloc<float>(qrq_.capacity / 32 + 1);
  }

  Status status() const { return status_; }
  virtual ~CudaLayerOps() {
    for (auto& e : prof_) {
      cudaEventDestroy(e.a);
      cudaEventDestroy(e.b);
    }
    if (prof_begin_) cudaEventDestroy(prof_begin_);
  }

  // Temporaries of one op: the op's device allocations are reused by the next op (a prefill
  // chunk of many rows would otherwise hold every layer's temporaries at once). Results that
  // outlive the op (members, selections, the candidate pool) are allocated before the frame.
  struct Frame {
    CudaLayerOps* o;
    Arena::Mark m;
    explicit Frame(CudaLayerOps* ops) : o(ops), m(ops->arena_.mark()) {}
    ~Frame() { o->arena_.release(m); }
  };
  // Profiling scope: events around one op on the stream (no-op unless the executor profiles).
  struct ProfScope {
    CudaLayerOps* o;
    size_t i;
    ProfScope(CudaLayerOps* ops, const char* name) : o(ops), i(ops->prof_open(name)) {}
    ~ProfScope() { o->prof_close(i); }
  };
  // An op with temporaries: its profiling scope around its frame (the frame is released first).
  struct OpScope {
    ProfScope prof;
    Frame frame;
    OpScope(CudaLayerOps* ops, const char* name) : prof(ops, name), frame(ops) {}
  };
  // Nothing for an op to do: an earlier op failed, or every row left (bounded replay).
  bool no_rows() const { return !ok() || T_ == 0; }
  // Whether layer l's FFN-site hc_post may wait for layer l + 1's attention site (defer_hc_post):
  // nothing between them reads or writes X, pre_ or y_. A draft step never defers it.
  virtual bool defer_ffn_post_ok(int /*l*/) const { return false; }
  // Runs a pending hc_post now (before anything else reads X or pre_).
  void flush_post() {
    if (!post_pending_) return;
    post_pending_ = false;
    if (post_.ye) step(moe_combine(post_.ye, post_.K, post_.ys, T_, c_.dim, y_, st_));  // (post_.y is y_)
    step(fast_hc_post(post_.y, post_.X, T_, c_.hc_mult, c_.dim, post_.mix, post_.pre_out, st_));
  }
  // y_ = the MoE combine left by moe(l) (defer_combine) when the FFN site's hc_post runs now.
  void flush_combine() {
    if (!combine_pending_) return;
    combine_pending_ = false;
    step(moe_combine(combine_.ye, combine_.K, combine_.ys, T_, c_.dim, y_, st_));
  }
  // After the stream was synchronised: op times into the executor's profile; a backbone step's
  // also into the executor's op times by family (Executor::stats).
  size_t prof_open(const char* name) {
    kprof_set_op(name);
    if (!m_.profile_) return ~size_t(0);
    prof_.push_back({name, event(), nullptr});
    return prof_.size() - 1;
  }
  void prof_close(size_t i) {
    kprof_set_op("-");
    if (i != ~size_t(0)) prof_[i].b = event();
  }
  void flush_profile(bool backbone = false) {
    if (kprof_on())
      kprof_end(
          [](void* ctx, const std::string& name, double ms) {
            OpProfile& p = (*static_cast<std::map<std::string, OpProfile>*>(ctx))["k:" + name];
            p.ms += ms;
            ++p.calls;
          },
          &m_.prof_);
    if (!m_.profile_ || !prof_begin_) return;
    cudaEvent_t last = prof_begin_;
    for (auto& e : prof_) {
      float ms = 0;
      if (e.a && e.b && cudaEventElapsedTime(&ms, e.a, e.b) == cudaSuccess) {
        OpProfile& p = m_.prof_[e.name];
        p.ms += ms;
        ++p.calls;
        if (backbone) m_.op_times_.add(e.name, ms * 1e-3);
      }
      if (e.b) last = e.b;
    }
    if (backbone) ++m_.op_times_.steps;
    float total = 0;
    if (last != prof_begin_ && cudaEventElapsedTime(&total, prof_begin_, last) == cudaSuccess) {
      OpProfile& p = m_.prof_["step.gpu"];
      p.ms += total;
      ++p.calls;
    }
  }

  void hc_mixes(int l, Site site) {
    ProfScope prof_scope_(this, "hc_mixes");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const bool a = site == Site::kAttn;
    if (fast_small()) {
      // [fast] the whole site in one launch: mixes, and u = RMSNorm(collapse(X, carried pre)) with
      // its codes (hc_collapse_norm then has nothing left to do); X stays as it is, so hc_expand
      // updates it in place and no residual copy is made.
      auto [pre, stride] = collapse_pre(site);
      // a pending hc_post (defer_hc_post) runs inside this site's partial kernel; the FFN site's
      // carried pre is then read from its mix (the kernel writes pre_ as it goes)
      if (post_pending_ && post_.pre_out == pre) std::tie(pre, stride) = mix_pre(post_.mix);
      step(fast_hc_site(X_, T_, c_.hc_mult, c_.dim, a ? w.hc_attn_fn : w.hc_ffn_fn, c_.norm_eps, a ? w.hc_attn_scale : w.hc_ffn_scale,
                        a ? w.hc_attn_base : w.hc_ffn_base, c_.hc_sinkhorn_iters, c_.hc_eps, pre, stride, a ? w.attn_norm : w.ffn_norm,
                        hc_scratch(), a ? mix_a_ : mix_f_, u_, uq_, st_, false, post_pending_ ? &post_ : nullptr));
      post_pending_ = false;
      fused_site_[a ? 0 : 1] = true;
      return;
    }
    flush_post();
    fused_site_[a ? 0 : 1] = false;
    if (tc_ && T_ >= kTcMinGemmRows && m_.tc_hc_mixes_)  // prefill rows: the mix dots on tensor cores (tc_gemm.h)
      step(tc_hc_mixes(*tc_, X_, T_, c_.hc_mult, c_.dim, a ? w.hc_attn_fn : w.hc_ffn_fn, c_.norm_eps, a ? w.hc_attn_scale : w.hc_ffn_scale,
                       a ? w.hc_attn_base : w.hc_ffn_base, c_.hc_sinkhorn_iters, c_.hc_eps, a ? mix_a_ : mix_f_, st_));
    else
      step(cuda::hc_mixes(X_, T_, c_.hc_mult, c_.dim, a ? w.hc_attn_fn : w.hc_ffn_fn, c_.norm_eps, a ? w.hc_attn_scale : w.hc_ffn_scale,
                          a ? w.hc_attn_base : w.hc_ffn_base, c_.hc_sinkhorn_iters, c_.hc_eps, a ? mix_a_ : mix_f_, st_));
    if (a) copy_d2d(residual_, X_, T_ * c_.hc_mult * c_.dim * 2);  // R of spec/11 §3
  }

  // u = RMSNorm(hc_pre(X, pre), norm): the attention site collapses with the carried pre, the
  // FFN site with the attention site's pre.
  void hc_collapse_norm(int l, Site site) {
    ProfScope prof_scope_(this, "hc_collapse_norm");
    if (no_rows()) return;
    if (fused_site_[site == Site::kAttn ? 0 : 1]) return;  // done by hc_mixes' fused site kernel
    flush_post();
    const DevLayer& w = m_.layers_[size_t(l)];
    const int hc = c_.hc_mult;
    if (site == Site::kFfn) copy_d2d(residual_, X_, T_ * hc * c_.dim * 2);
    const auto [pre, stride] = collapse_pre(site);
    // u = rms_norm(hc_pre(X, pre)) and act_quant(u) once (every FP8/FP4 GEMM of the sublayer
    // reads these codes: the bits each separate act_quant gave), fused for up to 256 rows.
    step(hc_pre_norm_quant(X_, T_, hc, c_.dim, pre, stride, site == Site::kAttn ? w.attn_norm : w.ffn_norm, c_.norm_eps, h_, u_, uq_, st_));
  }

  // The collapse weights of a site: the attention site's are the carried pre, the FFN site's the
  // attention site's mix pre (single-pass mHC); pointer and row stride in floats.
  std::pair<const float*, int64_t> collapse_pre(Site site) const {
    if (site == Site::kAttn) return {pre_, c_.hc_mult};
    return mix_pre(mix_a_);
  }
  static std::pair<const float*, int64_t> mix_pre(const HcMix* mix) {
    return {reinterpret_cast<const float*>(reinterpret_cast<const char*>(mix) + offsetof(HcMix, pre)), int64_t(sizeof(HcMix) / sizeof(float))};
  }
  // [fast] attention of this step on fast_attention.h's kernels (attend()), and with the q / o RoPE
  // folded into them (CudaRunOptions::attn_fuse_rope; the same bits as the rope launches).
  bool fast_attend() const { return m_.fast_attn_ && !tc_ && fast_attention_ok(T_, int(c_.head_dim)); }
  bool rope_in_attention() const { return m_.attn_fuse_rope_ && fast_attend() && c_.rope_head_dim > 0; }
  // [fast] this step's small ops on the fused kernels of fast_small.h: fast class, at most 64 rows,
  // not a tensor-core prefill step, a shape the kernels take.
  bool fast_small() const {
    return m_.fast_small_ && !tc_ && T_ <= kFastSmallMaxRows && fast_hc_site_ok(c_.hc_mult, c_.dim, T_) && c_.q_lora_rank <= 8192;
  }
  // [fast] decode rows may put independent work on the side stream (CudaRunOptions::overlap); not
  // under the per-kernel profiler (it times one stream) nor in a tensor-core prefill step.
  bool side_ok() const { return m_.overlap_ && m_.fast_gemv_ && !tc_ && T_ <= kFastGemvMaxRows && !m_.kernel_profile_; }
  FastHcScratch hc_scratch() {
    if (!m_.fast_hc_scratch_.get()) {
      const size_t bytes = FastHcScratch::bytes(c_.dim);
      Status s = m_.fast_hc_scratch_.alloc(bytes);
      if (s.ok()) s = cuda_status(cudaMemsetAsync(m_.fast_hc_scratch_.get(), 0, bytes, st_), "fast scratch");
      step(s);
    }
    return FastHcScratch::at(m_.fast_hc_scratch_.get(), c_.dim);
  }

  void attn_q(int l) {
    OpScope op_scope_(this, "attn_q");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const DevRope& rp = m_.rope_for(l);
    uint16_t* a = alloc<uint16_t>(T_ * c_.q_lora_rank);
    // wkv reads the same codes: one launch for both where the fast GEMVs run (attn_kv uses kv_raw_)
    kv_raw_ready_ = gemm_q2(uq_, T_, w.wq_a, a, w.wkv, kv_raw_);
    if (kv_raw_ready_ && side_ok()) {  // the window KV's chain beside the query path; attn_kv joins
      step(cuda_status(cudaEventRecord(m_.fork_, st_), "kv fork"));
      step(cuda_status(cudaStreamWaitEvent(m_.side_, m_.fork_, 0), "kv fork"));
      kv_finish(l, m_.side_);
      step(cuda_status(cudaEventRecord(m_.join_, m_.side_), "kv join"));
      kv_on_side_ = true;
    }
    if (fast_small()) {
      step(fast_norm_quant(a, T_, c_.q_lora_rank, w.q_norm, c_.norm_eps, qr_, qrq_, st_));
    } else {
      step(rms_norm(a, T_, c_.q_lora_rank, w.q_norm, c_.norm_eps, qr_, st_));
      step(act_quant(qr_, T_, c_.q_lora_rank, qrq_, st_));  // also read by the indexer's wq_b
    }
    gemm_q(qrq_, T_, w.wq_b, q_);
    // [fast] the fast attention kernels rotate q as they load it (and un-rotate o): no launch here
    rope_in_attn_ = rope_in_attention();
    if (!rope_in_attn_)
      step(rope(q_, T_, c_.n_heads, c_.head_dim, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
  }

  // Window latent: kv_norm(wkv u), RoPE at the row's position, FP8 QDQ (compact codes kept).
  void attn_kv(int l) {
    OpScope op_scope_(this, "attn_kv");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    if (kv_on_side_) {  // attn_q ran the chain on the side stream
      kv_on_side_ = kv_raw_ready_ = false;
      step(cuda_status(cudaStreamWaitEvent(st_, m_.join_, 0), "kv join"));
      return;
    }
    if (!kv_raw_ready_) gemm_q(uq_, T_, w.wkv, kv_raw_);
    kv_raw_ready_ = false;
    kv_finish(l, st_);
  }
  void kv_finish(int l, cudaStream_t st) {
    const DevLayer& w = m_.layers_[size_t(l)];
    const DevRope& rp = m_.rope_for(l);
    const int64_t hd = c_.head_dim;
    step(rms_norm(kv_raw_, T_, hd, w.kv_norm, c_.norm_eps, kv_, st));
    step(rope(kv_, T_, 1, hd, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), false, st));
    step(fp8_qdq(kv_, T_, hd, kv_codes_, row_bytes(), kv_, st));
  }

  // o -> inverse RoPE -> grouped wo_a (BF16, no act_quant) -> wo_b (FP8).
  void attn_output(int l) {
    OpScope op_scope_(this, "attn_output");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const DevRope& rp = m_.rope_for(l);
    const int64_t QD = c_.q_dim(), G = c_.o_groups, OR = c_.o_lora_rank, GI = c_.o_group_in();
    if (!o_unroped_) step(rope(o_, T_, c_.n_heads, c_.head_dim, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), true, st_));
    o_unroped_ = false;
    uint16_t* z = alloc<uint16_t>(T_ * G * OR);
    if (!ok()) return;
    if (m_.wo_a_fp8_ && w.wo_a8.w && m_.fast_gemv_ && !tc_ && T_ <= kFastGemvMaxRows) step(tc_fp8_bf16x_gemv(o_, T_, QD, OR, GI, w.wo_a8, z, st_));
    else gemm_bf(o_, T_, GI, QD, w.wo_a, OR, z, G * OR, GemmOut::kBf16, G, GI, OR * GI, OR);
    gemm_x(z, T_, w.wo_b, y_);
  }

  void hc_expand(int l, Site site) {
    ProfScope prof_scope_(this, "hc_expand");
    if (no_rows()) return;
    bool& fused = fused_site_[site == Site::kAttn ? 0 : 1];
    if (fused) {  // X is still the site's input: update in place
      fused = false;  // (a bounded-replay collapse before the next hc_mixes runs unfused)
      flush_post();
      post_ = FastHcPost{y_, site == Site::kAttn ? mix_a_ : mix_f_, X_, site == Site::kFfn ? pre_ : nullptr};
      if (site == Site::kFfn && combine_pending_) {  // y_ is computed inside the post (defer_combine)
        combine_pending_ = false;
        post_.ye = combine_.ye, post_.K = combine_.K, post_.ys = combine_.ys;
      }
      post_pending_ = true;
      // CudaRunOptions::defer_hc_post: left for the next site's partial kernel. The attention
      // site's next op is always the FFN site's hc_mixes; the FFN site's only when the step says
      // nothing reads X, pre_ or y_ before the next layer's attention site (defer_ffn_post_ok).
      if (!m_.defer_hc_post_ || (site == Site::kFfn && !defer_ffn_post_ok(l))) flush_post();
      return;
    }
    flush_combine();
    step(hc_post(y_, residual_, T_, c_.hc_mult, c_.dim, site == Site::kAttn ? mix_a_ : mix_f_, X_, st_));
    if (site == Site::kFfn) step(hc_take_pre(mix_f_, T_, c_.hc_mult, pre_, st_));
  }

  // MoE (spec/11 §5): route, routed experts (weight before the down projection), shared expert,
  // f32 fold of the bf16 expert outputs in ascending expert id, shared last, one rounding.
  void moe(int l) {
    OpScope op_scope_(this, "moe");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t D = c_.dim, I = c_.moe_inter_dim, K = r.n_active, n = T_ * K;
    int32_t* experts = alloc<int32_t>(n);
    float* weights = alloc<float>(n);
    // a / b: [n, I] for the GEMV paths; the tensor-core path groups its rows in buffers of its
    // own and uses them only for the shared expert's T rows (saves 4 n I bytes in large chunks).
    const int64_t ab_rows = tc_ ? T_ : n;
    uint16_t* a = alloc<uint16_t>(ab_rows * I);
    uint16_t* b = alloc<uint16_t>(ab_rows * I);
    // CudaRunOptions::defer_combine: the combine is left to the FFN site's deferred hc_post (which
    // then reads ye and ys in the next layer: step-lifetime buffers)
    const bool defer_combine = ye_keep_ && fast_small() && m_.defer_hc_post_ && defer_ffn_post_ok(l);
    uint16_t* ye = defer_combine ? ye_keep_ : alloc<uint16_t>(n * D);
    uint16_t* ys = defer_combine ? ys_keep_ : alloc<uint16_t>(T_ * D);
    if (!ok()) return;
    float* route_scratch = alloc<float>(2 * T_ * r.n_experts);
    if (!ok()) return;
    route_biased_ = route_scratch + T_ * r.n_experts;  // [T, E] biased scores (the layer gate's margins)
    // [fast] decode rows on resident experts: the shared expert on the side stream, forked before
    // the router and joined before the combine, with its own temporaries (the routed chain reuses
    // a, b and q_buf_). Not under the per-kernel profiler (it times one stream).
    const bool overlap = side_ok() && !m_.tiered(l);
    if (overlap) {
      uint16_t* sa = alloc<uint16_t>(T_ * I);
      uint16_t* sb = alloc<uint16_t>(T_ * I);
      QuantBuf sq;
      sq.capacity = T_ * I;
      sq.codes = alloc<uint8_t>(sq.capacity);
      sq.scales = alloc<float>(sq.capacity / 32 + 1);
      if (!ok()) return;
      const cudaStream_t side = m_.side_;
      step(cuda_status(cudaEventRecord(m_.fork_, st_), "moe fork"));
      step(cuda_status(cudaStreamWaitEvent(side, m_.fork_, 0), "moe fork"));
      step(fast_fp8_gemv2_q(uq_, T_, w.sh_w1, sa, w.sh_w3, sb, side));
      if (fast_small()) step(fast_swiglu_quant(sa, sb, T_, I, c_.swiglu_limit, nullptr, sq, side));
      else step(swiglu_quant(sa, sb, T_, I, c_.swiglu_limit, nullptr, sq, side));
      step(fast_fp8_gemv_q(sq, T_, w.sh_w2, ys, side));
      step(cuda_status(cudaEventRecord(m_.join_, side), "moe join"));
    }
    // prefill rows: the router's dots as one tensor-core matmul into the biased scores' half of the scratch ([reference-defining])
    if (tc_ && T_ >= kTcMinGemmRows && m_.tc_route_ && tc_gemm_shape_ok(u_, D, D, 0, w.gate_w, 0, route_biased_, r.n_experts, 0, GemmOut::kF32)) {
      step(tc_->matmul(u_, T_, D, D, w.gate_w, r.n_experts, route_scratch + T_ * r.n_experts, r.n_experts, GemmOut::kF32, 1, 0, 0, 0, st_));
      step(route_from_dots(T_, r.n_experts, w.gate_bias, w.gate_bias_vl, image_, int(K), c_.gate_temp, c_.norm_topk_prob, c_.route_scale, experts,
                           weights, route_scratch, st_));
    } else
      step(route(u_, T_, D, w.gate_w, r.n_experts, w.gate_bias, w.gate_bias_vl, image_, int(K), c_.gate_temp, c_.norm_topk_prob, c_.route_scale,
                 experts, weights, route_scratch, st_));
    bool shared_done = overlap;
    auto shared = [&] {  // independent of the routed experts: issued while their copies run
      if (shared_done) return;
      shared_done = true;
      gemm_q2(uq_, T_, w.sh_w1, a, w.sh_w3, b);  // one stream: a, b and q_buf_ are reused in issue order
      if (fast_small()) step(fast_swiglu_quant(a, b, T_, I, c_.swiglu_limit, nullptr, q_buf_, st_));
      else step(swiglu_quant(a, b, T_, I, c_.swiglu_limit, nullptr, q_buf_, st_));
      gemm_q(q_buf_, T_, w.sh_w2, ys);
    };
    if (m_.tiered(l)) {
      if (m_.ws_.capturing) {
        step(FB_ERROR(kUnsupported) << "a step with tiered experts cannot be captured into a CUDA graph (it waits for the routing)");
        return;
      }
      // Before the routing sync: the next tiered layer's copies start once its staging buffer's
      // last readers (two tiered layers back) are done, and run beside this layer's work.
      if (prefetch_)
        for (int l2 = l + 1; l2 < c_.n_layers; ++l2)
          if (m_.tiered(l2)) {
            step(m_.slots_->prefetch(l2, l));
            break;
          }
      // CudaRunOptions::expert_predict: the next tiered layer's gate on this layer's expert input,
      // downloaded with the routing; its experts are copied ahead once this layer's are issued.
      const int l2 = predict_layer(l);
      std::vector<int32_t> ids, pred;
      if (l2 >= 0) {
        const LayerRole& r2 = c_.roles[size_t(l2)];
        const DevLayer& w2 = m_.layers_[size_t(l2)];
        int32_t* pred_d = alloc<int32_t>(T_ * r2.n_active);
        float* pred_w = alloc<float>(T_ * r2.n_active);
        float* pred_scratch = alloc<float>(2 * T_ * r2.n_experts);
        if (!ok()) return;
        step(route(u_, T_, D, w2.gate_w, r2.n_experts, w2.gate_bias, w2.gate_bias_vl, image_, r2.n_active, c_.gate_temp, c_.norm_topk_prob,
                   c_.route_scale, pred_d, pred_w, pred_scratch, st_));
        ids.resize(size_t(n));
        pred.resize(size_t(T_ * r2.n_active));
        download_parts_synced({DownPart{ids.data(), experts, ids.size() * sizeof(int32_t)}, DownPart{pred.data(), pred_d, pred.size() * sizeof(int32_t)}});
      } else {
        download_synced(ids, experts, n);
      }
      if (!ok()) return;
      if (m_.route_override_) m_.route_override_(l, ids, T_, int(K));
      if (l2 >= 0 && m_.predict_override_) m_.predict_override_(l2, pred, T_, c_.roles[size_t(l2)].n_active);
      for (int32_t e : ids)
        if (e < 0 || e >= r.n_experts) {
          step(FB_ERROR(kInternal) << "routing picked expert " << e << " of " << r.n_experts);
          return;
        }
      auto ahead = [&] {  // after this layer's copies and GEMV launches, before any host work
        if (l2 >= 0 && ok()) step(m_.slots_->predict(l2, by_votes(pred), m_.run_.expert_predict_max));
      };
      if (tc_) routed_experts_tc(l, w, r.n_experts, K, ids, weights, ye, shared);
      else routed_experts_tiered(l, w, K, ids, weights, a, b, ye, shared, ahead);
    } else if (tc_) {
      std::vector<int32_t> ids;
      download_synced(ids, experts, n);
      if (!ok()) return;
      routed_experts_tc(l, w, r.n_experts, K, ids, weights, ye, shared);
    } else {
      routed_experts(w, K, experts, weights, a, b, ye, r.n_experts);
    }
    shared();
    if (overlap) step(cuda_status(cudaStreamWaitEvent(st_, m_.join_, 0), "moe join"));
    if (defer_combine) {
      combine_ = FastHcPost{nullptr, nullptr, nullptr, nullptr, ye, int(K), ys};
      combine_pending_ = true;
      return;
    }
    step(moe_combine(ye, int(K), ys, T_, D, y_, st_));
  }

  // Routed experts on the GEMV kernels (exact or fast_gemv.h), ids indexing w's arrays (n_ids
  // entries: experts, or a tiered layer's slots); ids < 0 are skipped (rows of another wave).
  void routed_experts(const DevLayer& w, int64_t K, const int32_t* ids, const float* weights, uint16_t* a, uint16_t* b, uint16_t* ye,
                      int n_ids);
  // Rows r0.. of an act_quant buffer of K-wide rows.
  static QuantBuf rows_of(const QuantBuf& q, int64_t r0, int64_t K) {
    QuantBuf o = q;
    o.codes += r0 * K;
    o.scales += r0 * K / 32;
    o.capacity -= r0 * K;
    return o;
  }

  // Distinct experts of `ids`, ascending.
  static std::vector<int32_t> distinct(const std::vector<int32_t>& ids) {
    std::vector<int32_t> v(ids);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  }
  // The distinct experts of `ids`, the most often picked first (ties: ascending id): which guesses
  // expert_predict_max keeps when a step's rows guess more experts than that.
  static std::vector<int32_t> by_votes(const std::vector<int32_t>& ids) {
    std::vector<int32_t> v = distinct(ids);
    std::vector<int> votes(v.size(), 0);
    for (int32_t e : ids) ++votes[size_t(std::lower_bound(v.begin(), v.end(), e) - v.begin())];
    std::vector<size_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return votes[a] > votes[b]; });
    std::vector<int32_t> out;
    for (size_t i : order) out.push_back(v[i]);
    return out;
  }

  // Routed experts of a tiered layer on the GEMV kernels: waves of at most the layer's slots
  // (one wave unless the step routes to more experts than that); each wave's rows see their
  // expert's slot, the others -1 (skipped). Per row the arithmetic is the resident path's.
  // The host's copies of a tiered MoE call's expert inputs [T, D] and routing weights [T * K]
  // (CudaRunOptions::host_compute), downloaded once the host has chosen misses to compute (a
  // wait of the idle stream; downloading them with every call's ids cost ~0.5 ms a token at 100%
  // hits on the H200).
  struct HostRows {
    std::vector<uint16_t> u;
    std::vector<float> weights;
  };
  HostRows download_host_rows(const float* weights, int64_t n);
  bool host_compute_on() const { return m_.run_.host_compute > 0 && m_.host_experts_ && !tc_ && !m_.ws_.capturing; }
  // The misses chosen for the host (DevExpertSlots::take_host; every miss in mode 2) out of `want`.
  std::vector<int32_t> take_host(int l, const std::vector<int32_t>& ids, std::vector<int32_t>& want);
  // The host's experts, once the GPU's share of the call is issued (they run beside it): every
  // (row, expert) pair of `host_want` on the host's threads, the outputs into their rows of ye.
  // host_jobs takes the experts' views (ExpertSource::expert, in this layer's epoch of a tiered
  // source: before any call for the next layer), run_host_jobs computes them and uploads.
  struct HostJobs {
    std::vector<size_t> pairs;  // indices into ids
    std::vector<uint16_t> out;  // [pairs, D]
    std::vector<model::HostExpertJob> jobs;
    size_t experts = 0;
  };
  HostJobs host_jobs(int l, int64_t K, const std::vector<int32_t>& ids, const HostRows& h, const std::vector<int32_t>& host_want);
  void run_host_jobs(HostJobs& hj, uint16_t* ye);

  // `ahead()` runs once the waves' copies and launches are issued, before the host's experts.
  template <typename F, typename G>
  void routed_experts_tiered(int l, const DevLayer& w, int64_t K, const std::vector<int32_t>& ids, const float* weights, uint16_t* a, uint16_t* b,
                             uint16_t* ye, F& shared, G& ahead);
  // CudaRunOptions::expert_predict: the tiered backbone layer after l whose experts layer l's call
  // predicts, or -1 (off, prefill-sized or tensor-core steps, graph capture, the last tiered layer).
  int predict_layer(int l) const {
    if (!m_.run_.expert_predict || tc_ || T_ > 64 || m_.ws_.capturing || l >= c_.n_layers) return -1;
    for (int l2 = l + 1; l2 < c_.n_layers; ++l2)
      if (m_.tiered(l2)) return l2;
    return -1;
  }

  // Prefetch (prefetch_): the staging buffer holding layer l's experts, or null.
  const DevExpertSlots::Staged* staged_for(int l) const { return prefetch_ && m_.tiered(l) ? m_.slots_->staged(l) : nullptr; }
  // Moves the experts of `want` that layer l's staging buffer holds out of it (ascending, as
  // `want` is) and returns them; none without a staged prefetch.
  std::vector<int32_t> take_staged(int l, std::vector<int32_t>& want) const {
    std::vector<int32_t> staged;
    const DevExpertSlots::Staged* g = staged_for(l);
    if (!g) return staged;
    std::vector<int32_t> rest;
    for (int32_t e : want) (g->entry_of[size_t(e)] >= 0 ? staged : rest).push_back(e);
    want.swap(rest);
    return staged;
  }
  // The layer's weights with its routed experts' arrays replaced by the staging buffer's.
  static DevLayer staging_layer(const DevLayer& w, const DevExpertSlots::Staged& g) {
    DevLayer v = w;
    v.w1 = g.w1;
    v.w2 = g.w2;
    v.w3 = g.w3;
    return v;
  }

 protected:
  struct ProfEvent {
    const char* name;
    cudaEvent_t a, b;
  };
  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    cudaEventRecord(e, st_);
    return e;
  }
  bool ok() const { return status_.ok(); }
  void step(Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  template <typename T>
  T* alloc(int64_t n) {
    return arena_.alloc<T>(n, status_);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    return arena_.upload<T>(v, status_);
  }
  // Several host vectors staged together and sent in ONE copy (each upload is its own copy on
  // the stream, a few microseconds of host and GPU time on the decode step's critical path); the
  // device pointer of each, 16-byte aligned, in argument order (all nullptr on failure).
  template <typename... Ts>
  std::tuple<Ts*...> upload_all(const std::vector<Ts>&... vs) {
    constexpr size_t kAlign = 16;
    std::array<size_t, sizeof...(Ts)> off{};
    size_t total = 0, i = 0;
    ((off[i++] = total, total += (vs.size() * sizeof(Ts) + kAlign - 1) / kAlign * kAlign), ...);
    std::vector<uint8_t> pack(std::max<size_t>(total, 1));
    i = 0;
    ((vs.empty() ? void() : void(std::memcpy(pack.data() + off[i], vs.data(), vs.size() * sizeof(Ts))), ++i), ...);
    uint8_t* base = upload(pack);
    return pointers_at<Ts...>(base, off, std::index_sequence_for<Ts...>{});
  }
  template <typename... Ts, size_t... I>
  static std::tuple<Ts*...> pointers_at(uint8_t* base, const std::array<size_t, sizeof...(Ts)>& off, std::index_sequence<I...>) {
    return std::tuple<Ts*...>{(base ? reinterpret_cast<Ts*>(base + off[I]) : nullptr)...};
  }
  void copy_d2d(void* dst, const void* src, int64_t bytes) {
    if (ok()) step(cuda_status(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, st_), "copy"));
    kprof_mark("memcpy_d2d");
  }
  template <typename T>
  void download(std::vector<T>& out, const T* src, int64_t n) {
    if (m_.ws_.capturing) return;
    out.resize(size_t(n));
    if (ok() && n > 0) step(cuda_status(cudaMemcpyAsync(out.data(), src, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost, st_), "download"));
  }
  // download(out, src, n), then sync(): the host waits for `out` now. With pinned_ids the copy
  // lands in page-locked memory first (an asynchronous copy instead of the driver's staged path for
  // pageable memory), then into `out`. On as in the configuration session 24's cold-prefill A/B of
  // sm_uploads measured; its own A/B ran while the bench's pageable scale copies held the issuing
  // thread (the 38 ms gap before this download was that, not the download), so its separate
  // effect is not known yet.
  template <typename T>
  void download_synced(std::vector<T>& out, const T* src, int64_t n) {
    if (m_.ws_.capturing) return;
    out.resize(size_t(std::max<int64_t>(n, 0)));
    download_parts_synced({DownPart{out.data(), src, out.size() * sizeof(T)}});
  }
  // Several device ranges into host memory behind one wait (each part 16-byte aligned in `down`).
  struct DownPart {
    void* out;
    const void* src;
    size_t bytes;
  };
  void download_parts_synced(const std::vector<DownPart>& parts) {
    StepWorkspace& ws = m_.ws_;
    if (ws.capturing) return;
    size_t total = 0;
    for (const DownPart& p : parts) total += (p.bytes + 15) / 16 * 16;
    if (ok() && ws.pinned_ids && total > ws.down_cap) {  // grown once to the largest (the stream's earlier copies into it are done: each call syncs)
      if (ws.down) cudaFreeHost(ws.down);
      ws.down = nullptr;
      ws.down_cap = 0;
      const size_t want = std::max<size_t>(total + total / 4, size_t(64) << 10);
      if (cudaMallocHost(&ws.down, want) == cudaSuccess) ws.down_cap = want;
      else ws.down = nullptr, cudaGetLastError();
    }
    const bool pinned = ws.pinned_ids && ws.down && total > 0;
    size_t off = 0;
    for (const DownPart& p : parts) {
      if (ok() && p.bytes > 0)
        step(cuda_status(cudaMemcpyAsync(pinned ? static_cast<uint8_t*>(ws.down) + off : p.out, p.src, p.bytes, cudaMemcpyDeviceToHost, st_),
                         "download"));
      off += (p.bytes + 15) / 16 * 16;
    }
    sync();
    if (!pinned || !ok()) return;
    off = 0;
    for (const DownPart& p : parts) {
      if (p.bytes > 0) std::memcpy(p.out, static_cast<const uint8_t*>(ws.down) + off, p.bytes);
      off += (p.bytes + 15) / 16 * 16;
    }
  }
  void sync() {
    if (ok() && !m_.ws_.capturing) step(cuda_status(cudaStreamSynchronize(st_), "stream"));
    if (ok()) arena_.drained();  // every upload issued so far has landed
  }
  int64_t row_bytes() const { return c_.head_dim + c_.head_dim / 32; }
  // GEMMs: the exact CUDA-core kernels, or in a step of prefill rows the tensor-core path
  // (tc_gemm.h, [reference-defining]: the same products, summed in the tensor cores' order).
  static constexpr int64_t kTcMinGemmRows = 16;
  static constexpr int64_t kFastGemvMaxRows = 64;
  // [fast] decode, verify and draft steps (and short prefill steps) of up to kFastGemvMaxRows rows
  // take the fast GEMVs: per-row arithmetic independent of the other rows (row invariance).
  // Larger non-tensor-core steps keep the exact kernels (deterministic, not row-invariant with them).
  void gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y) {
    if (tc_ && M >= kTcMinGemmRows) step(tc_fp8_gemm_q(*tc_, q, M, w, y, st_));
    else if (m_.fast_gemv_ && M <= kFastGemvMaxRows) step(fast_fp8_gemv_q(q, M, w, y, st_));
    else step(fp8_gemm_q(q, M, w, y, st_));
  }
  // Two weights over the same codes: one launch on the fast GEMVs (true), else two gemm_q (false).
  bool gemm_q2(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W& wb, uint16_t* yb) {
    if (!(tc_ && M >= kTcMinGemmRows) && m_.fast_gemv_ && M <= kFastGemvMaxRows && wa.K == wb.K) {
      step(fast_fp8_gemv2_q(q, M, wa, ya, wb, yb, st_));
      return true;
    }
    gemm_q(q, M, wa, ya);
    gemm_q(q, M, wb, yb);
    return false;
  }
  void gemm_x(const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y) {
    if (tc_ && M >= kTcMinGemmRows) {
      step(tc_fp8_gemm(*tc_, x, M, w, y, q_buf_, st_));
      return;
    }
    if (fast_small() && M <= kFastGemvMaxRows && w.K % 32 == 0) step(fast_act_quant(x, M, w.K, q_buf_, st_));
    else step(act_quant(x, M, w.K, q_buf_, st_));
    gemm_q(q_buf_, M, w, y);
  }
  void gemm_bf(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
               int64_t G = 1, int64_t gx = 0, int64_t gw = 0, int64_t gy = 0) {
    // A few rows (the head's logit rows of a prefill step) stay on the exact GEMV kernel: it
    // reads the weight once either way, and the logits then match the CPU bit for bit.
    if (tc_ && M >= kTcMinGemmRows) step(tc_bf16_gemm(*tc_, x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st_));
    else if (m_.fast_gemv_ && M <= kFastGemvMaxRows) step(fast_bf16_gemv(x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st_));
    else step(bf16_gemm(x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st_));
  }
  // Routed experts of a prefill step on tensor cores: (row, slot) pairs grouped by expert on the
  // host (`ids`: the routing, downloaded once), per expert the exact bf16 values of w1/w3/w2 and
  // three matmuls, SwiGLU + act_quant exactly as the exact path, outputs scattered back to ye
  // [T*K, D]. A tiered layer runs in waves of at most its slots (each wave's rows are contiguous:
  // they are sorted by expert); SwiGLU and act_quant are per row, so waves change no bits.
  template <typename F>
  void routed_experts_tc(int l, const DevLayer& w, int E, int64_t K, const std::vector<int32_t>& ids, const float* weights, uint16_t* ye,
                         F& shared);
  // Scratch for the key-block split of attention when it applies (few rows, long key lists).
  // CudaRunOptions::attn_split = 0 turns it off, attn_predequant = 0 dequantises the key tiles inside
  // the score and P.V kernels again (A/B measurements only; every path gives the same bits).
  // Attention of this step's rows (q_ -> o_) over `keys`, whose lists hold at most max_keys
  // entries: [fast] steps of up to kFastAttnMaxRows rows on the tensor-core kernels of
  // fast_attention.h, else the exact kernels (attention.cu, the CPU's bits).
  void attend(int l, AttnKeys& keys, int max_keys, const float* sinks, float scale) {
    const int d = int(c_.head_dim);
    if (fast_attend()) {
      keys.max_keys = max_keys;
      float* scratch = alloc<float>(fast_attention_floats(T_, c_.n_heads, d, max_keys));
      if (!ok()) return;
      AttnRope rope;
      if (rope_in_attn_) {  // attn_q left q un-rotated: rotate on load, un-rotate o (attn_output skips its rope)
        const DevRope& rp = m_.rope_for(l);
        rope = AttnRope{pos_, rp.cos.get<float>(), rp.sin.get<float>(), int(c_.rope_head_dim / 2), true, true};
        rope_in_attn_ = false;
        o_unroped_ = true;
      }
      step(fast_sparse_attention(q_, T_, c_.n_heads, d, keys, sinks, scale, scratch, o_, st_, rope));
      return;
    }
    if (rope_in_attn_) {  // never: attn_q and attend decide on the same step state
      step(FB_ERROR(kInternal) << "layer " << l << ": q was left for the fast attention to rotate, but the step runs another kernel");
      return;
    }
    split_scratch(keys, max_keys);
    if (!ok()) return;
    step(sparse_attention(q_, T_, c_.n_heads, d, keys, sinks, scale, o_, st_));
  }
  void split_scratch(AttnKeys& keys, int max_keys) {
    keys.max_keys = max_keys;
    if (!m_.run_.attn_predequant) keys.predequant = false;
    if (!m_.run_.attn_split) return;
    const int64_t n = attention_split_floats(T_, c_.n_heads, int(c_.head_dim), max_keys);
    if (n > 0) keys.split = alloc<float>(n);
  }
  void set_rows(const std::vector<int64_t>& pos, const std::vector<uint8_t>& image) {
    std::tie(pos_, image_) = upload_all(pos, image);
  }
  void embed_tokens(const std::vector<uint64_t>& src) {
    if (!ok()) return;
    step(embed_rows(upload(src), T_, c_.hc_mult, c_.dim, X_, pre_, st_));
  }
  // logits (f32) = f32(RMSNorm(hc_pre(X, pre), norm_w)) . f32(head)^T for the listed rows.
  void head_rows(const std::vector<int32_t>& rows, const uint16_t* norm_w, float* logits, uint16_t* collapsed) {
    const int64_t n = int64_t(rows.size()), D = c_.dim;
    if (!ok() || n == 0) return;
    uint16_t* hrows = collapsed ? collapsed : alloc<uint16_t>(n * D);
    uint16_t* nrm = alloc<uint16_t>(n * D);
    if (!ok()) return;
    step(cuda::hc_pre(X_, n, upload(rows), c_.hc_mult, D, pre_, c_.hc_mult, hrows, st_));
    step(rms_norm(hrows, n, D, norm_w, c_.norm_eps, nrm, st_));
    gemm_bf(nrm, n, D, D, m_.head_, c_.vocab_size, logits, c_.vocab_size, GemmOut::kF32);
  }

  const CudaExecutor& m_;
  const Config& c_;
  int64_t T_;
  cudaStream_t st_;
  Status status_;
  Arena arena_;
  FastHcPost post_;              // a site's hc_post not yet run (defer_hc_post) ...
  bool post_pending_ = false;     // ... when set
  FastHcPost combine_;            // the MoE combine's inputs (ye, K, ys) not yet summed (defer_combine) ...
  bool combine_pending_ = false;  // ... when set
  uint16_t *ye_keep_ = nullptr, *ys_keep_ = nullptr;  // defer_combine: step-lifetime MoE outputs [T, max_active, D], [T, D]
  bool rope_in_attn_ = false;  // attn_q left q un-rotated for attend()'s fast kernels
  bool o_unroped_ = false;     // attend() gave o already un-rotated: attn_output skips its rope
  uint16_t *X_ = nullptr, *residual_ = nullptr, *u_ = nullptr, *y_ = nullptr, *h_ = nullptr, *qr_ = nullptr, *q_ = nullptr, *kv_ = nullptr,
           *o_ = nullptr;
  uint8_t* kv_codes_ = nullptr;  // [T, head_dim + head_dim/32] FP8 compact window rows
  float* pre_ = nullptr;
  HcMix *mix_a_ = nullptr, *mix_f_ = nullptr;
  // Per site (attention, FFN) of the current layer: hc_mixes ran the fused fast site kernel.
  bool fused_site_[2] = {false, false};
  // wkv's output [T, head_dim] before kv_norm, and whether attn_q already computed it (gemm_q2).
  uint16_t* kv_raw_ = nullptr;
  bool kv_raw_ready_ = false, kv_on_side_ = false;
  int64_t* pos_ = nullptr;
  uint8_t* image_ = nullptr;
  QuantBuf q_buf_;
  QuantBuf uq_, qrq_;  // act_quant of u (per sublayer) and of qr (attention q path and indexer)
  TcGemm* tc_ = nullptr;  // non-null: this step's GEMMs run on tensor cores (prefill rows only)
  // This step streams experts a layer ahead (CudaRunOptions::expert_prefetch; set by CudaStep
  // for large prefill steps, never by the draft): each tiered moe() issues the next tiered
  // layer's prefetch and reads its own staged experts from DevExpertSlots::staged.
  bool prefetch_ = false;
  const float* route_biased_ = nullptr;  // the last moe()'s biased router scores [T, E] (its frame: valid until the next allocation)
  std::vector<ProfEvent> prof_;
  cudaEvent_t prof_begin_ = nullptr;
  std::chrono::steady_clock::time_point t_begin_ = std::chrono::steady_clock::now();
};

}  // namespace fb::cuda

#include "cuda/layer_ops_moe.h"  // CudaLayerOps' routed-expert ops, defined out of the class
