// CudaExecutor: loading, sessions, and the step objects that run model/forward.h on the GPU.
// Class for class the mirror of cpu/executor.cpp: CudaLayerOps (sublayer ops), CudaStep
// (backbone rows of one or more sessions), CudaDraftStep (DSpark block). Host work is
// bookkeeping only (positions, ring slots, key lists, Engram hashes); all arithmetic is on the
// device in the kernels of ops.h. Errors stick in the step's Status and skip later ops.
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
#include "cpu/session_cache.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_small.h"
#include "cuda/mma_gemv.h"
#include "model/forward.h"
#include "model/selection.h"

namespace fb::cuda {

using model::Config;
using model::LayerRole;
using model::Row;
using model::RowKind;
using model::Site;

namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Per-step device allocations: bump-allocated from the executor's StepWorkspace (no cudaMalloc
// once warmed up; uploads staged through its pinned buffer), with plain cudaMalloc as the
// fallback when it is too small or already in use. The destructor synchronises the stream (the
// step is over, so the next step may reuse the memory) and grows the workspace to this step's
// high-water mark.
class Arena {
 public:
  Arena(cudaStream_t st, StepWorkspace* ws) : st_(st), ws_(ws && !ws->busy ? ws : nullptr) {
    if (ws_) ws_->busy = true;
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (!ws_) return;
    if (ws_->capturing) {  // nothing may wait inside a capture; the workspace was warmed up
      ws_->busy = false;
      return;
    }
    cudaStreamSynchronize(st_);
    ws_->dev_high = std::max(ws_->dev_high, dev_peak_);
    ws_->pin_high = std::max(ws_->pin_high, pin_need_);
    if (ws_->dev_high > ws_->dev.bytes()) {
      ws_->dev.reset();
      if (!ws_->dev.alloc(ws_->dev_high + ws_->dev_high / 4).ok()) ws_->dev.reset();
    }
    constexpr size_t kPinMax = size_t(256) << 20;
    if (ws_->pin_high > ws_->pin_cap && ws_->pin_high <= kPinMax) {
      if (ws_->pinned) cudaFreeHost(ws_->pinned);
      ws_->pinned = nullptr;
      ws_->pin_cap = 0;
      const size_t want = std::max<size_t>(ws_->pin_high + ws_->pin_high / 4, size_t(1) << 20);
      if (cudaMallocHost(&ws_->pinned, want) == cudaSuccess) ws_->pin_cap = want;
      else ws_->pinned = nullptr;
    }
    ws_->busy = false;
  }
  template <typename T>
  T* alloc(int64_t n, Status& status) {
    if (!status.ok()) return nullptr;
    const size_t bytes = round_up(size_t(std::max<int64_t>(n, 1)) * sizeof(T));
    if (ws_) {
      const size_t off = dev_need_;
      dev_need_ += bytes;
      dev_peak_ = std::max(dev_peak_, dev_need_);
      if (dev_need_ <= ws_->dev.bytes()) return reinterpret_cast<T*>(ws_->dev.get<uint8_t>() + off);
    }
    DeviceBuffer b;
    status = b.alloc(bytes);
    if (!status.ok()) return nullptr;
    T* p = b.get<T>();
    bufs_.push_back(std::move(b));
    return p;
  }
  template <typename T>
  T* upload(const std::vector<T>& v, Status& status) {
    T* p = alloc<T>(int64_t(v.size()), status);
    if (!p || v.empty()) return status.ok() ? p : nullptr;
    const size_t bytes = v.size() * sizeof(T);
    const void* src = v.data();
    if (ws_) {
      const size_t off = pin_need_;
      pin_need_ += round_up(bytes);
      if (pin_need_ <= ws_->pin_cap) {
        void* stage = static_cast<uint8_t*>(ws_->pinned) + off;
        std::memcpy(stage, v.data(), bytes);
        src = stage;
      }
    }
    status = cuda_status(cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, st_), "upload");
    kprof_mark("upload");
    return status.ok() ? p : nullptr;
  }

  // Frames: device memory allocated after mark() is reused by allocations after release(m).
  // Safe because every kernel of a step runs on one stream in issue order. Pinned staging is
  // never released (an upload's host copy may still be waiting for its transfer). Fallback
  // buffers (the workspace was too small: a first step of a new size) made inside the frame are
  // freed after the stream drains, so that step peaks at one op's temporaries too.
  struct Mark {
    size_t dev, bufs;
  };
  Mark mark() const { return {dev_need_, bufs_.size()}; }
  void release(const Mark& m) {
    dev_need_ = std::min(dev_need_, m.dev);
    if (bufs_.size() > m.bufs && !(ws_ && ws_->capturing)) {
      cudaStreamSynchronize(st_);
      bufs_.resize(m.bufs);
    }
  }

 private:
  static size_t round_up(size_t b) { return (b + 255) & ~size_t(255); }
  cudaStream_t st_;
  StepWorkspace* ws_;
  size_t dev_need_ = 0, pin_need_ = 0, dev_peak_ = 0;
  std::vector<DeviceBuffer> bufs_;
};

}  // namespace

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
  ~CudaLayerOps() {
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
  // After the stream was synchronised: op times into the executor's profile.
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
  void flush_profile() {
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
      }
      if (e.b) last = e.b;
    }
    float total = 0;
    if (last != prof_begin_ && cudaEventElapsedTime(&total, prof_begin_, last) == cudaSuccess) {
      OpProfile& p = m_.prof_["step.gpu"];
      p.ms += total;
      ++p.calls;
    }
  }

  void hc_mixes(int l, Site site) {
    ProfScope prof_scope_(this, "hc_mixes");
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const bool a = site == Site::kAttn;
    if (fast_small()) {
      // [fast] the whole site in one launch: mixes, and u = RMSNorm(collapse(X, carried pre)) with
      // its codes (hc_collapse_norm then has nothing left to do); X stays as it is, so hc_expand
      // updates it in place and no residual copy is made.
      const auto [pre, stride] = collapse_pre(site);
      step(fast_hc_site(X_, T_, c_.hc_mult, c_.dim, a ? w.hc_attn_fn : w.hc_ffn_fn, c_.norm_eps, a ? w.hc_attn_scale : w.hc_ffn_scale,
                        a ? w.hc_attn_base : w.hc_ffn_base, c_.hc_sinkhorn_iters, c_.hc_eps, pre, stride, a ? w.attn_norm : w.ffn_norm,
                        hc_scratch(), a ? mix_a_ : mix_f_, u_, uq_, st_));
      fused_site_[a ? 0 : 1] = true;
      return;
    }
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
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    if (fused_site_[site == Site::kAttn ? 0 : 1]) return;  // done by hc_mixes' fused site kernel
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
    return {reinterpret_cast<const float*>(reinterpret_cast<const char*>(mix_a_) + offsetof(HcMix, pre)), int64_t(sizeof(HcMix) / sizeof(float))};
  }
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
    ProfScope prof_scope_(this, "attn_q");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
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
    step(rope(q_, T_, c_.n_heads, c_.head_dim, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
  }

  // Window latent: kv_norm(wkv u), RoPE at the row's position, FP8 QDQ (compact codes kept).
  void attn_kv(int l) {
    ProfScope prof_scope_(this, "attn_kv");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
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
    ProfScope prof_scope_(this, "attn_output");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const DevRope& rp = m_.rope_for(l);
    const int64_t QD = c_.q_dim(), G = c_.o_groups, OR = c_.o_lora_rank, GI = c_.o_group_in();
    step(rope(o_, T_, c_.n_heads, c_.head_dim, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), true, st_));
    uint16_t* z = alloc<uint16_t>(T_ * G * OR);
    if (!ok()) return;
    gemm_bf(o_, T_, GI, QD, w.wo_a, OR, z, G * OR, GemmOut::kBf16, G, GI, OR * GI, OR);
    gemm_x(z, T_, w.wo_b, y_);
  }

  void hc_expand(int l, Site site) {
    ProfScope prof_scope_(this, "hc_expand");
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    bool& fused = fused_site_[site == Site::kAttn ? 0 : 1];
    if (fused) {  // X is still the site's input: update in place
      fused = false;  // (a bounded-replay collapse before the next hc_mixes runs unfused)
      step(fast_hc_post(y_, X_, T_, c_.hc_mult, c_.dim, site == Site::kAttn ? mix_a_ : mix_f_, site == Site::kFfn ? pre_ : nullptr, st_));
      return;
    }
    step(hc_post(y_, residual_, T_, c_.hc_mult, c_.dim, site == Site::kAttn ? mix_a_ : mix_f_, X_, st_));
    if (site == Site::kFfn) step(hc_take_pre(mix_f_, T_, c_.hc_mult, pre_, st_));
  }

  // MoE (spec/11 §5): route, routed experts (weight before the down projection), shared expert,
  // f32 fold of the bf16 expert outputs in ascending expert id, shared last, one rounding.
  void moe(int l) {
    ProfScope prof_scope_(this, "moe");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t D = c_.dim, I = c_.moe_inter_dim, K = r.n_active, n = T_ * K;
    int32_t* experts = alloc<int32_t>(n);
    float* weights = alloc<float>(n);
    uint16_t* a = alloc<uint16_t>(n * I);
    uint16_t* b = alloc<uint16_t>(n * I);
    uint16_t* ye = alloc<uint16_t>(n * D);
    uint16_t* ys = alloc<uint16_t>(T_ * D);
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
      std::vector<int32_t> ids;
      download(ids, experts, n);
      sync();
      if (!ok()) return;
      if (m_.route_override_) m_.route_override_(l, ids, T_, int(K));
      for (int32_t e : ids)
        if (e < 0 || e >= r.n_experts) {
          step(FB_ERROR(kInternal) << "routing picked expert " << e << " of " << r.n_experts);
          return;
        }
      if (tc_) routed_experts_tc(l, w, r.n_experts, K, ids, weights, ye, shared);
      else routed_experts_tiered(l, w, K, ids, weights, a, b, ye, shared);
    } else if (tc_) {
      std::vector<int32_t> ids;
      download(ids, experts, n);
      sync();
      if (!ok()) return;
      routed_experts_tc(l, w, r.n_experts, K, ids, weights, ye, shared);
    } else {
      routed_experts(w, K, experts, weights, a, b, ye, r.n_experts);
    }
    shared();
    if (overlap) step(cuda_status(cudaStreamWaitEvent(st_, m_.join_, 0), "moe join"));
    step(moe_combine(ye, int(K), ys, T_, D, y_, st_));
  }

  // Routed experts on the GEMV kernels (exact, fast_gemv.h or mma_gemv.h), ids indexing w's arrays (n_ids
  // entries: experts, or a tiered layer's slots); ids < 0 are skipped (rows of another wave).
  void routed_experts(const DevLayer& w, int64_t K, const int32_t* ids, const float* weights, uint16_t* a, uint16_t* b, uint16_t* ye,
                      int n_ids) {
    const int64_t D = c_.dim, I = c_.moe_inter_dim, n = T_ * K;
    if (m_.mma_gemv_ && mma_gemv_ok(D, uq_.codes, w.w1.w, w.w1.w_stride, true) && mma_gemv_ok(I, q_buf_.codes, w.w2.w, w.w2.w_stride, true)) {
      // Rows grouped by expert on the device (rows sharing an expert widen its weights once).
      int32_t* gs = alloc<int32_t>(mma_group_ints(n));
      if (!ok()) return;
      const MmaGroups groups = mma_groups_at(gs, n);
      const int64_t slots = std::min<int64_t>(n, n_ids);
      step(mma_group_rows(ids, n, n_ids, groups, st_));
      step(mma_fp4_gemm_q(uq_, n, K, w.w1, groups, slots, a, st_));
      step(mma_fp4_gemm_q(uq_, n, K, w.w3, groups, slots, b, st_));
      step(swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));  // routing weight before w2
      step(mma_fp4_gemm_q(q_buf_, n, 1, w.w2, groups, slots, ye, st_));
    } else if (m_.fast_gemv_) {
      // [fast] every (row, expert) pair on its own warps: row-invariant for any n. The kernels
      // take at most kFastGemvMaxRows rows a call; chunks keep whole activation rows (multiples of K).
      const int64_t step_rows = std::max<int64_t>(K, kFastGemvMaxRows / K * K);
      for (int64_t m0 = 0; m0 < n && ok(); m0 += step_rows) {
        const int64_t m = std::min(step_rows, n - m0);
        step(fast_fp4_gemv2_q(rows_of(uq_, m0 / K, D), m, K, w.w1, w.w3, ids + m0, a + m0 * I, b + m0 * I, st_));
      }
      if (fast_small()) step(fast_swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));  // routing weight before w2
      else step(swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));
      for (int64_t m0 = 0; m0 < n && ok(); m0 += kFastGemvMaxRows) {
        const int64_t m = std::min(kFastGemvMaxRows, n - m0);
        step(fast_fp4_gemv_q(rows_of(q_buf_, m0, I), m, 1, w.w2, ids + m0, ye + m0 * D, st_));
      }
    } else {
      step(fp4_gemm2_q(uq_, n, K, w.w1, w.w3, ids, a, b, st_));
      step(swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));  // routing weight before w2
      step(fp4_gemm_q(q_buf_, n, 1, w.w2, ids, ye, st_));
    }
  }
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

  // Routed experts of a tiered layer on the GEMV kernels: waves of at most the layer's slots
  // (one wave unless the step routes to more experts than that); each wave's rows see their
  // expert's slot, the others -1 (skipped). Per row the arithmetic is the resident path's.
  template <typename F>
  void routed_experts_tiered(int l, const DevLayer& w, int64_t K, const std::vector<int32_t>& ids, const float* weights, uint16_t* a, uint16_t* b,
                             uint16_t* ye, F& shared) {
    DevExpertSlots& slots = *m_.slots_;
    std::vector<int32_t> want = distinct(ids);
    slots.resident_first(l, want);
    const int E = c_.roles[size_t(l)].n_experts;
    std::vector<int32_t> slot_of(size_t(E), -1);
    for (size_t from = 0; from < want.size() && ok();) {
      auto next = slots.take(l, want, from, slot_of, st_);
      if (!next.ok()) {
        step(next.status());
        return;
      }
      if (from == 0) shared();
      step(slots.join(st_));
      std::vector<char> in_wave(size_t(E), 0);
      for (size_t i = from; i < *next; ++i) in_wave[size_t(want[i])] = 1;
      std::vector<int32_t> wave(ids.size(), -1);
      for (size_t i = 0; i < ids.size(); ++i)
        if (in_wave[size_t(ids[i])]) wave[i] = slot_of[size_t(ids[i])];
      routed_experts(w, K, upload(wave), weights, a, b, ye, slots.entries(l));
      slots.release(l);
      from = *next;
    }
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
  void sync() {
    if (ok() && !m_.ws_.capturing) step(cuda_status(cudaStreamSynchronize(st_), "stream"));
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
    else if (m_.mma_gemv_ && mma_gemv_ok(w.K, q.codes, w.w, 0, false)) step(mma_fp8_gemm_q(q, M, w, y, st_));
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
                         F& shared) {
    const int64_t D = c_.dim, I = c_.moe_inter_dim, n = T_ * K;
    std::vector<int64_t> count(size_t(E) + 1, 0);
    for (int32_t e : ids) {
      if (e < 0 || e >= E) {
        step(FB_ERROR(kInternal) << "router picked expert " << e);
        return;
      }
      ++count[size_t(e) + 1];
    }
    for (int e = 0; e < E; ++e) count[size_t(e) + 1] += count[size_t(e)];  // offsets
    std::vector<int32_t> perm(static_cast<size_t>(n));
    {
      std::vector<int64_t> at(count.begin(), count.end() - 1);
      for (int64_t i = 0; i < n; ++i) perm[size_t(at[size_t(ids[size_t(i)])]++)] = int32_t(i);
    }
    const int32_t* perm_d = upload(perm);
    uint16_t* xp = alloc<uint16_t>(n * D);
    uint16_t* ap = alloc<uint16_t>(n * I);
    uint16_t* bp = alloc<uint16_t>(n * I);
    uint16_t* hp = alloc<uint16_t>(n * I);
    uint16_t* yp = alloc<uint16_t>(n * D);
    float* wp = alloc<float>(n);
    if (!ok()) return;
    auto w1 = tc_->scratch(0, I * D, st_), w3 = tc_->scratch(1, I * D, st_), w2 = tc_->scratch(2, D * I, st_);
    if (!w1.ok() || !w3.ok() || !w2.ok()) {
      step(!w1.ok() ? w1.status() : !w3.ok() ? w3.status() : w2.status());
      return;
    }
    step(tc_dequant_act(uq_, D, perm_d, K, n, xp, st_));  // row i of the group = activation row perm[i] / K
    step(tc_gather_f32(weights, perm_d, n, wp, st_));
    std::vector<int32_t> want;
    for (int e = 0; e < E; ++e)
      if (count[size_t(e) + 1] > count[size_t(e)]) want.push_back(e);
    const bool tiered = m_.tiered(l);
    if (tiered) m_.slots_->resident_first(l, want);
    std::vector<int32_t> slot_of(size_t(E), -1);
    // Experts want[i0..i1), ascending and consecutive among the used ones, so their rows are the
    // contiguous range [count[want[i0]], count[want[i1 - 1] + 1]): w1 / w3, SwiGLU + act_quant of
    // the range (per row, so any split gives the same bits), w2.
    auto run = [&](size_t i0, size_t i1) {
      for (size_t i = i0; i < i1 && ok(); ++i) {
        const int e = want[i];
        const int64_t off = count[size_t(e)], m = count[size_t(e) + 1] - off;
        step(tc_dequant_fp4(w.w1, slot_of[size_t(e)], *w1, st_));
        step(tc_dequant_fp4(w.w3, slot_of[size_t(e)], *w3, st_));
        step(tc_->matmul(xp + off * D, m, D, D, *w1, I, ap + off * I, I, GemmOut::kBf16, 1, 0, 0, 0, st_));
        step(tc_->matmul(xp + off * D, m, D, D, *w3, I, bp + off * I, I, GemmOut::kBf16, 1, 0, 0, 0, st_));
      }
      const int64_t r0 = count[size_t(want[i0])], r1 = count[size_t(want[i1 - 1]) + 1];
      step(swiglu_quant(ap + r0 * I, bp + r0 * I, r1 - r0, I, c_.swiglu_limit, wp + r0, q_buf_, st_));  // routing weight before w2
      step(tc_dequant_act(q_buf_, I, nullptr, 1, r1 - r0, hp + r0 * I, st_));
      for (size_t i = i0; i < i1 && ok(); ++i) {
        const int e = want[i];
        const int64_t off = count[size_t(e)], m = count[size_t(e) + 1] - off;
        step(tc_dequant_fp4(w.w2, slot_of[size_t(e)], *w2, st_));
        step(tc_->matmul(hp + off * I, m, I, I, *w2, D, yp + off * D, D, GemmOut::kBf16, 1, 0, 0, 0, st_));
      }
    };
    if (!tiered) {
      for (int32_t e : want) slot_of[size_t(e)] = e;
      if (!want.empty()) run(0, want.size());
    }
    // A tiered layer (w's arrays are its slots): waves of at most its slots, resident experts
    // first; each expert runs alone, since a wave's experts are no longer consecutive.
    for (size_t from = 0; tiered && from < want.size() && ok();) {
      auto next = m_.slots_->take(l, want, from, slot_of, st_);
      if (!next.ok()) {
        step(next.status());
        return;
      }
      if (from == 0) shared();
      step(m_.slots_->join(st_));
      for (size_t i = from; i < *next && ok(); ++i) run(i, i + 1);
      m_.slots_->release(l);
      from = *next;
    }
    step(tc_scatter_rows(yp, perm_d, n, D, ye, st_));
  }
  // Scratch for the key-block split of attention when it applies (few rows, long key lists).
  // CudaRunOptions::attn_split = 0 turns it off, attn_predequant = 0 dequantises the key tiles inside
  // the score and P.V kernels again (A/B measurements only; every path gives the same bits).
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
  const float* route_biased_ = nullptr;  // the last moe()'s biased router scores [T, E] (its frame: valid until the next allocation)
  std::vector<ProfEvent> prof_;
  cudaEvent_t prof_begin_ = nullptr;
  std::chrono::steady_clock::time_point t_begin_ = std::chrono::steady_clock::now();
};

// ---------------------------------------------------------------------------------------------
// Backbone step over rows of one or more sessions (cpu::CpuStep).
class CudaStep : public CudaLayerOps {
 public:
  CudaStep(const CudaExecutor& m, const model::Step& step, const std::vector<CudaSession*>& sessions, model::Taps* taps)
      : CudaLayerOps(m, int64_t(step.rows.size())), step_(step), sessions_(sessions), taps_(taps) {
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    std::vector<uint8_t> image(static_cast<size_t>(T_));
    for (int64_t t = 0; t < T_; ++t) {
      pos[size_t(t)] = step.rows[size_t(t)].pos;
      image[size_t(t)] = step.rows[size_t(t)].image;
    }
    set_rows(pos, image);
    tc_ = m.tc_for(step);
    first_row_.assign(sessions.size(), -1);
    start_.assign(sessions.size(), 0);
    for (size_t s = 0; s < sessions.size(); ++s) start_[s] = sessions[s]->next_pos;
    for (int64_t t = 0; t < T_; ++t) {
      const int s = step.rows[size_t(t)].session;
      if (first_row_[size_t(s)] < 0) first_row_[size_t(s)] = t;
    }
    if (taps && taps->probe) probe_ = taps;
    n_taps_ = int(c_.dspark_target_layer_ids.size());
    taps_dev_ = taps_first_ = alloc<uint16_t>(T_ * n_taps_ * c_.dim);
    X_first_ = X_;
    if (taps_dev_ && n_taps_ > 0) step_status(cudaMemsetAsync(taps_dev_, 0, size_t(T_ * n_taps_ * c_.dim) * 2, st_));
    for (int64_t t = 0; t < T_; ++t) {
      CudaSession* s = sessions_[size_t(step.rows[size_t(t)].session)];
      s->tokens.push_back(step.rows[size_t(t)].token);
      s->image.push_back(step.rows[size_t(t)].image ? 1 : 0);
    }
  }

  model::StepOutput take_output() {
    if (m_.profile_) {  // host time to enqueue the whole step (vs step.gpu: is the GPU starved?)
      OpProfile& p = m_.prof_["step.enqueue"];
      p.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_begin_).count();
      ++p.calls;
    }
    sync();
    flush_profile();
    return std::move(out_);
  }

  void embed() {
    ProfScope prof_scope_(this, "embed");
    if (!ok()) return;
    const uint16_t* given = step_.embeddings.empty() ? nullptr : upload(step_.embeddings);
    std::vector<uint64_t> src;
    for (const Row& r : step_.rows)
      src.push_back(r.embed_row >= 0 ? addr(given + int64_t(r.embed_row) * c_.dim) : addr(m_.embed_ + int64_t(r.token) * c_.dim));
    embed_tokens(src);
  }

  // Bounded replay (spec/11 §8.4, cpu::CpuStep::leave_begin): at Config::decoder_start the rows
  // below their replay_start (the step's first rows: forward() checks it) become the only rows for
  // their collapse and compressor, then leave: every row buffer of the step is advanced past
  // them, so the decoder runs on the rest with the same kernels.
  bool leave_begin(int) {
    int64_t n = 0;
    while (n < T_ && row(n).kind == RowKind::kPrefill && row(n).pos < row(n).replay_start) ++n;
    if (n == 0) return false;
    T_all_ = T_;
    T_ = n;
    return true;
  }
  void leave_end(int l) {
    const int64_t n = T_, D = c_.dim, hc = c_.hc_mult;
    // Their slots in the decoder rings are marked empty (those rings hold replayed rows only).
    for (int64_t t = 0; t < n; ++t) {
      CudaSession* s = sessions_[size_t(row(t).session)];
      for (int d = l; d < c_.n_layers; ++d) {
        DevRing& ring = s->rings[size_t(d)];
        ring.pos[size_t(row(t).pos % ring.slots)] = -1;
      }
    }
    X_ += n * hc * D;
    residual_ += n * hc * D;
    pre_ += n * hc;
    mix_a_ += n;
    mix_f_ += n;
    u_ += n * D;
    y_ += n * D;
    h_ += n * D;
    qr_ += n * c_.q_lora_rank;
    q_ += n * c_.q_dim();
    o_ += n * c_.q_dim();
    kv_ += n * c_.head_dim;
    kv_raw_ += n * c_.head_dim;
    kv_codes_ += n * row_bytes();
    auto advance = [n](QuantBuf& b, int64_t per_row) {
      b.codes += n * per_row;
      b.scales += n * per_row / 32;
      b.capacity -= n * per_row;
    };
    advance(uq_, D);
    advance(qrq_, c_.q_lora_rank);
    pos_ += n;
    image_ += n;
    taps_dev_ += n * n_taps_ * D;
    const int64_t hash_row = int64_t(m_.engram_.size()) * (c_.engram_max_ngram - 1) * c_.engram_n_heads;
    if (hashes_) hashes_ += n * hash_row;
    if (!hashes_host_.empty()) hashes_host_.erase(hashes_host_.begin(), hashes_host_.begin() + n * hash_row);
    for (auto& [layer, sel] : selections_) {
      sel.ids += n * sel.ld;
      sel.count += n;
    }
    if (pool_mask_) pool_mask_ += n * pool_ld_;
    if (pool_len_) pool_len_ += n;
    row0_ += n;
    T_ = T_all_ - n;
    // Window keys of the step's own rows come from kv_codes_ from the first remaining row on.
    for (size_t s = 0; s < sessions_.size(); ++s) {
      first_row_[s] = -1;
      for (int64_t t = 0; t < T_ && first_row_[s] < 0; ++t)
        if (row(t).session == int(s)) first_row_[s] = t;
      if (first_row_[s] >= 0) start_[s] = row(first_row_[s]).pos;
    }
  }

  // spec/11 §6.3 row ids of both tables (host integer math: model::engram_row_ids, as the CPU).
  void engram_hash() {
    ProfScope prof_scope_(this, "engram_hash");
    if (!ok() || m_.engram_.empty()) return;
    const int n_tab = int(m_.engram_.size()), n_ord = c_.engram_max_ngram - 1, H = c_.engram_n_heads;
    std::vector<int64_t> hashes(size_t(T_ * n_tab * n_ord * H), 0);
    for (int64_t t = 0; t < T_; ++t) {
      const Row& r = row(t);
      const CudaSession* s = sessions_[size_t(r.session)];
      auto cls = [&](int64_t p) -> int64_t {
        if (s->image[size_t(p)]) return -1;
        return m_.token_map_.at(size_t(s->tokens[size_t(p)]));
      };
      model::engram_row_ids(m_.engram_, c_.engram_max_ngram, H, m_.pad_class_, r.pos, cls, &hashes[size_t(t * n_tab * n_ord * H)]);
    }
    hashes_ = upload(hashes);
    if (m_.engram_host_) hashes_host_ = std::move(hashes);
  }

  // spec/11 §6.4: gather + FP8 projection + per-stream gate, before block l.
  void engram(int l) {
    ProfScope prof_scope_(this, "engram");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const int tab = c_.roles[size_t(l)].engram_table, n_tab = int(m_.engram_.size());
    const int n_cols = (c_.engram_max_ngram - 1) * c_.engram_n_heads, hd = c_.engram_head_dim, hc = c_.hc_mult;
    const int64_t D = c_.dim;
    if (probe_ && probe_->inject_engram_in.count(l)) inject_rows(probe_->inject_engram_in.at(l), X_, T_ * hc * D);
    uint16_t* E = alloc<uint16_t>(T_ * n_cols * hd);
    uint16_t* kv = alloc<uint16_t>(T_ * (1 + hc) * D);
    if (!ok()) return;
    if (m_.engram_host_) {
      // Tables on the host: copy this step's rows (codes and scales, unchanged) from the mapped
      // snapshot into a compact [T, n_cols] table, then the same gather over identity ids.
      const model::LayerWeights& hw = m_.w_.layers[size_t(l)];
      const int64_t rows_total = hw.engram_table.dim(0), sb = hd / 32, n = T_ * n_cols;
      std::vector<uint8_t> codes(size_t(n * hd)), scales(size_t(n * sb));
      std::vector<int64_t> ident(static_cast<size_t>(n));
      for (int64_t t = 0; t < T_; ++t)
        for (int col = 0; col < n_cols; ++col) {
          const int64_t i = t * n_cols + col;
          const int64_t row = hashes_host_[size_t(t * n_tab * n_cols + int64_t(tab) * n_cols + col)];
          if (row < 0 || row >= rows_total) {
            step(FB_ERROR(kInternal) << "engram row " << row << " outside the table (" << rows_total << " rows)");
            return;
          }
          std::memcpy(&codes[size_t(i * hd)], hw.engram_table.data + row * hd, size_t(hd));
          std::memcpy(&scales[size_t(i * sb)], hw.engram_table_scale.data + row * sb, size_t(sb));
          ident[size_t(i)] = i;
        }
      step(engram_gather(upload(codes), upload(scales), upload(ident), n_cols, T_, n_cols, hd, E, st_));
    } else {
      step(engram_gather(w.engram_table, w.engram_table_scale, hashes_ + int64_t(tab) * n_cols, int64_t(n_tab) * n_cols, T_, n_cols, hd, E,
                         st_));
    }
    gemm_x(E, T_, w.engram_wkv, kv);
    step(engram_gate(X_, kv, w.engram_q, w.engram_k, T_, hc, D, c_.norm_eps, float(1.0 / std::sqrt(double(D))), image_, st_));
  }

  void dspark_tap(int tap) {
    ProfScope prof_scope_(this, "dspark_tap");
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    step(stream_mean(X_, T_, c_.hc_mult, c_.dim, taps_dev_ + int64_t(tap) * c_.dim, int64_t(n_taps_) * c_.dim, st_));
  }

  // Compressor of a KV source (spec/11 §4.4-4.6, §4.9b): latents of completed groups, appended
  // compressed entries and index keys BEFORE any scoring of this step.
  void compress(int l) {
    ProfScope prof_scope_(this, "compress");
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const int ratio = c_.roles[size_t(l)].ratio;
    const int64_t D = c_.dim, hd = c_.head_dim, ihd = c_.index_head_dim;
    const DevRope& rp = m_.rope_for(l);
    float* kg = nullptr;  // ratio 2: [T, k | g] f32
    uint16_t* lat1 = nullptr;
    if (ratio == 2) {
      kg = alloc<float>(T_ * 2 * hd);
      if (!ok()) return;
      gemm_bf(u_, T_, D, D, w.comp_wkv, hd, kg, 2 * hd, GemmOut::kF32);
      gemm_bf(u_, T_, D, D, w.comp_wgate, hd, kg + hd, 2 * hd, GemmOut::kF32);
    } else {
      lat1 = alloc<uint16_t>(T_ * hd);
      if (!ok()) return;
      gemm_bf(u_, T_, D, D, w.comp_wkv, hd, lat1, hd, GemmOut::kBf16);
    }
    // Host walk in row order (CpuStep::compress): which rows emit which entry, where sources and
    // destinations live.
    std::vector<uint64_t> even, odd, tail_src, tail_dst;
    std::vector<int64_t> gpos;
    std::vector<int32_t> emit_rows;
    std::vector<std::pair<int, int64_t>> dst;  // (session, entry)
    std::vector<int64_t> added(sessions_.size(), 0);
    std::map<std::pair<int, int64_t>, int64_t> tail_writer;  // (session, slot) -> newest row
    for (int64_t t = 0; t < T_; ++t) {
      const int s = row(t).session;
      const int64_t p = row(t).pos;
      DevCompressed& cc = sessions_[size_t(s)]->comp[size_t(l)];
      if (ratio == 2) {
        tail_writer[{s, p % cpu::kTailSlots}] = t;
        if (p % 2 == 0) continue;
        const bool prev_here = t > 0 && row(t - 1).session == s && row(t - 1).pos == p - 1;
        even.push_back(prev_here ? addr(kg + (t - 1) * 2 * hd) : addr(cc.tail.get<float>() + ((p - 1) % cpu::kTailSlots) * 2 * hd));
        odd.push_back(addr(kg + t * 2 * hd));
      }
      const int64_t j = p / ratio;
      if (cc.n_entries + added[size_t(s)] != j) {
        step(FB_ERROR(kInternal) << "compressed cache of layer " << l << " out of step: entry " << j << " after "
                                 << cc.n_entries + added[size_t(s)]);
        return;
      }
      ++added[size_t(s)];
      gpos.push_back(j * ratio);
      emit_rows.push_back(int32_t(t));
      dst.push_back({s, j});
    }
    const int64_t E = int64_t(gpos.size());
    for (size_t s = 0; s < sessions_.size(); ++s)
      if (added[s]) step(sessions_[s]->reserve_compressed(l, sessions_[s]->comp[size_t(l)].n_entries + added[s], st_));
    if (E > 0 && ok()) {
      uint16_t* latent = alloc<uint16_t>(E * hd);
      uint16_t* tmp = alloc<uint16_t>(E * ihd);
      uint16_t* key = alloc<uint16_t>(E * ihd);
      const int64_t kvb = hd / 2 + hd / 16, keyb = ihd / 2 + ihd / 32;
      uint8_t* kv_stage = alloc<uint8_t>(E * kvb);
      uint8_t* key_stage = alloc<uint8_t>(E * keyb);
      const int64_t* gpos_d = upload(gpos);
      if (!ok()) return;
      if (ratio == 2) {
        uint16_t* pooled = alloc<uint16_t>(E * hd);
        if (!ok()) return;
        const auto [even_d, odd_d] = upload_all(even, odd);
        if (!ok()) return;
        step(ratio2_pool(even_d, odd_d, E, hd, pooled, st_));
        step(rms_norm(pooled, E, hd, w.comp_norm, c_.norm_eps, latent, st_));
      } else {
        step(rms_norm(lat1, E, hd, w.comp_norm, c_.norm_eps, latent, st_));  // every row emits, in row order
      }
      // index key from the PRE-RoPE latent
      gemm_bf(latent, E, hd, hd, w.idx_wk, ihd, tmp, ihd, GemmOut::kBf16);
      step(rms_norm(tmp, E, ihd, w.idx_k_norm, c_.norm_eps, key, st_));
      step(rope(key, E, 1, ihd, c_.rope_head_dim, gpos_d, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
      step(fp4_e8m0_qdq(key, E, ihd, key_stage, keyb, nullptr, st_));
      step(rope(latent, E, 1, hd, c_.rope_head_dim, gpos_d, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
      step(fp4_e4m3_qdq(latent, E, hd, kv_stage, kvb, nullptr, st_));
      std::vector<uint64_t> s_kv, d_kv, s_key, d_key;
      for (int64_t i = 0; i < E; ++i) {
        DevCompressed& cc = sessions_[size_t(dst[size_t(i)].first)]->comp[size_t(l)];
        const int64_t j = dst[size_t(i)].second;
        s_kv.push_back(addr(kv_stage + i * kvb));
        d_kv.push_back(addr(cc.kv.get<uint8_t>() + j * cc.kv_bytes));
        s_key.push_back(addr(key_stage + i * keyb));
        d_key.push_back(addr(cc.keys.get<uint8_t>() + j * cc.key_bytes));
      }
      const auto [s_kv_d, d_kv_d, s_key_d, d_key_d] = upload_all(s_kv, d_kv, s_key, d_key);
      if (!ok()) return;
      step(copy_rows(s_kv_d, d_kv_d, E, kvb, st_));
      step(copy_rows(s_key_d, d_key_d, E, keyb, st_));
    }
    // Tails (ratio 2): every row's (k, g) into its position slot (newest row per slot), written
    // after the pooling read them (cpu::CpuStep::compress, cpu::kTailSlots).
    if (ratio == 2) {
      for (const auto& [key, t] : tail_writer) {
        DevCompressed& tcc = sessions_[size_t(key.first)]->comp[size_t(l)];
        tcc.tail_pos[size_t(key.second)] = row(t).pos;
        float* tail = tcc.tail.get<float>();
        tail_src.push_back(addr(kg + t * 2 * hd));
        tail_dst.push_back(addr(tail + key.second * 2 * hd));
      }
      const auto [tail_src_d, tail_dst_d] = upload_all(tail_src, tail_dst);
      if (ok()) step(copy_rows(tail_src_d, tail_dst_d, int64_t(tail_src.size()), 2 * hd * int64_t(sizeof(float)), st_));
    }
    for (size_t s = 0; s < sessions_.size(); ++s) sessions_[s]->comp[size_t(l)].n_entries += added[s];
  }

  // Indexer (spec/11 §4.7-4.9): bf16 score chain, candidate pool, top-k selection per row.
  void index_select(int l) {
    ProfScope prof_scope_(this, "index_select");
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int ratio = r.ratio, IH = c_.index_n_heads, ihd = c_.index_head_dim;
    const int64_t D = c_.dim;
    const DevRope& rp = m_.rope_for(l);
    const float wscale = float(1.0 / std::sqrt(double(ihd)) / std::sqrt(double(IH)));
    std::vector<int64_t> n_vis(static_cast<size_t>(T_)), n_scored(static_cast<size_t>(T_));
    std::vector<uint64_t> keys_base(static_cast<size_t>(T_));
    int64_t ld = 1;
    for (int64_t t = 0; t < T_; ++t) {
      const Row& row = this->row(t);
      n_vis[size_t(t)] = (row.pos + 1) / ratio;
      n_scored[size_t(t)] = row.kind == RowKind::kPrefill ? row.prefill_end / ratio : n_vis[size_t(t)];
      ld = std::max(ld, n_scored[size_t(t)]);
      const DevCompressed& cc = sessions_[size_t(row.session)]->comp[size_t(r.kv_layer)];
      if (cc.n_entries < n_vis[size_t(t)]) {
        step(FB_ERROR(kInternal) << "layer " << l << ": " << cc.n_entries << " index keys, row needs " << n_vis[size_t(t)]);
        return;
      }
      keys_base[size_t(t)] = addr(cc.keys.get());
    }
    // Outliving this op: the selection (later layers reuse it), the candidate pool and the
    // n_scored list it is read with. Then the op's temporaries in a frame.
    Selection& sel = selections_[l];
    sel.ld = c_.index_topk;
    sel.ids = alloc<int32_t>(T_ * sel.ld);
    sel.count = alloc<int32_t>(T_);
    const int64_t* ns = upload(n_scored);
    uint8_t* new_pool = r.candidate_source ? alloc<uint8_t>(T_ * ld) : nullptr;
    Frame frame_(this);
    uint16_t* iq = alloc<uint16_t>(T_ * IH * ihd);
    uint16_t* wts = alloc<uint16_t>(T_ * IH);
    float* I = alloc<float>(T_ * ld);
    const auto [nv, kb] = upload_all(n_vis, keys_base);
    if (!ok()) return;
    gemm_q(qrq_, T_, w.idx_wq_b, iq);
    step(rope(iq, T_, IH, ihd, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
    step(fp4_e8m0_qdq(iq, T_ * IH, ihd, nullptr, 0, iq, st_));
    gemm_bf(u_, T_, D, D, w.idx_weights_proj, IH, wts, IH, GemmOut::kBf16);
    step(scale_bf16(wts, T_ * IH, wscale, st_));
    // Rows restricted to an earlier layer's pool score only the pool's entries (the rest are
    // -inf either way); the candidate source itself scores everything.
    const bool skip_unpooled = r.pool_restricted && !r.candidate_source && pool_mask_;
    if (tc_)  // prefill rows: the dots on tensor cores (tc_gemm.h), the head chain as the CPU
      step(tc_index_scores(*tc_, iq, wts, T_, IH, ihd, keys_base, n_vis, n_scored, int64_t(ihd / 2 + ihd / 32), nv, ns, I, ld, st_,
                           skip_unpooled ? pool_mask_ : nullptr, pool_ld_, pool_len_));
    else
      step(index_scores(iq, wts, T_, IH, ihd, kb, int64_t(ihd / 2 + ihd / 32), nv, ns, I, ld, st_, skip_unpooled ? pool_mask_ : nullptr,
                        pool_ld_, pool_len_));
    if (r.candidate_source) {
      pool_mask_ = new_pool;
      pool_ld_ = ld;
      pool_len_ = ns;
      if (!ok()) return;
      step(candidate_pool(I, T_, ld, ns, nv, c_.candidate_block_size, c_.candidate_topk_blocks, pool_mask_, st_));
    }
    const uint8_t* mask = r.pool_restricted ? pool_mask_ : nullptr;
    if (r.pool_restricted && !mask) {
      step(FB_ERROR(kInternal) << "layer " << l << " is pool-restricted but no candidate pool was published");
      return;
    }
    if (probe_) probe_index_margins(l, r, I, ld, n_vis, n_scored);
    step(topk_select(I, T_, ld, ns, nv, mask, pool_ld_, pool_len_, sel.ld, sel.ids, sel.count, st_));
  }

  // ---- layer gate (Taps::probe): injection, sublayer outputs and selection margins ----------
  // The backbone calls these wrappers (model::run_backbone is a template over CudaStep), which
  // add the probe's work around the shared ops; without a probe they only forward.
  void hc_mixes(int l, Site site) {
    if (probe_ && site == Site::kAttn && l < c_.n_layers && ok()) {
      const int64_t n = T_ * c_.hc_mult * c_.dim;
      if (c_.roles[size_t(l)].engram_table >= 0) probe_->blocks[l].engram_out = download_f32(X_, n);
      if (probe_->inject_x.count(l)) {
        inject_rows(probe_->inject_x.at(l), X_, n);
        const std::vector<float>& p = probe_->inject_pre.at(l);
        if (int64_t(p.size()) != T_ * c_.hc_mult) {
          step(FB_ERROR(kInvalidArgument) << "injected pre of layer " << l << " has " << p.size() << " values for " << T_ << " rows");
          return;
        }
        step(cuda_status(cudaMemcpyAsync(pre_, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice, st_), "inject"));
        sync();
      }
    }
    CudaLayerOps::hc_mixes(l, site);
  }
  void attn_output(int l) {
    CudaLayerOps::attn_output(l);
    if (!probe_ || l >= c_.n_layers || !ok()) return;
    model::Taps::BlockProbe& b = probe_->blocks[l];
    b.attn_out = download_f32(y_, T_ * c_.dim);
    const LayerRole& r = c_.roles[size_t(l)];
    auto it = r.ratio > 0 ? sel_margin_.find(r.index_layer) : sel_margin_.end();
    b.attn_margin = it != sel_margin_.end() ? it->second : std::vector<float>(size_t(T_), INFINITY);
  }
  void moe(int l) {
    CudaLayerOps::moe(l);
    if (!probe_ || l >= c_.n_layers || !ok()) return;
    model::Taps::BlockProbe& b = probe_->blocks[l];
    b.ffn_out = download_f32(y_, T_ * c_.dim);
    // The router's biased scores of this call (route()'s scratch, kept by CudaLayerOps::moe).
    const int E = c_.roles[size_t(l)].n_experts, K = c_.roles[size_t(l)].n_active;
    std::vector<float> biased;
    download(biased, route_biased_, T_ * E);
    sync();
    if (!ok()) return;
    b.ffn_margin.assign(size_t(T_), INFINITY);
    for (int64_t t = 0; t < T_; ++t) {
      const float am = size_t(t) < b.attn_margin.size() ? b.attn_margin[size_t(t)] : INFINITY;
      b.ffn_margin[size_t(t)] = std::min(am, model::selection_margin(&biased[size_t(t * E)], E, K));
    }
  }

  void attention(int l) {
    ProfScope prof_scope_(this, "attention");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t hd = c_.head_dim, W = c_.window_size;
    const float scale = float(1.0 / std::sqrt(double(hd)));
    std::vector<uint64_t> win;
    std::vector<int32_t> off{0};
    std::vector<uint64_t> comp_base(static_cast<size_t>(T_), 0);
    for (int64_t t = 0; t < T_; ++t) {
      const Row& row = this->row(t);
      const int s = row.session;
      const int64_t p = row.pos, start = start_[size_t(s)], t0 = first_row_[size_t(s)];
      const DevRing& ring = sessions_[size_t(s)]->rings[size_t(l)];
      bool missing = false;
      auto window_key = [&](int64_t q) -> uint64_t {
        if (q >= start) return addr(kv_codes_ + (t0 + (q - start)) * row_bytes());
        const uint8_t* b = ring.find(q);
        if (!b) missing = true;
        return addr(b);
      };
      int64_t lo = std::max<int64_t>(0, p - W + 1);
      // Bounded replay: a decoder layer's window holds no key below the replay start (§8.4).
      if (row.kind == RowKind::kPrefill && c_.decoder_start >= 0 && l >= c_.decoder_start) lo = std::max(lo, row.replay_start);
      const size_t n0 = win.size();
      if (row.kind == RowKind::kPrefill) {
        const int64_t width = std::min<int64_t>(row.prefill_end, W);
        for (int64_t q = lo; q <= p; ++q) win.push_back(window_key(q));
        while (int64_t(win.size() - n0) < width) win.push_back(0);
      } else {
        for (int64_t i = 0; i < W - 1 - p; ++i) win.push_back(0);
        for (int64_t q = lo; q <= p; ++q) win.push_back(window_key(q));
      }
      if (missing) {
        step(FB_ERROR(kInternal) << "window row missing at layer " << l << " for position " << p);
        return;
      }
      off.push_back(int32_t(win.size()));
      if (r.ratio > 0) comp_base[size_t(t)] = addr(sessions_[size_t(s)]->comp[size_t(r.kv_layer)].kv.get());
    }
    AttnKeys keys;
    const auto [win_d, off_d, comp_base_d] = upload_all(win, off, comp_base);
    keys.win = win_d;
    keys.win_off = off_d;
    if (r.ratio > 0) {
      auto it = selections_.find(r.index_layer);
      if (it == selections_.end()) {
        step(FB_ERROR(kInternal) << "layer " << l << " reads the selection of layer " << r.index_layer << ", which did not run");
        return;
      }
      keys.sel = it->second.ids;
      keys.sel_count = it->second.count;
      keys.sel_ld = it->second.ld;
      keys.comp_base = comp_base_d;
    }
    int max_win = 0;
    for (size_t t = 0; t + 1 < off.size(); ++t) max_win = std::max(max_win, off[t + 1] - off[t]);
    const int max_keys = max_win + (keys.sel ? int(keys.sel_ld) : 0);
    if (tc_) {  // prefill rows: dots and P.V sums on tensor cores (tc_gemm.h)
      keys.max_keys = max_keys;
      step(tc_sparse_attention(*tc_, q_, T_, c_.n_heads, int(hd), keys, w.attn_sink, scale, o_, st_));
      return;
    }
    split_scratch(keys, max_keys);
    if (!ok()) return;
    step(sparse_attention(q_, T_, c_.n_heads, int(hd), keys, w.attn_sink, scale, o_, st_));
  }

  void end_layer(int l) {
    ProfScope prof_scope_(this, "end_layer");
    if (!ok()) return;
    // Ring writes after every row of the step attended; of rows sharing a slot the last wins.
    std::map<int64_t, std::pair<uint64_t, uint64_t>> writes;  // key: session * 2^40 + slot
    for (int64_t t = 0; t < T_; ++t) {
      const int s = row(t).session;
      DevRing& ring = sessions_[size_t(s)]->rings[size_t(l)];
      const int64_t p = row(t).pos;
      writes[(int64_t(s) << 40) + p % ring.slots] = {addr(kv_codes_ + t * row_bytes()), addr(ring.slot(p))};
      ring.pos[size_t(p % ring.slots)] = p;
    }
    std::vector<uint64_t> src, dst;
    for (auto& [k, v] : writes) {
      src.push_back(v.first);
      dst.push_back(v.second);
    }
    const auto [src_d, dst_d] = upload_all(src, dst);
    if (ok()) step(copy_rows(src_d, dst_d, int64_t(src.size()), row_bytes(), st_));
    if (taps_ && taps_->enabled) {
      if (taps_->after_block.size() < size_t(c_.n_layers)) taps_->after_block.resize(size_t(c_.n_layers));
      // Every row of the step (rows that left keep the stream they left with, as on the CPU).
      download(taps_->after_block[size_t(l)], X_first_, int64_t(step_.rows.size()) * c_.hc_mult * c_.dim);
      sync();
    }
  }

  void head() {
    ProfScope prof_scope_(this, "head");
    if (!ok()) return;
    std::vector<int32_t> rows;
    for (int64_t t = 0; t < T_; ++t)
      if (row(t).want_logits) {
        out_.logit_rows.push_back(int(row0_ + t));  // index into the step's rows
        rows.push_back(int32_t(t));
      }
    float* logits = alloc<float>(int64_t(rows.size()) * c_.vocab_size);
    head_rows(rows, m_.norm_, logits, nullptr);
    download(out_.logits, logits, int64_t(rows.size()) * c_.vocab_size);
    // Tap rows from step_.taps_from_row on (the caller reads no earlier row).
    const int64_t n_rows = int64_t(step_.rows.size());
    const int64_t tw = n_taps_ * c_.dim, from = std::clamp<int64_t>(step_.taps_from_row, 0, n_rows);
    out_.taps_first_row = from;
    download(out_.taps, taps_first_ + from * tw, (n_rows - from) * tw);
    sync();
    if (!ok()) return;
    for (size_t s = 0; s < sessions_.size(); ++s) {
      int64_t n = 0;
      for (const Row& r : step_.rows) n += r.session == int(s);
      sessions_[s]->next_pos += n;
    }
  }

 private:
  struct Selection {
    int32_t* ids = nullptr;    // [T, ld] ascending, -1 = empty
    int32_t* count = nullptr;  // [T]
    int64_t ld = 0;
  };
  void step_status(cudaError_t e) { step(cuda_status(e, "step")); }
  // Probe helpers (layer gate): host f32 rows -> bf16 device rows, device bf16 -> host f32.
  void inject_rows(const std::vector<float>& x, uint16_t* dst, int64_t n) {
    if (!ok()) return;
    if (int64_t(x.size()) != n || row0_ != 0) {
      step(FB_ERROR(kInvalidArgument) << "injected rows hold " << x.size() << " values, the step needs " << n);
      return;
    }
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = bf16_bits_from_f32(x[i]);
    step(cuda_status(cudaMemcpyAsync(dst, b.data(), b.size() * 2, cudaMemcpyHostToDevice, st_), "inject"));
    sync();  // b goes out of scope
  }
  std::vector<float> download_f32(const uint16_t* src, int64_t n) {
    std::vector<uint16_t> b;
    download(b, src, n);
    sync();
    std::vector<float> out(b.size());
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
    return out;
  }
  // Margins of index layer l's selection by the scores this executor computed (I before the top-k
  // masks it): its own top-k over the scored slice (pool-restricted rows: only the pool's
  // entries compete) and the candidate pool it is restricted to.
  void probe_index_margins(int l, const LayerRole& r, const float* I_dev, int64_t ld, const std::vector<int64_t>& n_vis,
                           const std::vector<int64_t>& n_scored) {
    std::vector<float> I;
    download(I, I_dev, T_ * ld);
    sync();
    if (!ok()) return;
    if (r.candidate_source) {
      pool_margin_.assign(size_t(T_), INFINITY);
      pool_host_.assign(size_t(T_ * ld), 0);
      pool_host_ld_ = ld;
      pool_host_len_ = n_scored;
      download(pool_host_, pool_mask_, T_ * ld);
      sync();
      for (int64_t t = 0; t < T_; ++t)
        pool_margin_[size_t(t)] = model::pool_margin(&I[size_t(t * ld)], n_scored[size_t(t)], n_vis[size_t(t)], c_.candidate_block_size,
                                                     c_.candidate_topk_blocks);
    }
    std::vector<float>& m = sel_margin_[l];
    m.assign(size_t(T_), INFINITY);
    for (int64_t t = 0; t < T_; ++t) {
      float* row = &I[size_t(t * ld)];
      const int64_t ns = n_scored[size_t(t)];
      if (r.pool_restricted && !pool_host_.empty())
        for (int64_t j = 0; j < ns; ++j)
          if (j >= pool_host_len_[size_t(t)] || !pool_host_[size_t(t * pool_host_ld_ + j)]) row[j] = -INFINITY;
      m[size_t(t)] = model::selection_margin(row, ns, std::min<int64_t>(c_.index_topk, ns));
      if (r.pool_restricted && !pool_margin_.empty()) m[size_t(t)] = std::min(m[size_t(t)], pool_margin_[size_t(t)]);
    }
  }
  // Row t of the rows still running (after bounded-replay rows left: step_.rows[row0_ + t]).
  const Row& row(int64_t t) const { return step_.rows[size_t(row0_ + t)]; }

  const model::Step& step_;
  int64_t row0_ = 0;   // rows that left at the decoder (bounded replay)
  int64_t T_all_ = 0;  // the step's rows while some are about to leave
  uint16_t* X_first_ = nullptr;     // X_ of row 0 (detailed taps cover every row of the step)
  uint16_t* taps_first_ = nullptr;  // taps_dev_ of row 0
  const std::vector<CudaSession*>& sessions_;
  model::Taps* taps_;
  model::Taps* probe_ = nullptr;  // layer gate (Taps::probe)
  std::map<int, std::vector<float>> sel_margin_;  // probe: per index layer, per row
  std::vector<float> pool_margin_;                // probe: the newest candidate pool's margins
  std::vector<uint8_t> pool_host_;                // probe: that pool's mask [T, ld] on the host
  int64_t pool_host_ld_ = 0;
  std::vector<int64_t> pool_host_len_;
  model::StepOutput out_;
  std::vector<int64_t> first_row_, start_;
  int n_taps_ = 0;
  uint16_t* taps_dev_ = nullptr;  // [T, n_taps, D]
  int64_t* hashes_ = nullptr;     // [T, tables, orders * heads]
  std::vector<int64_t> hashes_host_;  // the same on the host when the tables are (CudaExecutor::engram_host_)
  std::map<int, Selection> selections_;
  uint8_t* pool_mask_ = nullptr;
  int64_t pool_ld_ = 0;
  const int64_t* pool_len_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// DSpark draft block (cpu::CpuDraftStep): B rows at p+1..p+B, keys = the stage's ring in SLOT
// order, then the block rows.
class CudaDraftStep : public CudaLayerOps {
 public:
  CudaDraftStep(const CudaExecutor& m, CudaSession& s, int32_t anchor, int64_t p)
      : CudaLayerOps(m, m.cfg_.dspark_block_size), s_(s), anchor_(anchor), p_(p) {
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    for (int64_t k = 0; k < T_; ++k) pos[size_t(k)] = p + 1 + k;
    set_rows(pos, std::vector<uint8_t>(size_t(T_), 0));
  }

  void embed() {
    ProfScope prof_scope_(this, "embed");
    std::vector<uint64_t> src;
    for (int64_t k = 0; k < T_; ++k) src.push_back(addr(m_.embed_ + int64_t(k == 0 ? anchor_ : c_.dspark_noise_token_id) * c_.dim));
    embed_tokens(src);
  }

  void attention(int l) {
    ProfScope prof_scope_(this, "attention");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const int64_t hd = c_.head_dim;
    const DevRing& ring = s_.draft_rings[size_t(l - c_.n_layers)];
    const int64_t n = std::min<int64_t>(c_.window_size, p_ + 1);
    std::vector<uint64_t> win;
    std::vector<int32_t> off{0};
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t slot = 0; slot < n; ++slot) win.push_back(addr(ring.data.get<uint8_t>() + slot * ring.row_bytes));
      for (int64_t k = 0; k < T_; ++k) win.push_back(addr(kv_codes_ + k * row_bytes()));
      off.push_back(int32_t(win.size()));
    }
    AttnKeys keys;
    std::tie(keys.win, keys.win_off) = upload_all(win, off);
    split_scratch(keys, int(n + T_));
    if (!ok()) return;
    step(sparse_attention(q_, T_, c_.n_heads, int(hd), keys, w.attn_sink, float(1.0 / std::sqrt(double(hd))), o_, st_));
  }

  void head() {
    ProfScope prof_scope_(this, "head");
    if (!ok()) return;
    hH_ = alloc<uint16_t>(T_ * c_.dim);
    U_ = alloc<float>(T_ * c_.vocab_size);
    std::vector<int32_t> rows;
    for (int64_t k = 0; k < T_; ++k) rows.push_back(int32_t(k));
    head_rows(rows, m_.draft_.norm, U_, hH_);
  }

  // spec/13 §4.6-4.7: sequential Markov bias over the full vocabulary, greedy draws (on the
  // device, so the chain never waits for the host), raw confidence logits.
  void markov_chain() {
    ProfScope prof_scope_(this, "markov_chain");
    if (!ok()) return;
    const int64_t V = c_.vocab_size, D = c_.dim;
    const int r = c_.dspark_markov_rank;
    int32_t* ids = upload(std::vector<int32_t>(size_t(T_ + 1), anchor_));
    float* conf = alloc<float>(T_);
    if (!ok()) return;
    for (int64_t k = 1; k <= T_; ++k) {
      float* lk = U_ + (k - 1) * V;
      step(markov_bias(lk, V, r, m_.draft_.markov_embed, m_.draft_.markov_head, ids + k - 1, st_));
      step(argmax(lk, V, ids + k, st_));
      step(confidence(hH_ + (k - 1) * D, D, m_.draft_.markov_embed, r, ids + k - 1, m_.draft_.confidence, conf + k - 1, st_));
    }
    download(out_.ids, ids, T_ + 1);
    download(out_.confidence, conf, T_);
    download(out_.logits, U_, T_ * V);
    sync();
  }

  model::DraftOutput take_output() {
    flush_profile();
    return std::move(out_);
  }

 private:
  CudaSession& s_;
  int32_t anchor_;
  int64_t p_;
  uint16_t* hH_ = nullptr;
  float* U_ = nullptr;
  model::DraftOutput out_;
};

// ---------------------------------------------------------------------------------------------

TcGemm* CudaExecutor::tc_for(const model::Step& step) const {
  if (!tc_on_ || ws_.capturing || int64_t(step.rows.size()) < tc_min_rows_) return nullptr;
  for (const Row& r : step.rows)
    if (r.kind != RowKind::kPrefill) return nullptr;  // decode / verify rows keep the exact kernels
  if (!tc_) {
    auto t = TcGemm::create();
    if (!t.ok()) return nullptr;  // no cuBLASLt: the exact kernels (same results up to order)
    tc_ = std::move(*t);
  }
  return tc_.get();
}

Result<std::vector<CudaExecutor::GemmTiming>> CudaExecutor::time_prefill_gemms(int64_t M, int layer, int reps) {
  if (layer < 0 || layer >= cfg_.n_layers) return FB_ERROR(kInvalidArgument) << "layer " << layer;
  if (tiered(layer)) return FB_ERROR(kUnsupported) << "GEMM timing needs every expert of layer " << layer << " resident (no --expert-slots)";
  if (!tc_) tc_ = FB_TRY(TcGemm::create());
  TcGemm& tc = *tc_;
  const DevLayer& w = layers_[size_t(layer)];
  const LayerRole& role = cfg_.roles[size_t(layer)];
  const int64_t D = cfg_.dim, I = cfg_.moe_inter_dim, K = role.n_active, E = role.n_experts;
  const int64_t G = cfg_.o_groups, OR = cfg_.o_lora_rank, GI = cfg_.o_group_in(), QD = cfg_.q_dim();
  // Inputs: act_quant codes of random bf16 rows (the values do not change the time).
  const int64_t kmax = std::max<int64_t>({D, cfg_.q_lora_rank, G * OR, I});
  DeviceBuffer xin, codes, scales, out, out2, xo;
  FB_RETURN_IF_ERROR(xin.alloc(size_t(M * kmax) * 2));
  FB_RETURN_IF_ERROR(codes.alloc(size_t(M * K * kmax)));
  FB_RETURN_IF_ERROR(scales.alloc(size_t(M * K * kmax / 32 + 1) * 4));
  FB_CUDA_TRY(cudaMemsetAsync(codes.get(), 0x38, size_t(M * K * kmax), stream_));  // e4m3 1.0
  FB_CUDA_TRY(cudaMemsetAsync(scales.get(), 0, size_t(M * K * kmax / 32 + 1) * 4, stream_));
  FB_RETURN_IF_ERROR(out.alloc(size_t(M * K * std::max<int64_t>({D, I, QD})) * 2));
  FB_RETURN_IF_ERROR(out2.alloc(size_t(M * K * std::max<int64_t>({D, I})) * 2));
  FB_RETURN_IF_ERROR(xo.alloc(size_t(M * QD) * 2));
  FB_CUDA_TRY(cudaMemsetAsync(xin.get(), 0x3C, size_t(M * kmax) * 2, stream_));  // bf16 ~0.0115
  FB_CUDA_TRY(cudaMemsetAsync(xo.get(), 0x3C, size_t(M * QD) * 2, stream_));
  QuantBuf q{codes.get<uint8_t>(), scales.get<float>(), M * K * kmax};
  FB_RETURN_IF_ERROR(act_quant(xin.get<uint16_t>(), M, D, q, stream_));
  // Routed rows spread evenly over the experts (the grouped path's work for a balanced router).
  const int64_t n = M * K;
  std::vector<int64_t> off(size_t(E) + 1);
  for (int64_t e = 0; e <= E; ++e) off[size_t(e)] = n * e / E;
  DeviceBuffer xp, wbuf[3];
  FB_RETURN_IF_ERROR(xp.alloc(size_t(n * D) * 2));
  for (auto& b : wbuf) FB_RETURN_IF_ERROR(b.alloc(size_t(I * D) * 2));
  auto fp8 = [&](const Fp8W& f, int64_t rows) -> Status { return tc_fp8_gemm_q(tc, q, rows, f, out.get<uint16_t>(), stream_); };
  std::vector<std::pair<std::string, std::function<Status()>>> jobs;
  std::vector<double> flops;
  auto add = [&](std::string name, double fl, std::function<Status()> f) {
    jobs.emplace_back(std::move(name), std::move(f));
    flops.push_back(fl);
  };
  add("wq_a", 2.0 * M * w.wq_a.N * w.wq_a.K, [&] { return fp8(w.wq_a, M); });
  add("wq_b", 2.0 * M * w.wq_b.N * w.wq_b.K, [&] { return fp8(w.wq_b, M); });
  add("wkv", 2.0 * M * w.wkv.N * w.wkv.K, [&] { return fp8(w.wkv, M); });
  add("wo_a (grouped bf16)", 2.0 * M * G * OR * GI, [&] {
    return tc_bf16_gemm(tc, xo.get<uint16_t>(), M, GI, QD, w.wo_a, OR, out.get<uint16_t>(), G * OR, GemmOut::kBf16, G, GI, OR * GI, OR, stream_);
  });
  add("wo_b", 2.0 * M * w.wo_b.N * w.wo_b.K, [&] { return fp8(w.wo_b, M); });
  add("shared w1+w3+w2", 2.0 * M * 3 * I * D, [&] {
    FB_RETURN_IF_ERROR(fp8(w.sh_w1, M));
    FB_RETURN_IF_ERROR(fp8(w.sh_w3, M));
    return tc_fp8_gemm_q(tc, q, M, w.sh_w2, out2.get<uint16_t>(), stream_);
  });
  add("routed w1+w3+w2 (" + std::to_string(E) + " experts)", 2.0 * double(n) * 3 * I * D, [&]() -> Status {
    FB_RETURN_IF_ERROR(tc_dequant_act(q, D, nullptr, 1, n, xp.get<uint16_t>(), stream_));
    for (int64_t e = 0; e < E; ++e) {
      const int64_t o = off[size_t(e)], m = off[size_t(e) + 1] - o;
      if (m == 0) continue;
      uint16_t* xe = xp.get<uint16_t>() + o * D;
      FB_RETURN_IF_ERROR(tc_dequant_fp4(w.w1, e, wbuf[0].get<uint16_t>(), stream_));
      FB_RETURN_IF_ERROR(tc_dequant_fp4(w.w3, e, wbuf[1].get<uint16_t>(), stream_));
      FB_RETURN_IF_ERROR(tc_dequant_fp4(w.w2, e, wbuf[2].get<uint16_t>(), stream_));
      FB_RETURN_IF_ERROR(tc.matmul(xe, m, D, D, wbuf[0].get<uint16_t>(), I, out.get<uint16_t>() + o * I, I, GemmOut::kBf16, 1, 0, 0, 0, stream_));
      FB_RETURN_IF_ERROR(tc.matmul(xe, m, D, D, wbuf[1].get<uint16_t>(), I, out2.get<uint16_t>() + o * I, I, GemmOut::kBf16, 1, 0, 0, 0, stream_));
      // the down projection's output overwrites the group's (already consumed) input rows
      FB_RETURN_IF_ERROR(tc.matmul(out.get<uint16_t>() + o * I, m, I, I, wbuf[2].get<uint16_t>(), D, xe, D, GemmOut::kBf16, 1, 0, 0, 0, stream_));
    }
    return Status();
  });
  cudaEvent_t a = nullptr, b = nullptr;
  FB_CUDA_TRY(cudaEventCreate(&a));
  FB_CUDA_TRY(cudaEventCreate(&b));
  std::vector<GemmTiming> res;
  Status st;
  for (size_t j = 0; j < jobs.size() && st.ok(); ++j) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 1 && st.ok(); ++r) {  // the first run warms plans and scratch
      cudaEventRecord(a, stream_);
      st = jobs[j].second();
      cudaEventRecord(b, stream_);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      if (r > 0) ms.push_back(t);
    }
    if (!st.ok()) break;
    std::sort(ms.begin(), ms.end());
    res.push_back({jobs[j].first, flops[j], double(ms[ms.size() / 2])});
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  FB_RETURN_IF_ERROR(st);
  return res;
}

Result<model::StepOutput> CudaExecutor::forward(const model::Step& step, const std::vector<model::SessionState*>& sessions, model::Taps* taps) {
  std::vector<CudaSession*> ss;
  for (auto* p : sessions) {
    auto* s = dynamic_cast<CudaSession*>(p);
    if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
    FB_RETURN_IF_ERROR(s->ensure_allocated(stream_));
    ss.push_back(s);
  }
  std::vector<int64_t> next(ss.size());
  for (size_t s = 0; s < ss.size(); ++s) next[s] = ss[s]->next_pos;
  int64_t max_pos = 0;
  bool staying_seen = false;
  for (const Row& r : step.rows) {
    if (r.session < 0 || size_t(r.session) >= ss.size()) return FB_ERROR(kInvalidArgument) << "row names session " << r.session;
    if (r.pos != next[size_t(r.session)])
      return FB_ERROR(kInvalidArgument) << "row position " << r.pos << " but session " << r.session << " expects " << next[size_t(r.session)];
    if (r.token < 0 || r.token >= cfg_.vocab_size) return FB_ERROR(kInvalidArgument) << "token id " << r.token << " outside the vocabulary";
    if (r.embed_row >= 0 && size_t(r.embed_row + 1) * size_t(cfg_.dim) > step.embeddings.size())
      return FB_ERROR(kInvalidArgument) << "row embedding " << r.embed_row << " missing";
    if (r.kind == RowKind::kPrefill && r.prefill_end <= r.pos) return FB_ERROR(kInvalidArgument) << "prefill row beyond its prefill_end";
    if (r.replay_start != 0) {
      if (!bounded_replay_enabled())
        return FB_ERROR(kUnsupported) << "bounded replay is turned off for this CUDA executor (run option bounded_replay=0)";
      if (r.kind != RowKind::kPrefill || r.replay_start < 0) return FB_ERROR(kInvalidArgument) << "replay_start on a row that is not a prefill row";
      if (cfg_.decoder_start < 0) return FB_ERROR(kUnsupported) << "bounded replay: the config has no decoder KV source to split at";
      if (r.replay_start >= r.prefill_end) return FB_ERROR(kInvalidArgument) << "replay_start " << r.replay_start << " leaves no prompt row to replay";
      if (r.want_logits && r.pos < r.replay_start) return FB_ERROR(kInvalidArgument) << "row " << r.pos << " wants logits but ends at the encoder";
    }
    // Rows that leave at the decoder (CudaStep::leave_begin) are the step's first rows: the
    // decoder then runs on the rest of every row buffer.
    const bool leaves = r.kind == RowKind::kPrefill && r.pos < r.replay_start;
    if (leaves && staying_seen)
      return FB_ERROR(kUnsupported) << "bounded replay on CUDA: rows below replay_start must come before every other row of the step";
    staying_seen = staying_seen || !leaves;
    ++next[size_t(r.session)];
    max_pos = std::max(max_pos, r.pos);
  }
  if (step.rows.empty()) return model::StepOutput{};
  set_fp8_gemv_fma(run_.fp8_fma);  // process-wide switches: this executor's choice for its steps
  set_fast_gemv_occupancy(run_.fast_occupancy);
  FB_RETURN_IF_ERROR(rope_plain_.ensure(max_pos + 1, stream_));
  FB_RETURN_IF_ERROR(rope_yarn_.ensure(max_pos + 1, stream_));
  model::StepOutput out;
  const auto wall0 = std::chrono::steady_clock::now();
  {
    CudaStep ex(*this, step, ss, taps);
    FB_RETURN_IF_ERROR(ex.status());
    model::run_backbone(ex, cfg_);
    FB_RETURN_IF_ERROR(ex.status());
    out = ex.take_output();
    FB_RETURN_IF_ERROR(ex.status());
  }
  if (slots_) slots_->settle();
  if (profile_) {
    OpProfile& p = prof_["step.wall"];
    p.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
    ++p.calls;
  }
  return out;
}

// Batched over the n positions (rows are independent); ring slots shared by several positions
// keep the last, as the CPU's sequential loop does.
Status CudaExecutor::draft_commit(model::SessionState& state, int64_t first_pos, const uint16_t* tap_rows, int64_t n) {
  auto* s = dynamic_cast<CudaSession*>(&state);
  if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
  FB_RETURN_IF_ERROR(s->ensure_allocated(stream_));
  if (n <= 0 || cfg_.n_mtp_layers == 0) return Status();
  const Config& c = cfg_;
  const int64_t D = c.dim, hd = c.head_dim, G = int64_t(c.dspark_target_layer_ids.size()) * D, rb = hd + hd / 32;
  FB_RETURN_IF_ERROR(rope_plain_.ensure(first_pos + n, stream_));
  Status st;
  Arena arena(stream_, &ws_);
  std::vector<uint16_t> taps(tap_rows, tap_rows + n * G);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = first_pos + i;
  const uint16_t* x = arena.upload(taps, st);
  const int64_t* pos_d = arena.upload(pos, st);
  uint16_t* a = arena.alloc<uint16_t>(n * D, st);
  uint16_t* mx = arena.alloc<uint16_t>(n * D, st);
  uint16_t* t = arena.alloc<uint16_t>(n * hd, st);
  uint16_t* kv = arena.alloc<uint16_t>(n * hd, st);
  uint8_t* codes = arena.alloc<uint8_t>(n * rb, st);
  QuantBuf q;
  q.capacity = n * std::max(G, D);
  q.codes = arena.alloc<uint8_t>(q.capacity, st);
  q.scales = arena.alloc<float>(q.capacity / 32 + 1, st);
  FB_RETURN_IF_ERROR(st);
  FB_RETURN_IF_ERROR(fp8_gemm(x, n, draft_.main_proj, a, q, stream_));
  FB_RETURN_IF_ERROR(rms_norm(a, n, D, draft_.main_norm, c.norm_eps, mx, stream_));
  for (int stage = 0; stage < c.n_mtp_layers; ++stage) {
    const DevLayer& lw = layers_[size_t(c.n_layers + stage)];
    DevRing& ring = s->draft_rings[size_t(stage)];
    FB_RETURN_IF_ERROR(fp8_gemm(mx, n, lw.wkv, t, q, stream_));
    FB_RETURN_IF_ERROR(rms_norm(t, n, hd, lw.kv_norm, c.norm_eps, kv, stream_));
    FB_RETURN_IF_ERROR(rope(kv, n, 1, hd, c.rope_head_dim, pos_d, rope_plain_.cos.get<float>(), rope_plain_.sin.get<float>(), false, stream_));
    FB_RETURN_IF_ERROR(fp8_qdq(kv, n, hd, codes, rb, nullptr, stream_));
    std::map<int64_t, int64_t> last;  // slot -> row
    for (int64_t i = 0; i < n; ++i) {
      last[(first_pos + i) % ring.slots] = i;
      ring.pos[size_t((first_pos + i) % ring.slots)] = first_pos + i;
    }
    std::vector<uint64_t> src, dst;
    for (auto [slot, i] : last) {
      src.push_back(addr(codes + i * rb));
      dst.push_back(addr(ring.data.get<uint8_t>() + slot * ring.row_bytes));
    }
    const uint64_t* src_d = arena.upload(src, st);
    const uint64_t* dst_d = arena.upload(dst, st);
    FB_RETURN_IF_ERROR(st);
    FB_RETURN_IF_ERROR(copy_rows(src_d, dst_d, int64_t(src.size()), rb, stream_));
  }
  FB_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status();
}

Result<model::DraftOutput> CudaExecutor::draft(model::SessionState& state, int32_t anchor, const uint16_t* tap_row, int64_t p) {
  auto* s = dynamic_cast<CudaSession*>(&state);
  if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
  if (cfg_.n_mtp_layers == 0) return FB_ERROR(kUnsupported) << "this model has no DSpark stages";
  FB_RETURN_IF_ERROR(draft_commit(*s, p, tap_row, 1));
  FB_RETURN_IF_ERROR(rope_plain_.ensure(p + cfg_.dspark_block_size + 1, stream_));
  FB_RETURN_IF_ERROR(rope_yarn_.ensure(p + cfg_.dspark_block_size + 1, stream_));
  model::DraftOutput out;
  {
    CudaDraftStep ex(*this, *s, anchor, p);
    FB_RETURN_IF_ERROR(ex.status());
    model::run_draft(ex, cfg_);
    FB_RETURN_IF_ERROR(ex.status());
    out = ex.take_output();
  }
  return out;
}

}  // namespace fb::cuda
