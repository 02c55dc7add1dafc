// Routed experts computed on the host, where their bytes already are (issue 22): (row, expert)
// jobs with every expert's output rows split over the thread pool, the CPU reference's bits (the
// row split changes nothing of any output's sum). `flashbox probe` measures it to plan cold
// experts on the host beside copies over PCIe; the CUDA executor runs a tiered layer's chosen
// misses through it (CudaRunOptions::host_expert_compute).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "model/weights.h"

namespace fb::cpu {

// ye [D] = w2 . (SwiGLU(w1 . u, w3 . u) x weight): the CPU executor's expert for one row
// (layer_ops.h), on every thread of the pool.
void expert_one_token(const uint16_t* u, const model::ExpertWeights& ex, float swiglu_limit, float weight, uint16_t* ye);

using HostExpertJob = model::HostExpertJob;

// Every job as expert_one_token computes it, in two passes over the pool (w1 and w3 of every job,
// then w2 of every job): each activation row is quantised once and a batch pays two wake-ups of
// the pool, not three per job. parallel = false: on the calling thread alone (the probe's
// one-thread rate). Jobs of one batch share D and I.
void experts_on_host(const std::vector<HostExpertJob>& jobs, float swiglu_limit, bool parallel = true);

// model::HostExpertCompute by experts_on_host on the process's pool; ms_per_expert measured on
// first use per shape (measure_host_experts, ~0.3 s) and kept.
std::shared_ptr<const model::HostExpertCompute> host_expert_compute();

struct HostExpertRate {
  double ms_per_expert = 0;  // one token through one expert, median
  double ms_one_thread = 0;  // the same on the calling thread alone
  double pool_us = 0;        // an empty parallel_for over the pool (its wake-up and join), median
  double weight_bytes = 0;   // an expert's weight and scale bytes
  int threads = 0;
  bool simd = false;         // the AVX-512 kernels ran (block_gemm_simd.h)
  double bytes_per_s() const { return ms_per_expert > 0 ? weight_bytes / (ms_per_expert * 1e-3) : 0; }
};

// Random experts of the given dimensions (n_experts of them, cycled so that their bytes come
// from memory rather than the caches), one token each, for about `seconds`.
HostExpertRate measure_host_experts(int64_t D, int64_t I, int n_experts, double seconds);

}  // namespace fb::cpu
