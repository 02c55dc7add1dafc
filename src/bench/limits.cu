#include "bench/limits.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace fb::bench {

namespace {

Status cu(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  return Status(StatusCode::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}
Status lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  return Status(StatusCode::kInternal, std::string(what) + ": cublasLt status " + std::to_string(int(s)));
}
#define FB_CU(x) FB_RETURN_IF_ERROR(cu((x), #x))
#define FB_LT(x) FB_RETURN_IF_ERROR(lt((x), #x))

// Fills with pseudo-random bytes (never time on zeros).
__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = x & 0x3F3F3F3Fu;  // keeps fp8/bf16 values finite and moderate
  }
}

template <typename F>
Result<double> median_ms(int reps, F&& body) {
  cudaEvent_t a, b;
  FB_CU(cudaEventCreate(&a));
  FB_CU(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) FB_RETURN_IF_ERROR(body());
  FB_CU(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    FB_CU(cudaEventRecord(a));
    FB_RETURN_IF_ERROR(body());
    FB_CU(cudaEventRecord(b));
    FB_CU(cudaEventSynchronize(b));
    float ms = 0;
    FB_CU(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return double(t[t.size() / 2]);
}

Result<double> gemm_tflops(int reps, cudaDataType_t in_type, size_t elem) {
  const int64_t n = 8192;
  void *A = nullptr, *B = nullptr, *D = nullptr, *ws = nullptr;
  const size_t ws_bytes = 64 << 20;
  FB_CU(cudaMalloc(&A, n * n * elem));
  FB_CU(cudaMalloc(&B, n * n * elem));
  FB_CU(cudaMalloc(&D, n * n * 2));
  FB_CU(cudaMalloc(&ws, ws_bytes));
  fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(A), n * n * elem / 4, 1);
  fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(B), n * n * elem / 4, 2);
  cublasLtHandle_t h;
  FB_LT(cublasLtCreate(&h));
  cublasLtMatmulDesc_t op;
  FB_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // FP8 needs the "TN" layout: A transposed.
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  FB_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  FB_LT(cublasLtMatrixLayoutCreate(&la, in_type, n, n, n));
  FB_LT(cublasLtMatrixLayoutCreate(&lb, in_type, n, n, n));
  FB_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  FB_LT(cublasLtMatmulPreferenceCreate(&pref));
  FB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  FB_LT(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &heur, &found));
  if (found == 0) return FB_ERROR(kUnsupported) << "cuBLASLt found no GEMM algorithm";
  const float alpha = 1.0f, beta = 0.0f;
  auto ms = median_ms(reps, [&]() -> Status {
    return lt(cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, D, lc, D, lc, &heur.algo, ws, ws_bytes, 0), "cublasLtMatmul");
  });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
  cudaFree(A);
  cudaFree(B);
  cudaFree(D);
  cudaFree(ws);
  if (!ms.ok()) return ms.status();
  return 2.0 * double(n) * n * n / (*ms * 1e-3) / 1e12;
}

}  // namespace

Result<DeviceInfo> device_info() {
  DeviceInfo d;
  int dev = 0;
  FB_CU(cudaGetDevice(&dev));
  cudaDeviceProp p;
  FB_CU(cudaGetDeviceProperties(&p, dev));
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.hbm_gib = double(p.totalGlobalMem) / double(1ull << 30);
  FB_CU(cudaDriverGetVersion(&d.driver_version));
  FB_CU(cudaRuntimeGetVersion(&d.runtime_version));
  int clk = 0, mclk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev);
  d.sm_clock_mhz = clk / 1000;
  d.mem_clock_mhz = mclk / 1000;
  return d;
}

Result<Limits> measure_limits(int reps) {
  Limits L;
  const size_t bytes = size_t(4) << 30;
  void *a = nullptr, *b = nullptr;
  FB_CU(cudaMalloc(&a, bytes));
  FB_CU(cudaMalloc(&b, bytes));
  fill_kernel<<<2048, 256>>>(static_cast<uint32_t*>(a), bytes / 4, 7);
  auto d2d = median_ms(reps, [&]() -> Status { return cu(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "d2d"); });
  if (!d2d.ok()) return d2d.status();
  L.d2d_gbps = 2.0 * double(bytes) / (*d2d * 1e-3) / 1e9;
  const size_t hbytes = size_t(1) << 30;
  void* pinned = nullptr;
  FB_CU(cudaMallocHost(&pinned, hbytes));
  std::memset(pinned, 0x35, hbytes);
  auto h2d = median_ms(reps, [&]() -> Status { return cu(cudaMemcpyAsync(b, pinned, hbytes, cudaMemcpyHostToDevice), "h2d"); });
  if (!h2d.ok()) return h2d.status();
  L.h2d_pinned_gbps = double(hbytes) / (*h2d * 1e-3) / 1e9;
  cudaFreeHost(pinned);
  std::vector<uint8_t> pageable(hbytes, 0x35);
  auto h2dp = median_ms(3, [&]() -> Status { return cu(cudaMemcpy(b, pageable.data(), hbytes, cudaMemcpyHostToDevice), "h2d pageable"); });
  if (!h2dp.ok()) return h2dp.status();
  L.h2d_pageable_gbps = double(hbytes) / (*h2dp * 1e-3) / 1e9;
  cudaFree(a);
  cudaFree(b);
  auto bf = gemm_tflops(reps, CUDA_R_16BF, 2);
  if (bf.ok()) L.bf16_tflops = *bf;
  auto f8 = gemm_tflops(reps, CUDA_R_8F_E4M3, 1);
  if (f8.ok()) L.fp8_tflops = *f8;
  return L;
}

}  // namespace fb::bench
