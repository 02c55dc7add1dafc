// CudaExecutor outside a step: the tensor-core GEMM object and the step workspace, the memory
// ledger by tier, the expert prefetch of a step's routing, and the prefill GEMM timings of
// `flashbox probe`. (Split from executor.cu, which keeps the step object and forward().)
#include "cuda/layer_ops.h"

#include <cstdio>

namespace fb::cuda {
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

Status CudaExecutor::reserve_workspace(uint64_t bytes) {
  if (ws_.busy) return FB_ERROR(kInvalidArgument) << "reserve_workspace during a step";
  ws_.dev.reset();
  ws_.dev_high = 0;
  Status st = ws_.dev.alloc(size_t(bytes));
  if (!st.ok()) {
    ws_.dev.reset();
    cudaGetLastError();  // reported here, not by the next launch
  }
  return st;
}

void CudaExecutor::release_step_memory() {
  ws_.dev.reset();
  ws_.dev_high = 0;
  if (tc_) tc_->release_scratch();
}

uint64_t CudaExecutor::tc_scratch_bytes() const { return tc_ ? tc_->scratch_held() : 0; }

model::MemoryByTier CudaExecutor::memory_by_tier(bool drives, uint64_t drive_bytes_read) const {
  model::MemoryByTier m;
  const CudaSessionRegistry::Totals live = sessions_->totals();
  m.has_hbm = true;
  model::TierMemory& d = m.hbm;
  for (const Owned& o : owned_) {
    const uint64_t n = o.buf.bytes();
    switch (o.held) {
      case Held::kWeights: d.weights += n; break;
      case Held::kWeightCopy: d.weight_copies += n; break;
      case Held::kTable: d.scratch += n; break;
    }
  }
  d.sessions = live.device_bytes;
  d.n_sessions = live.sessions;
  d.scratch += ws_.dev.bytes() + fast_hc_scratch_.bytes();
  for (const DevRope* r : {&rope_plain_, &rope_yarn_}) d.scratch += r->cos.bytes() + r->sin.bytes();
  if (tc_) d.scratch += tc_->scratch_held() + tc_->workspace_held();
  d.experts = slots_ ? slots_->device_bytes() : 0;

  m.has_host = true;
  model::TierMemory& h = m.host;
  h.weights = host_weight_bytes_ + (engram_source_ ? engram_source_->host_bytes() : 0);
  h.sessions = live.host_bytes;
  h.n_sessions = live.sessions;
  h.scratch = ws_.pin_cap;  // the page-locked staging of a step's uploads
  for (const DevRope* r : {&rope_plain_, &rope_yarn_}) h.scratch += uint64_t(r->table.freqs.size()) * sizeof(float);
  for (const model::EngramTableConstants& e : engram_)
    h.scratch += uint64_t(e.primes.size() + e.offsets.size() + e.multipliers.size()) * sizeof(int64_t);
  h.experts = slots_ ? slots_->source().host_bytes() : 0;

  // Drives: what the host tiers read for the routed experts, and the Engram rows the row cache read
  // (without one the tables stay in the mapping).
  m.has_drive = drives || engram_source_;
  m.drive.expert_bytes_read = drive_bytes_read;
  m.drive.has_engram = engram_source_ != nullptr;
  if (engram_source_) m.drive.engram_bytes_read = engram_source_->drive_bytes_read();
  return m;
}

bool CudaExecutor::prefetch_step(const model::Step& step) const {
  if (!run_.expert_prefetch || !slots_ || ws_.capturing || int64_t(step.rows.size()) < run_.expert_prefetch_min_rows) return false;
  for (const Row& r : step.rows)
    if (r.kind != RowKind::kPrefill) return false;  // decode and verify rows route to few experts
  if (prefetch_failed_) return false;
  if (slots_->prefetch_entries() > 0) return true;
  // A tiered source (one that counts its traffic: storage::TieredExperts) hands out views that
  // stay valid only until its next call for another layer, and the prefetch interleaves two
  // layers' calls while their copies are in flight; only sources whose views never expire (the
  // snapshot's mapped tensors, the bench's pinned pool) may be read a layer ahead for now.
  model::ExpertTraffic traffic;
  if (slots_->source().traffic(&traffic)) {
    std::fprintf(stderr, "cuda: expert prefetch off: the expert source's views expire between layers (host tiers)\n");
    prefetch_failed_ = true;
    return false;
  }
  // Staging once, on the first such step: a layer's experts beyond its slots (every expert a
  // large chunk routes to that is not resident), or the option's count.
  int entries = run_.expert_prefetch_entries;
  if (entries <= 0)
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (tiered(l)) entries = std::max(entries, cfg_.roles[size_t(l)].n_experts - slots_->slots(l));
  Status st;
  if (entries > 0) st = slots_->reserve_prefetch(entries);
  else st = FB_ERROR(kInvalidArgument) << "no tiered layer has experts beyond its slots";
  if (!st.ok()) {
    // Not enough HBM for two staging buffers: this executor prefills without prefetching (the
    // same outputs, serial copies); said once.
    std::fprintf(stderr, "cuda: expert prefetch off: %s\n", st.to_string().c_str());
    prefetch_failed_ = true;
    cudaGetLastError();  // an allocation failure must not stick to the next launch
    return false;
  }
  return true;
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

}  // namespace fb::cuda
