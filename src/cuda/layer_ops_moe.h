// Private to the CUDA executor (included at the end of layer_ops.h): CudaLayerOps' routed-expert
// ops, defined out of the class to keep each file short: the GEMV path over an expert array,
// the tiered path (HBM slot waves, the staging buffer, cold experts on the host) and the
// tensor-core prefill path. Their comments are at their declarations in layer_ops.h.
#pragma once

#include "cuda/layer_ops.h"

namespace fb::cuda {

inline void CudaLayerOps::routed_experts(const DevLayer& w, int64_t K, const int32_t* ids, const float* weights, uint16_t* a, uint16_t* b, uint16_t* ye,
                    int n_ids) {
  const int64_t D = c_.dim, I = c_.moe_inter_dim, n = T_ * K;
  if (m_.fast_gemv_) {
    // [fast] every (row, expert) pair on its own warps: row-invariant for any n. The kernels
    // take at most kFastGemvMaxRows rows a call; chunks keep whole activation rows (multiples of K).
    const int64_t step_rows = std::max<int64_t>(K, kFastGemvMaxRows / K * K);
    // CudaRunOptions::fp4_early_tiles: the w2 launch copies its tiles before its PDL wait (ops.h
    // ExpertPdl); needs the fused swiglu_quant (a PDL launch) between the two GEMV launches
    const bool early = m_.fp4_early_tiles_ && fast_small();
    for (int64_t m0 = 0; m0 < n && ok(); m0 += step_rows) {
      const int64_t m = std::min(step_rows, n - m0);
      // several tokens' rows: those sharing an expert share its reads (same bits; CudaRunOptions::group_expert_rows)
      step(fast_fp4_gemv2_q(rows_of(uq_, m0 / K, D), m, K, w.w1, w.w3, ids + m0, a + m0 * I, b + m0 * I, st_, m_.group_rows_ && m > K,
                            early ? ExpertPdl::kTriggerAfterWait : ExpertPdl::kPlain));
    }
    if (fast_small()) step(fast_swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));  // routing weight before w2
    else step(swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));
    for (int64_t m0 = 0; m0 < n && ok(); m0 += kFastGemvMaxRows) {
      const int64_t m = std::min(kFastGemvMaxRows, n - m0);
      // the first w2 launch follows swiglu_quant, which follows the last w1w3 launch
      step(fast_fp4_gemv_q(rows_of(q_buf_, m0, I), m, 1, w.w2, ids + m0, ye + m0 * D, st_, m_.group_rows_ && m > K,
                           early && m0 == 0 ? ExpertPdl::kIdsBeforeWait : ExpertPdl::kPlain));
    }
  } else {
    step(fp4_gemm2_q(uq_, n, K, w.w1, w.w3, ids, a, b, st_));
    step(swiglu_quant(a, b, n, I, c_.swiglu_limit, weights, q_buf_, st_));  // routing weight before w2
    step(fp4_gemm_q(q_buf_, n, 1, w.w2, ids, ye, st_));
  }
}

inline CudaLayerOps::HostRows CudaLayerOps::download_host_rows(const float* weights, int64_t n) {
  HostRows h;
  h.u.resize(size_t(T_ * c_.dim));
  h.weights.resize(size_t(n));
  download_parts_synced({DownPart{h.u.data(), u_, h.u.size() * 2}, DownPart{h.weights.data(), weights, size_t(n) * sizeof(float)}});
  return h;
}

inline std::vector<int32_t> CudaLayerOps::take_host(int l, const std::vector<int32_t>& ids, std::vector<int32_t>& want) {
  DevExpertSlots& slots = *m_.slots_;
  std::vector<int> rows(size_t(c_.roles[size_t(l)].n_experts), 0);
  for (int32_t e : ids) ++rows[size_t(e)];
  if (m_.run_.host_compute == 2) return slots.take_host(l, want, rows, 1.0, 0.0);
  const double copy_ms = double(slots.slot_bytes()) / 50e9 * 1e3;
  // The host's time a pair: as given, else as measured in this run's host batches (beside the
  // copies), starting from the calibration of one expert alone.
  const double host_ms = m_.run_.host_compute_us > 0 ? double(m_.run_.host_compute_us) * 1e-3
                                                     : slots.host_pair_ms(m_.host_experts_->ms_per_expert(c_.dim, c_.moe_inter_dim));
  return slots.take_host(l, want, rows, copy_ms, host_ms);
}

inline CudaLayerOps::HostJobs CudaLayerOps::host_jobs(int l, int64_t K, const std::vector<int32_t>& ids, const HostRows& h,
                                                     const std::vector<int32_t>& host_want) {
  const int64_t D = c_.dim;
  HostJobs hj;
  hj.experts = host_want.size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (std::binary_search(host_want.begin(), host_want.end(), ids[i])) hj.pairs.push_back(i);
  hj.out.resize(hj.pairs.size() * size_t(D));
  const model::ExpertSource& src = m_.slots_->source();
  for (size_t j = 0; j < hj.pairs.size(); ++j) {
    const size_t i = hj.pairs[j];
    hj.jobs.push_back({h.u.data() + (int64_t(i) / K) * D, src.expert(l, ids[i]), h.weights[i], hj.out.data() + j * size_t(D)});
  }
  return hj;
}

inline void CudaLayerOps::run_host_jobs(HostJobs& hj, uint16_t* ye) {
  const int64_t D = c_.dim;
  const auto t0 = std::chrono::steady_clock::now();
  m_.host_experts_->run(hj.jobs, c_.swiglu_limit);
  m_.slots_->note_host(hj.experts, hj.pairs.size(), std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  uint16_t* dev = upload(hj.out);
  for (size_t j = 0; j < hj.pairs.size() && ok(); ++j) copy_d2d(ye + int64_t(hj.pairs[j]) * D, dev + int64_t(j) * D, D * 2);
}

template <typename F, typename G>
void CudaLayerOps::routed_experts_tiered(int l, const DevLayer& w, int64_t K, const std::vector<int32_t>& ids, const float* weights, uint16_t* a, uint16_t* b,
                           uint16_t* ye, F& shared, G& ahead) {
  DevExpertSlots& slots = *m_.slots_;
  std::vector<int32_t> want = distinct(ids);
  std::vector<int32_t> staged_want = take_staged(l, want);
  slots.resident_first(l, want);
  const std::vector<int32_t> host_want = host_compute_on() ? take_host(l, ids, want) : std::vector<int32_t>{};
  const HostRows host = host_want.empty() ? HostRows{} : download_host_rows(weights, int64_t(ids.size()));
  const int E = c_.roles[size_t(l)].n_experts;
  std::vector<int32_t> slot_of(size_t(E), -1);
  // The staged experts as one more wave over the staging buffer's arrays (after the hits).
  auto run_staged = [&] {
    const DevExpertSlots::Staged* g = staged_for(l);
    if (!g) return;
    if (!staged_want.empty()) {
      shared();
      step(slots.join_staged(l, st_));
      std::vector<int32_t> wave(ids.size(), -1);
      for (size_t i = 0; i < ids.size(); ++i) wave[i] = g->entry_of[size_t(ids[i])];
      routed_experts(staging_layer(w, *g), K, upload(wave), weights, a, b, ye, slots.prefetch_entries());
    }
    step(slots.done_staged(l, st_, staged_want.size()));
  };
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
    if (from == 0) run_staged();
    from = *next;
  }
  if (want.empty()) run_staged();
  // The host's expert views are taken before ahead() may start the next layer's calls.
  HostJobs hj = host_want.empty() || !ok() ? HostJobs{} : host_jobs(l, K, ids, host, host_want);
  ahead();
  if (!host_want.empty() && ok()) {
    shared();
    run_host_jobs(hj, ye);
  }
}

template <typename F>
void CudaLayerOps::routed_experts_tc(int l, const DevLayer& w, int E, int64_t K, const std::vector<int32_t>& ids, const float* weights, uint16_t* ye,
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
  const std::vector<int32_t> staged_want = tiered ? take_staged(l, want) : std::vector<int32_t>{};
  if (tiered) m_.slots_->resident_first(l, want);
  std::vector<int32_t> slot_of(size_t(E), -1);
  // Experts list[i0..i1), ascending and consecutive among the used ones, so their rows are the
  // contiguous range [count[list[i0]], count[list[i1 - 1] + 1]): w1 / w3, SwiGLU + act_quant of
  // the range (per row, so any split gives the same bits), w2. `wl`: the arrays slot_of indexes
  // (the layer's experts or slots, or its staging buffer).
  auto run_list = [&](const std::vector<int32_t>& list, const DevLayer& wl, size_t i0, size_t i1) {
    for (size_t i = i0; i < i1 && ok(); ++i) {
      const int e = list[i];
      const int64_t off = count[size_t(e)], m = count[size_t(e) + 1] - off;
      step(tc_dequant_fp4(wl.w1, slot_of[size_t(e)], *w1, st_));
      step(tc_dequant_fp4(wl.w3, slot_of[size_t(e)], *w3, st_));
      step(tc_->matmul(xp + off * D, m, D, D, *w1, I, ap + off * I, I, GemmOut::kBf16, 1, 0, 0, 0, st_));
      step(tc_->matmul(xp + off * D, m, D, D, *w3, I, bp + off * I, I, GemmOut::kBf16, 1, 0, 0, 0, st_));
    }
    const int64_t r0 = count[size_t(list[i0])], r1 = count[size_t(list[i1 - 1]) + 1];
    step(swiglu_quant(ap + r0 * I, bp + r0 * I, r1 - r0, I, c_.swiglu_limit, wp + r0, q_buf_, st_));  // routing weight before w2
    step(tc_dequant_act(q_buf_, I, nullptr, 1, r1 - r0, hp + r0 * I, st_));
    for (size_t i = i0; i < i1 && ok(); ++i) {
      const int e = list[i];
      const int64_t off = count[size_t(e)], m = count[size_t(e) + 1] - off;
      step(tc_dequant_fp4(wl.w2, slot_of[size_t(e)], *w2, st_));
      step(tc_->matmul(hp + off * I, m, I, I, *w2, D, yp + off * D, D, GemmOut::kBf16, 1, 0, 0, 0, st_));
    }
  };
  auto run = [&](size_t i0, size_t i1) { run_list(want, w, i0, i1); };
  // The staged experts (prefetch_), each alone like a wave's, after the hits of the first wave.
  auto run_staged = [&] {
    const DevExpertSlots::Staged* g = staged_for(l);
    if (!g) return;
    if (!staged_want.empty()) {
      shared();
      step(m_.slots_->join_staged(l, st_));
      for (int32_t e : staged_want) slot_of[size_t(e)] = g->entry_of[size_t(e)];
      const DevLayer ws = staging_layer(w, *g);
      for (size_t i = 0; i < staged_want.size() && ok(); ++i) run_list(staged_want, ws, i, i + 1);
    }
    step(m_.slots_->done_staged(l, st_, staged_want.size()));
  };
  if (!tiered) {
    for (int32_t e : want) slot_of[size_t(e)] = e;
    if (!want.empty()) run(0, want.size());
  }
  // A tiered layer (w's arrays are its slots): waves of at most its slots, resident experts
  // first; each expert runs alone, since a wave's experts are no longer consecutive.
  // With prefetch_, each slot's last read is marked, so a later wave's copy into it waits for
  // that expert alone (DevExpertSlots::take per_slot), not for the whole wave before it.
  for (size_t from = 0; tiered && from < want.size() && ok();) {
    auto next = m_.slots_->take(l, want, from, slot_of, st_, prefetch_);
    if (!next.ok()) {
      step(next.status());
      return;
    }
    if (from == 0) shared();
    step(m_.slots_->join(st_));
    for (size_t i = from; i < *next && ok(); ++i) {
      run(i, i + 1);
      if (prefetch_) step(m_.slots_->mark_read(l, slot_of[size_t(want[i])], st_));
    }
    m_.slots_->release(l);
    if (from == 0) run_staged();
    from = *next;
  }
  if (tiered && want.empty()) run_staged();
  step(tc_scatter_rows(yp, perm_d, n, D, ye, st_));
}

}  // namespace fb::cuda
