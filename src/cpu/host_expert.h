// Routed experts computed on the host, where their bytes already are (issue 22): one token
// through one expert with the expert's output rows split over the thread pool, the CPU
// reference's bits (the row split changes nothing of any output's sum). What `flashbox probe`
// measures to plan cold experts on the host beside copies over PCIe; the CUDA executor does not
// call it yet.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "model/weights.h"

namespace fb::cpu {

// ye [D] = w2 . (SwiGLU(w1 . u, w3 . u) x weight): the CPU executor's expert for one row
// (layer_ops.h), on every thread of the pool.
void expert_one_token(const uint16_t* u, const model::ExpertWeights& ex, float swiglu_limit, float weight, uint16_t* ye);

struct HostExpertRate {
  double ms_per_expert = 0;  // one token through one expert, median
  double weight_bytes = 0;   // an expert's weight and scale bytes
  int threads = 0;
  bool simd = false;         // the AVX-512 kernels ran (block_gemm_simd.h)
  double bytes_per_s() const { return ms_per_expert > 0 ? weight_bytes / (ms_per_expert * 1e-3) : 0; }
};

// Random experts of the given dimensions (n_experts of them, cycled so that their bytes come
// from memory rather than the caches), one token each, for about `seconds`.
HostExpertRate measure_host_experts(int64_t D, int64_t I, int n_experts, double seconds);

}  // namespace fb::cpu
