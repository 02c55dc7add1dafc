// CudaExecutor loading: validation (as cpu::CpuModel::load), then every weight uploaded to HBM in
// its stored format; routed experts of a layer packed into contiguous [E, ...] buffers.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "base/check.h"
#include "base/dtype.h"
#include "base/progress.h"
#include "cuda/executor.h"
#include "cuda/fast_attention.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_small.h"
#include "cuda/rs_gemv.h"
#include "cuda/tc_gemv.h"

#include "loader/bind.h"
#include "model/fp8_weight.h"
#include "vision/tower.h"

namespace fb::cuda {

using model::Config;

// ---- options ---------------------------------------------------------------------------------------

const char* numerics_name(Numerics n) { return n == Numerics::kExact ? "exact" : "fast"; }

Result<Numerics> parse_numerics(const std::string& s) {
  if (s == "exact") return Numerics::kExact;
  if (s == "fast") return Numerics::kFast;
  return FB_ERROR(kInvalidArgument) << "numerics must be exact or fast (got \"" << s << "\")";
}

Status set_run_option(CudaRunOptions& o, const std::string& name, const std::string& value) {
  if (name.find('+') != std::string::npos) {  // several options moved together: a+b = 1+0
    auto split = [](const std::string& s) {
      std::vector<std::string> out;
      size_t from = 0;
      for (size_t p; (p = s.find('+', from)) != std::string::npos; from = p + 1) out.push_back(s.substr(from, p - from));
      out.push_back(s.substr(from));
      return out;
    };
    const auto names = split(name), values = split(value);
    if (names.size() != values.size())
      return FB_ERROR(kInvalidArgument) << "options " << name << " take " << names.size() << " values joined by '+' (got \"" << value << "\")";
    CudaRunOptions t = o;  // all or nothing
    for (size_t i = 0; i < names.size(); ++i) FB_RETURN_IF_ERROR(set_run_option(t, names[i], values[i]));
    o = t;
    return Status();
  }
  auto flag = [&](bool& b) -> Status {
    if (value != "0" && value != "1") return FB_ERROR(kInvalidArgument) << "option " << name << " takes 0 or 1 (got \"" << value << "\")";
    b = value == "1";
    return Status();
  };
  // an integer in [lo, hi] into out
  auto integer = [&](long long lo, long long hi, auto& out) -> Status {
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end || v < lo || v > hi)
      return FB_ERROR(kInvalidArgument) << "option " << name << " takes an integer in [" << lo << ", " << hi << "] (got \"" << value << "\")";
    out = static_cast<std::remove_reference_t<decltype(out)>>(v);
    return Status();
  };
  if (name == "numerics") {
    o.numerics = FB_TRY(parse_numerics(value));
    return Status();
  }
  if (name == "tc_prefill_min_rows") return integer(1, std::numeric_limits<int64_t>::max(), o.tc_prefill_min_rows);
  if (name == "tc_prefill") return flag(o.tc_prefill);
  if (name == "tc_hc_mixes") return flag(o.tc_hc_mixes);
  if (name == "tc_route") return flag(o.tc_route);
  if (name == "fast_gemv") return flag(o.fast_gemv);
  if (name == "fast_occupancy") return flag(o.fast_occupancy);
  if (name == "tc_gemv") return flag(o.tc_gemv);
  if (name == "fast_small") return flag(o.fast_small);
  if (name == "pdl") return flag(o.pdl);
  if (name == "overlap") return flag(o.overlap);
  if (name == "fp8_fma") return flag(o.fp8_fma);
  if (name == "fast_attn") return flag(o.fast_attn);
  if (name == "attn_fuse_rope") return flag(o.attn_fuse_rope);
  if (name == "wo_a_fp8") return flag(o.wo_a_fp8);
  if (name == "tc_async_scales") return flag(o.tc_async_scales);
  if (name == "tc_lean_smem") return flag(o.tc_lean_smem);
  if (name == "tc_global_fold") return flag(o.tc_global_fold);
  if (name == "tc_cluster_fold_ctas") return integer(0, std::numeric_limits<int64_t>::max(), o.tc_cluster_fold_ctas);
  if (name == "tc_lean_loop") return flag(o.tc_lean_loop);
  if (name == "tc_stripes") return integer(0, 64, o.tc_stripes);
  if (name == "fast_index") return flag(o.fast_index);
  if (name == "group_expert_rows") return flag(o.group_expert_rows);
  if (name == "attn_heads_per_cta") return integer(1, 16, o.attn_heads_per_cta);
  if (name == "attn_split") return flag(o.attn_split);
  if (name == "attn_predequant") return flag(o.attn_predequant);
  if (name == "bounded_replay") return flag(o.bounded_replay);
  if (name == "expert_prefetch") return flag(o.expert_prefetch);
  if (name == "defer_hc_post") return flag(o.defer_hc_post);
  if (name == "defer_combine") return flag(o.defer_combine);
  if (name == "fp4_early_tiles") return flag(o.fp4_early_tiles);
  if (name == "early_uploads") return flag(o.early_uploads);
  if (name == "markov_step") return flag(o.markov_step);
  if (name == "dequant_x32") return flag(o.dequant_x32);
  if (name == "sm_uploads") return flag(o.sm_uploads);
  if (name == "reuse_staging") return flag(o.reuse_staging);
  if (name == "pinned_ids") return flag(o.pinned_ids);
  if (name == "expert_prefetch_min_rows") return integer(1, 1ll << 30, o.expert_prefetch_min_rows);
  if (name == "expert_prefetch_entries") return integer(0, 1ll << 30, o.expert_prefetch_entries);
  if (name == "engram_prefetch_tasks") return integer(0, 64, o.engram_prefetch_tasks);
  if (name == "rs_gemv") return integer(0, 2, o.rs_gemv);
  if (name == "host_compute") return integer(0, 2, o.host_compute);
  if (name == "host_compute_us") return integer(0, std::numeric_limits<int64_t>::max(), o.host_compute_us);
  if (name == "expert_predict") return flag(o.expert_predict);
  if (name == "expert_predict_max") return integer(1, 1024, o.expert_predict_max);
  if (name == "rs_group_ctas") return integer(1, 64, o.rs_group_ctas);
  if (name == "rs_group_rows") {
    if (value != "4" && value != "8") return FB_ERROR(kInvalidArgument) << "option rs_group_rows takes 4 or 8 (got \"" << value << "\")";
    o.rs_group_rows = value == "8" ? 8 : 4;
    return Status();
  }
  return FB_ERROR(kInvalidArgument) << "unknown CUDA option \"" << name
                                    << "\" (numerics, tc_prefill, tc_prefill_min_rows, tc_hc_mixes, tc_route, fast_gemv, fast_occupancy, tc_gemv, fast_small, pdl, overlap, fp8_fma, "
                                       "fast_attn, attn_heads_per_cta, attn_fuse_rope, wo_a_fp8, tc_async_scales, tc_lean_smem, tc_global_fold, tc_cluster_fold_ctas, tc_lean_loop, tc_stripes, fast_index, group_expert_rows, attn_split, attn_predequant, bounded_replay, expert_prefetch, "
                                       "expert_prefetch_min_rows, expert_prefetch_entries, engram_prefetch_tasks, rs_gemv, rs_group_rows, rs_group_ctas, defer_hc_post, defer_combine, fp4_early_tiles, early_uploads, markov_step, dequant_x32, reuse_staging, pinned_ids, sm_uploads, "
                                       "host_compute, host_compute_us, expert_predict, expert_predict_max)";
}

void CudaExecutor::set_run_options(const CudaRunOptions& o) {
  run_ = o;
  const bool fast = o.numerics == Numerics::kFast;
  // The exact class keeps every output the CPU's bits: no tensor cores, no reordered sums.
  tc_on_ = fast && o.tc_prefill;
  tc_min_rows_ = std::max<int64_t>(1, o.tc_prefill_min_rows);
  tc_hc_mixes_ = fast && o.tc_hc_mixes;
  tc_route_ = fast && o.tc_route;
  fast_gemv_ = fast && o.fast_gemv;
  set_fp8_gemv_fma(o.fp8_fma);  // exact either way (same bits)
  set_fast_gemv_occupancy(o.fast_occupancy);  // process-wide, same bits either way
  set_fast_gemv_tc(o.tc_gemv);                // process-wide; only the fast class calls these GEMVs
  set_tc_async_scales(o.tc_async_scales);     // process-wide, same bits either way
  set_tc_lean_smem(o.tc_lean_smem);           // process-wide, same bits either way
  set_tc_global_fold(o.tc_global_fold);       // process-wide, same bits either way
  set_tc_cluster_fold_ctas(o.tc_cluster_fold_ctas);  // likewise
  set_tc_lean_loop(o.tc_lean_loop);           // process-wide, same bits either way
  set_tc_stripes(o.tc_stripes, 2);            // likewise (grouped MXFP4 launches only)
  fast_attention_set_heads_per_cta(o.attn_heads_per_cta);  // process-wide, like the above
  fast_small_ = fast && o.fast_small;
  fast_attn_ = fast && o.fast_attn;
  attn_fuse_rope_ = o.attn_fuse_rope;
  wo_a_fp8_ = fast && o.wo_a_fp8;
  fast_index_ = fast && o.fast_index;
  group_rows_ = o.group_expert_rows;
  overlap_ = fast && o.overlap;
  defer_hc_post_ = fast && o.defer_hc_post;
  defer_combine_ = defer_hc_post_ && o.defer_combine;
  fp4_early_tiles_ = fast && o.fp4_early_tiles;
  early_uploads_ = o.early_uploads;
  markov_step_ = o.markov_step;  // same bits either way, both classes
  set_fast_pdl(fast && o.pdl);  // process-wide; launches only (same bits either way)
}

// ---- loading -------------------------------------------------------------------------------------

CudaExecutor::CudaExecutor(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map)
    : snap_(std::move(snap)),
      cfg_(snap_->config()),
      model_id_(loader::model_identity(*snap_)),
      w_(loader::bind_weights(*snap_)),
      token_map_(std::move(token_map)) {
  const Config& c = cfg_;
  if (!c.engram_layer_ids.empty()) {
    engram_ = model::engram_constants(c.engram_layer_ids, c.engram_vocab_size, c.engram_max_ngram, c.engram_n_heads,
                                      c.engram_compressed_vocab);
    pad_class_ = token_map_.at(size_t(c.engram_pad_id));
  }
  rope_plain_.table = model::make_rope_table(c.rope_head_dim, c.rope_theta, false, 1.0, 0, c.beta_fast, c.beta_slow);
  rope_yarn_.table =
      model::make_rope_table(c.rope_head_dim, c.compress_rope_theta, true, c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow);
}

CudaExecutor::~CudaExecutor() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  rs_clear_packed();  // copies of this executor's weights (a later allocation may reuse their addresses)
  if (side_) {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
  }
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
}

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::load(const std::string& dir, std::vector<int32_t> token_map, CudaLoadOptions opt) {
  auto snap = FB_TRY(loader::Snapshot::open(dir));
  return from_snapshot(std::move(snap), std::move(token_map), std::move(opt));
}

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::from_snapshot(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map,
                                                                CudaLoadOptions opt) {
  if (opt.expert_slots < 0) return FB_ERROR(kInvalidArgument) << "expert slots per layer must be >= 0 (got " << opt.expert_slots << ")";
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) return FB_ERROR(kUnsupported) << "no CUDA device is visible";
  FB_RETURN_IF_ERROR(loader::check_runnable(*snap, &token_map));
  std::unique_ptr<CudaExecutor> ex(new CudaExecutor(std::move(snap), std::move(token_map)));
  FB_CUDA_TRY(cudaStreamCreateWithFlags(&ex->stream_, cudaStreamNonBlocking));
  FB_CUDA_TRY(cudaStreamCreateWithFlags(&ex->side_, cudaStreamNonBlocking));
  FB_CUDA_TRY(cudaEventCreateWithFlags(&ex->fork_, cudaEventDisableTiming));
  FB_CUDA_TRY(cudaEventCreateWithFlags(&ex->join_, cudaEventDisableTiming));
  ex->set_run_options(opt.run);
  FB_RETURN_IF_ERROR(ex->upload_weights(opt));
  return Result<std::unique_ptr<CudaExecutor>>(std::move(ex));
}

template <typename T>
Result<const T*> CudaExecutor::up(const TensorView& v, Held held) {
  if (!v.valid()) return static_cast<const T*>(nullptr);
  DeviceBuffer b;
  FB_RETURN_IF_ERROR(b.alloc(v.nbytes()));
  FB_CUDA_TRY(cudaMemcpy(b.get(), v.data, v.nbytes(), cudaMemcpyHostToDevice));
  const T* p = b.get<T>();
  owned_.push_back({std::move(b), held});
  return p;
}

Result<Fp8W> CudaExecutor::up8(const model::Fp8Linear& l) {
  Fp8W d;
  if (!l.w.valid()) return d;
  d.w = FB_TRY(up<uint8_t>(l.w));
  d.s = FB_TRY(up<uint8_t>(l.scale));
  d.N = l.w.dim(0);
  d.K = l.w.dim(1);
  return d;
}

// Routed experts of one layer into three contiguous [E, ...] buffers (+ scales).
Status CudaExecutor::up_experts(int l, DevLayer& d) {
  const int E = cfg_.roles[size_t(l)].n_experts;
  if (E == 0) return Status();
  loader::SnapshotExperts src(*snap_);
  auto pack = [&](auto pick, Fp4W& out) -> Status {
    const model::Fp4Linear first = pick(src.expert(l, 0));
    const size_t wb = first.w.nbytes(), sb = first.scale.nbytes();
    std::vector<uint8_t> w(wb * size_t(E)), s(sb * size_t(E));
    for (int e = 0; e < E; ++e) {
      const model::Fp4Linear x = pick(src.expert(l, e));
      FB_CHECK(x.w.nbytes() == wb && x.scale.nbytes() == sb) << "expert shapes differ in layer " << l;
      std::copy(x.w.data, x.w.data + wb, w.begin() + ptrdiff_t(wb * size_t(e)));
      std::copy(x.scale.data, x.scale.data + sb, s.begin() + ptrdiff_t(sb * size_t(e)));
    }
    DeviceBuffer bw, bs;
    FB_RETURN_IF_ERROR(bw.alloc(w.size()));
    FB_RETURN_IF_ERROR(bs.alloc(s.size()));
    FB_CUDA_TRY(cudaMemcpy(bw.get(), w.data(), w.size(), cudaMemcpyHostToDevice));
    FB_CUDA_TRY(cudaMemcpy(bs.get(), s.data(), s.size(), cudaMemcpyHostToDevice));
    out.w = bw.get<uint8_t>();
    out.s = bs.get<uint8_t>();
    out.N = first.w.dim(0);
    out.K = first.w.dim(1) * 2;
    out.w_stride = int64_t(wb);
    out.s_stride = int64_t(sb);
    owned_.push_back({std::move(bw), Held::kWeights});  // the experts' stored bytes, packed
    owned_.push_back({std::move(bs), Held::kWeights});
    return Status();
  };
  FB_RETURN_IF_ERROR(pack([](const model::ExpertWeights& x) { return x.w1; }, d.w1));
  FB_RETURN_IF_ERROR(pack([](const model::ExpertWeights& x) { return x.w2; }, d.w2));
  FB_RETURN_IF_ERROR(pack([](const model::ExpertWeights& x) { return x.w3; }, d.w3));
  return Status();
}

Status CudaExecutor::upload_weights(const CudaLoadOptions& opt) {
  uint64_t table_bytes = 0;
  for (const model::LayerWeights& lw : w_.layers)
    if (lw.engram_table.valid()) table_bytes += uint64_t(lw.engram_table.nbytes() + lw.engram_table_scale.nbytes());
  engram_host_ = table_bytes > 0 && (opt.engram == EngramPlace::kHost || opt.engram_rows ||
                                     (opt.engram == EngramPlace::kAuto && table_bytes > kEngramHbmMaxBytes));
  if (engram_host_) engram_source_ = opt.engram_rows;
  if (opt.expert_slots > 0) {
    std::shared_ptr<const model::ExpertSource> src = opt.experts;
    if (!src) src = std::make_shared<loader::SnapshotExperts>(*snap_);
    slots_ = FB_TRY(DevExpertSlots::create(cfg_, std::move(src), opt.expert_slots, opt.policy, opt.expert_staging, opt.lfu_aging));
    host_experts_ = opt.host_compute;
  }
  // Progress on a terminal (issue 24): the host-to-device copies and the expert packing, by layer
  // (the drive reads before them have their own line, "load weights", engine/executor_factory.cpp).
  Progress progress("upload weights", cfg_.n_total_layers(), "layers");
  embed_ = FB_TRY(up<uint16_t>(w_.embed));
  norm_ = FB_TRY(up<uint16_t>(w_.norm));
  head_ = FB_TRY(up<uint16_t>(w_.head));
  layers_.resize(size_t(cfg_.n_total_layers()));
  for (int l = 0; l < cfg_.n_total_layers(); ++l) {
    progress.update(l);
    const model::LayerWeights& w = w_.layers[size_t(l)];
    DevLayer& d = layers_[size_t(l)];
    // Every tensor of the layer through the one list (model::for_each_layer_tensor), stored
    // formats kept, but for wo_a: the reference dequantises it to BF16 at load; so do we (exact).
    // Engram tables that stay on the host are not copied.
    auto one = [&](const auto& h, auto& dv) -> Status {
      using H = std::decay_t<decltype(h)>;
      using Dv = std::decay_t<decltype(dv)>;
      if constexpr (std::is_same_v<Dv, Fp8W>) {
        dv = FB_TRY(up8(h));
      } else if constexpr (std::is_same_v<H, model::Fp8Linear>) {  // wo_a
        static_assert(std::is_same_v<Dv, const uint16_t*>, "an FP8 linear lands as Fp8W or as its BF16 copy");
        std::vector<uint16_t> wa = model::dequant_fp8_weight(h.w, h.scale);
        TensorView v{DType::kBF16, {int64_t(wa.size())}, reinterpret_cast<const uint8_t*>(wa.data())};
        dv = FB_TRY(up<uint16_t>(v, Held::kWeightCopy));
      } else {
        const void* at = &h;
        if (engram_host_ && (at == &w.engram_table || at == &w.engram_table_scale)) return Status();
        dv = FB_TRY(up<std::remove_const_t<std::remove_pointer_t<Dv>>>(h));
      }
      return Status();
    };
    Status st;
    model::for_each_layer_tensor(
        [&](const char*, model::Presence, const auto& h, auto& dv) {
          if (st.ok()) st = one(h, dv);
        },
        w, d);
    FB_RETURN_IF_ERROR(st);
    // [fast] the checkpoint's FP8 wo_a as well: decode rows read half the bytes (tc_gemv.h
    // tc_fp8_bf16x_gemv, the same bf16 values); the BF16 copy stays for prefill and the exact class.
    if (opt.run.numerics == Numerics::kFast && opt.run.wo_a_fp8 && w.wo_a.w.valid()) d.wo_a8 = FB_TRY(up8(w.wo_a));
    if (tiered(l)) {  // routed experts live in the slots, filled on demand
      d.w1 = slots_->w1(l);
      d.w2 = slots_->w2(l);
      d.w3 = slots_->w3(l);
    } else {
      FB_RETURN_IF_ERROR(up_experts(l, d));
      // Resident experts may take the register-streamed GEMVs (CudaRunOptions::rs_gemv; packed on first use).
      for (const Fp4W* f : {&d.w1, &d.w2, &d.w3}) rs_register_experts(f->w, cfg_.roles[size_t(l)].n_experts);
    }
  }
  if (cfg_.n_mtp_layers > 0) {
    draft_.main_proj = FB_TRY(up8(w_.draft.main_proj));
    draft_.main_norm = FB_TRY(up<uint16_t>(w_.draft.main_norm));
    draft_.norm = FB_TRY(up<uint16_t>(w_.draft.norm));
    draft_.markov_embed = FB_TRY(up<uint16_t>(w_.draft.markov_embed));
    draft_.markov_head = FB_TRY(up<uint16_t>(w_.draft.markov_head));
    draft_.confidence = FB_TRY(up<uint16_t>(w_.draft.confidence));
  }
  progress.update(cfg_.n_total_layers());
  if (cfg_.has_vision()) FB_RETURN_IF_ERROR(upload_vision());
  progress.finish();
  // The memory ledger's host weights: what steps keep reading from the mapping after the upload
  // (counted once here; a tiered source's own buffers are its host_bytes(), not these).
  for (const model::LayerWeights& lw : w_.layers)
    if (engram_host_ && !engram_source_ && lw.engram_table.valid())
      host_weight_bytes_ += uint64_t(lw.engram_table.nbytes() + lw.engram_table_scale.nbytes());
  if (slots_ && dynamic_cast<const loader::SnapshotExperts*>(&slots_->source()))
    for (int l = 0; l < cfg_.n_total_layers(); ++l)
      for (int e = 0; tiered(l) && e < cfg_.roles[size_t(l)].n_experts; ++e) {
        const model::ExpertWeights x = slots_->source().expert(l, e);
        for (const model::Fp4Linear* f : {&x.w1, &x.w2, &x.w3}) host_weight_bytes_ += uint64_t(f->w.nbytes() + f->scale.nbytes());
      }
  if (cfg_.has_vision())  // the image span markers (image_span_markers reads them on the host)
    for (const TensorView* t : {&w_.vision.image_start, &w_.vision.image_end, &w_.vision.image_newline})
      host_weight_bytes_ += uint64_t(t->nbytes());
  return Status();
}

// The vision tower (cuda/vision.cu): bf16 weights as stored, norm weights as f32 (the CPU tower's
// f32 copies), and the GELU table of every bf16 input built with vision::gelu_erf_bf16.
Status CudaExecutor::upload_vision() {
  const model::VisionWeights& v = w_.vision;
  auto up_f32 = [&](const TensorView& t) -> Result<const float*> {
    if (!t.valid()) return static_cast<const float*>(nullptr);
    std::vector<float> f(size_t(t.numel()));
    if (t.dtype == DType::kF32) {
      std::copy(t.as<float>(), t.as<float>() + t.numel(), f.begin());
    } else {
      if (t.dtype != DType::kBF16) return FB_ERROR(kCorrupt) << "vision norm weight dtype " << dtype_name(t.dtype);
      for (int64_t i = 0; i < t.numel(); ++i) f[size_t(i)] = bf16_to_f32(t.as<uint16_t>()[i]);
    }
    TensorView fv{DType::kF32, {int64_t(f.size())}, reinterpret_cast<const uint8_t*>(f.data())};
    // f32 as stored is the tensor itself; widened from bf16 it is a form of our own (twice the bytes).
    return up<float>(fv, t.dtype == DType::kF32 ? Held::kWeights : Held::kWeightCopy);
  };
  vision_.patch_w = FB_TRY(up<uint16_t>(v.patch_w));
  vision_.patch_b = FB_TRY(up<uint16_t>(v.patch_b));
  for (const auto& b : v.blocks) {
    DevVision::Block d;
    d.norm1 = FB_TRY(up_f32(b.norm1));
    d.norm2 = FB_TRY(up_f32(b.norm2));
    d.wqkv_w = FB_TRY(up<uint16_t>(b.wqkv_w));
    d.wqkv_b = FB_TRY(up<uint16_t>(b.wqkv_b));
    d.wo_w = FB_TRY(up<uint16_t>(b.wo_w));
    d.wo_b = FB_TRY(up<uint16_t>(b.wo_b));
    d.w1 = FB_TRY(up<uint16_t>(b.w1));
    d.w2 = FB_TRY(up<uint16_t>(b.w2));
    vision_.blocks.push_back(d);
  }
  vision_.norm = FB_TRY(up_f32(v.norm));
  vision_.al_w1 = FB_TRY(up<uint16_t>(v.aligner_w1));
  vision_.al_b1 = FB_TRY(up<uint16_t>(v.aligner_b1));
  vision_.al_w2 = FB_TRY(up<uint16_t>(v.aligner_w2));
  vision_.al_b2 = FB_TRY(up<uint16_t>(v.aligner_b2));
  std::vector<uint16_t> lut(65536);
  for (uint32_t i = 0; i < 65536; ++i) lut[i] = vision::gelu_erf_bf16(uint16_t(i));
  TensorView lv{DType::kBF16, {65536}, reinterpret_cast<const uint8_t*>(lut.data())};
  vision_.gelu = FB_TRY(up<uint16_t>(lv, Held::kTable));
  return Status();
}

}  // namespace fb::cuda
