// Tensor-core GEMMs for prefill steps: exact operand expansion to bf16, then cuBLASLt bf16 x bf16
// -> f32 matmuls (see tc_gemm.h for why this is the reference's arithmetic up to summation order).
#include "cuda/tc_gemm.h"

#include <atomic>

#include <cublasLt.h>

#include <string>

#include "base/check.h"
#include "cuda/numerics.cuh"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

std::atomic<bool> g_dequant_x32{true};  // CudaRunOptions::dequant_x32

constexpr size_t kWorkspaceBytes = size_t(64) << 20;

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  return FB_ERROR(kInternal) << what << ": cublasLt status " << int(s);
}
#define FB_LT_TRY(expr) FB_RETURN_IF_ERROR(lt_status((expr), #expr))

inline unsigned grid_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }
inline bool a16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Exact value of an act_quant code times its power-of-two scale, as bf16 (4 significant bits:
// exact). A NaN scale or code stays NaN.
__device__ __forceinline__ uint16_t exact_bf16(float code_value, float scale) { return to_bf(fm::mul(code_value, scale)); }

// Eight e4m3 codes times their scale, stored as eight bf16 (16 bytes).
__device__ __forceinline__ void store_e4m3x8(const uint8_t* c, float s, uint16_t* dst) {
  uint16_t v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = exact_bf16(e4m3_val(c[j]), s);
  store_bf16x8(dst, v);
}

// Thread per 8 elements of one output row.
__global__ void dequant_act_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales, int64_t K, const int32_t* __restrict__ src,
                                   int64_t src_div, int64_t n, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = K / 8;
  if (i >= n * per_row) return;
  const int64_t r = i / per_row, k0 = (i % per_row) * 8;
  const int64_t sr = (src ? int64_t(src[r]) : r) / src_div;
  const uint8_t* c = codes + sr * K + k0;
  const float s = scales[sr * (K / 32) + k0 / 32];
  store_e4m3x8(c, s, out + r * K + k0);
}

// FP8 [N, K] with e8m0 scales [ceil(N/32), K/32]: thread per 8 elements.
__global__ void dequant_fp8_kernel(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S, int64_t N, int64_t K, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = K / 8;
  if (i >= N * per_row) return;
  const int64_t n = i / per_row, k0 = (i % per_row) * 8;
  const float s = e8m0_val(S[(n / 32) * (K / 32) + k0 / 32]);
  const uint2 raw = *reinterpret_cast<const uint2*>(W + n * K + k0);
  store_e4m3x8(reinterpret_cast<const uint8_t*>(&raw), s, out + n * K + k0);
}

// MXFP4 packed [N, K/2] (element 2j in the low nibble) with e8m0 [N, K/32]: thread per 8 elements.
__global__ void dequant_fp4_kernel(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S, int64_t N, int64_t K, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = K / 8;
  if (i >= N * per_row) return;
  const int64_t n = i / per_row, k0 = (i % per_row) * 8;
  const float s = e8m0_val(S[n * (K / 32) + k0 / 32]);
  const uint32_t raw = *reinterpret_cast<const uint32_t*>(W + n * (K / 2) + k0 / 2);
  uint16_t v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = exact_bf16(e2m1_val(uint8_t((raw >> (4 * j)) & 0xF)), s);
  store_bf16x8(out + n * K + k0, v);
}

// The same expansion, thread per 32-block (one 16-byte load, one scale, four 16-byte stores) and
// no float arithmetic where it cannot round: for a scale byte e in [2, 252] every e2m1 value times
// 2^(e - 127) is a normal bf16 whose bits are the value's own with e - 127 added to the exponent
// (0.5 .. 6 have exponents 126 .. 129, so the result's lie in [1, 254]); the magnitude code m >= 1
// has bits 0x3F00 + 0x40 m, except m = 1 (0.5: 0x3F00); zeros keep their sign. Other scale bytes
// (e8m0 0, 1, 253, 254 and the NaN 255) take the float path of dequant_fp4_kernel: the same bits
// everywhere (test CudaOps.DequantFp4EveryScale).
__global__ void dequant_fp4_x32_kernel(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S, int64_t N, int64_t K,
                                       uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = K / 32;
  if (i >= N * per_row) return;
  const int64_t n = i / per_row, b = i - n * per_row;
  const uint8_t e = S[n * per_row + b];
  const uint4 raw = *reinterpret_cast<const uint4*>(W + n * (K / 2) + b * 16);
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[16];
  if (e >= 2 && e <= 252) {
    const uint32_t off = uint32_t((int(e) - 127) * 128);  // added modulo 2^32: a negative shift of the exponent field
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        uint32_t h[2];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const uint32_t c = (in[q] >> (4 * (j + t))) & 0xFu, m = c & 7u;
          const uint32_t mag = m == 0 ? 0u : ((0x3F00u + 0x40u * m - (m == 1 ? 0x40u : 0u) + off) & 0x7FFFu);
          h[t] = mag | ((c & 8u) << 12);
        }
        o[q * 4 + j / 2] = h[0] | (h[1] << 16);
      }
  } else {
    const float sc = e8m0_val(e);
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        const uint32_t lo = exact_bf16(e2m1_val(uint8_t((in[q] >> (4 * j)) & 0xF)), sc);
        const uint32_t hi = exact_bf16(e2m1_val(uint8_t((in[q] >> (4 * (j + 1))) & 0xF)), sc);
        o[q * 4 + j / 2] = lo | (hi << 16);
      }
  }
  uint4* dst = reinterpret_cast<uint4*>(out + n * K + b * 32);
#pragma unroll
  for (int q = 0; q < 4; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
}

// f = hi + mid + lo exactly (each a bf16; f32 has 24 significant bits).
__global__ void split_f32_bf16x3_kernel(const float* __restrict__ f, int64_t n, uint16_t* __restrict__ hi, uint16_t* __restrict__ mid,
                                        uint16_t* __restrict__ lo) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = f[i];
  const uint16_t h = to_bf(v);
  const float r1 = fm::add(v, -bf(h));  // exact: v and bf16(v) share the leading bits
  const uint16_t m = to_bf(r1);
  const float r2 = fm::add(r1, -bf(m));
  hi[i] = h;
  mid[i] = m;
  lo[i] = to_bf(r2);
}

__global__ void gather_f32_kernel(const float* __restrict__ v, const int32_t* __restrict__ idx, int64_t n, float* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v[idx[i]];
}

// Thread per 8 bf16 of a row.
__global__ void scatter_rows_kernel(const uint16_t* __restrict__ src, const int32_t* __restrict__ idx, int64_t n, int64_t cols,
                                    uint16_t* __restrict__ dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = cols / 8;
  if (i >= n * per_row) return;
  const int64_t r = i / per_row, c0 = (i % per_row) * 8;
  *reinterpret_cast<uint4*>(dst + int64_t(idx[r]) * cols + c0) = *reinterpret_cast<const uint4*>(src + r * cols + c0);
}

}  // namespace

// One matmul shape: descriptors and the heuristic's algorithm, reused across calls.
struct TcGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Result<std::unique_ptr<TcGemm>> TcGemm::create() {
  std::unique_ptr<TcGemm> t(new TcGemm());
  cublasLtHandle_t h = nullptr;
  FB_LT_TRY(cublasLtCreate(&h));
  t->handle_ = h;
  FB_RETURN_IF_ERROR(t->workspace_.alloc(kWorkspaceBytes));
  return std::move(t);
}

TcGemm::~TcGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Result<void*> TcGemm::scratch_bytes(int slot, size_t bytes, cudaStream_t st) {
  FB_CHECK(slot >= 0 && slot < kSlots);
  DeviceBuffer& b = scratch_[slot];
  bytes = std::max<size_t>(bytes, 16);
  if (b.bytes() < bytes) {
    FB_CUDA_TRY(cudaStreamSynchronize(st));
    FB_RETURN_IF_ERROR(b.alloc(bytes + bytes / 8));
  }
  return b.get<void>();
}

Result<uint16_t*> TcGemm::scratch(int slot, int64_t elems, cudaStream_t st) {
  void* p = FB_TRY(scratch_bytes(slot, size_t(std::max<int64_t>(elems, 1)) * 2, st));
  return static_cast<uint16_t*>(p);
}

Status TcGemm::matmul(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* d, int64_t ldd, GemmOut out,
                      int64_t G, int64_t gx, int64_t gw, int64_t gd, cudaStream_t st, bool w_kn) {
  if (M == 0 || N == 0 || G == 0) return Status();
  FB_CHECK(K > 0 && ldx >= K && ldd >= N && tc_gemm_shape_ok(x, w_kn ? N : K, ldx, gx, w, gw, d, ldd, gd, out))
      << "tc matmul M=" << M << " N=" << N << " K=" << K;
  auto lt = static_cast<cublasLtHandle_t>(handle_);
  const auto key = std::make_tuple(M, N, K, ldx, ldd, G, int(out), gx, gw, gd, int64_t(w_kn));
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    // Column-major view of the row-major problem: D^T [N, M] = W [N, K] . X^T [K, M], i.e.
    // A = W stored as a K x N column-major matrix (ld K) used transposed, B = X as K x M (ld ldx).
    // With w_kn, W [K, N] row-major is an N x K column-major matrix (ld N) used as it is.
    auto p = std::make_shared<Plan>();
    FB_LT_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FB_LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    FB_LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (w_kn) FB_LT_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, uint64_t(N), uint64_t(K), N));
    else FB_LT_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, uint64_t(K), uint64_t(N), K));
    FB_LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, uint64_t(K), uint64_t(M), ldx));
    FB_LT_TRY(cublasLtMatrixLayoutCreate(&p->lc, out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F, uint64_t(N), uint64_t(M), ldd));
    if (G > 1) {
      const int32_t g32 = int32_t(G);
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &g32, sizeof g32));
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &g32, sizeof g32));
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &g32, sizeof g32));
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &gw, sizeof gw));
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &gx, sizeof gx));
      FB_LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &gd, sizeof gd));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    FB_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = workspace_.bytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    // Operands are only promised 16-byte alignment (rows of experts' groups, column offsets).
    const uint32_t align = 16;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align);
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    FB_RETURN_IF_ERROR(lt_status(hs, "cublasLtMatmulAlgoGetHeuristic"));
    if (found == 0) return FB_ERROR(kInternal) << "cublasLt: no algorithm for M=" << M << " N=" << N << " K=" << K;
    p->algo = heur.algo;
    it = plans_.emplace(key, std::move(p)).first;
  }
  const Plan& p = *it->second;
  const float alpha = 1.0f, beta = out == GemmOut::kF32Add ? 1.0f : 0.0f;
  FB_LT_TRY(cublasLtMatmul(lt, p.op, &alpha, w, p.la, x, p.lb, &beta, d, p.lc, d, p.lc, &p.algo, workspace_.get<void>(), workspace_.bytes(), st));
  kprof_mark("cublasLtMatmul");
  return Status();
}

Status tc_dequant_act(const QuantBuf& q, int64_t K, const int32_t* src, int64_t src_div, int64_t n, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 32 == 0 && src_div >= 1);
  if (n == 0) return Status();
  return launch_op("tc_dequant_act_kernel", dequant_act_kernel, grid_for(n * (K / 8), 256), 256, 0, st, q.codes, q.scales, K, src, src_div, n, out);
}

Status tc_dequant_fp8(const Fp8W& w, uint16_t* out, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && (reinterpret_cast<uintptr_t>(w.w) & 7u) == 0);
  if (w.N == 0) return Status();
  return launch_op("tc_dequant_fp8_kernel", dequant_fp8_kernel, grid_for(w.N * (w.K / 8), 256), 256, 0, st, w.w, w.s, w.N, w.K, out);
}

void set_tc_dequant_x32(bool on) { g_dequant_x32.store(on, std::memory_order_relaxed); }

Status tc_dequant_fp4(const Fp4W& w, int64_t expert, uint16_t* out, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && (reinterpret_cast<uintptr_t>(w.w) & 3u) == 0 && w.w_stride % 4 == 0);
  if (w.N == 0) return Status();
  const uint8_t* wp = w.w + expert * w.w_stride;
  if (g_dequant_x32.load(std::memory_order_relaxed) && (reinterpret_cast<uintptr_t>(wp) & 15u) == 0 &&
      (reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
    return launch_op("tc_dequant_fp4_x32_kernel", dequant_fp4_x32_kernel, grid_for(w.N * (w.K / 32), 256), 256, 0, st, wp, w.s + expert * w.s_stride,
                     w.N, w.K, out);
  }
  return launch_op("tc_dequant_fp4_kernel", dequant_fp4_kernel, grid_for(w.N * (w.K / 8), 256), 256, 0, st, wp, w.s + expert * w.s_stride, w.N, w.K,
                   out);
}

Status tc_gather_f32(const float* v, const int32_t* idx, int64_t n, float* out, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("tc_gather_f32_kernel", gather_f32_kernel, grid_for(n, 256), 256, 0, st, v, idx, n, out);
}

Status tc_scatter_rows(const uint16_t* src, const int32_t* idx, int64_t n, int64_t cols, uint16_t* dst, cudaStream_t st) {
  FB_CHECK(cols % 8 == 0);
  if (n == 0) return Status();
  return launch_op("tc_scatter_rows_kernel", scatter_rows_kernel, grid_for(n * (cols / 8), 256), 256, 0, st, src, idx, n, cols, dst);
}

bool tc_gemm_shape_ok(const void* x, int64_t K, int64_t ldx, int64_t gx, const void* w, int64_t gw, const void* d, int64_t ldd, int64_t gd,
                      GemmOut out) {
  const int64_t d_el = out == GemmOut::kBf16 ? 8 : 4;  // elements per 16 bytes
  return a16(x) && a16(w) && a16(d) && K % 8 == 0 && ldx % 8 == 0 && gx % 8 == 0 && gw % 8 == 0 && ldd % d_el == 0 && gd % d_el == 0;
}

Status tc_hc_mixes(TcGemm& tc, const uint16_t* x, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale,
                   const float* base, int iters, float eps, HcMix* out, cudaStream_t st) {
  const int64_t n = int64_t(hc) * dim, n_mix = int64_t(2 + hc) * hc;
  if (T == 0) return Status();
  if (!tc_gemm_shape_ok(x, n, n, 0, fn, 0, x, n_mix, 0, GemmOut::kF32))  // odd widths: the CUDA-core kernels
    return hc_mixes(x, T, hc, dim, fn, norm_eps, scale, base, iters, eps, out, st);
  uint16_t* parts = static_cast<uint16_t*>(FB_TRY(tc.scratch_bytes(6, size_t(3 * n_mix * n) * 2, st)));
  float* dots = static_cast<float*>(FB_TRY(tc.scratch_bytes(7, size_t(T * n_mix) * 4, st)));
  split_f32_bf16x3_kernel<<<grid_for(n_mix * n, 256), 256, 0, st>>>(fn, n_mix * n, parts, parts + n_mix * n, parts + 2 * n_mix * n);
  FB_CUDA_LAUNCHED("tc_split_f32_bf16x3_kernel");
  for (int k = 0; k < 3; ++k)  // dots = x . hi, then += x . mid, += x . lo
    FB_RETURN_IF_ERROR(tc.matmul(x, T, n, n, parts + k * n_mix * n, n_mix, dots, n_mix, k == 0 ? GemmOut::kF32 : GemmOut::kF32Add, 1, 0, 0, 0, st));
  return hc_mixes_with_dots(x, T, hc, dim, dots, norm_eps, scale, base, iters, eps, out, st);
}

Status tc_fp8_gemm_q(TcGemm& tc, const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  if (M == 0 || w.N == 0) return Status();
  if (!tc_gemm_shape_ok(q.codes, w.K, w.K, 0, w.w, 0, y, w.N, 0, GemmOut::kBf16) || (reinterpret_cast<uintptr_t>(w.w) & 7u) != 0)
    return fp8_gemm_q(q, M, w, y, st);  // odd shapes: the CUDA-core kernel
  uint16_t* xb = FB_TRY(tc.scratch(3, M * w.K, st));
  uint16_t* wb = FB_TRY(tc.scratch(0, w.N * w.K, st));
  FB_RETURN_IF_ERROR(tc_dequant_act(q, w.K, nullptr, 1, M, xb, st));
  FB_RETURN_IF_ERROR(tc_dequant_fp8(w, wb, st));
  return tc.matmul(xb, M, w.K, w.K, wb, w.N, y, w.N, GemmOut::kBf16, 1, 0, 0, 0, st);
}

Status tc_fp8_gemm(TcGemm& tc, const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y, const QuantBuf& q, cudaStream_t st) {
  FB_RETURN_IF_ERROR(act_quant(x, M, w.K, q, st));
  return tc_fp8_gemm_q(tc, q, M, w, y, st);
}

Status tc_bf16_gemm(TcGemm& tc, const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                    int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st) {
  // cuBLASLt gets 16-byte aligned operands with leading dimensions in multiples of 16 bytes;
  // anything else takes the CUDA-core kernel (same results up to summation order).
  if (!tc_gemm_shape_ok(x, K, ldx, gx, w, gw, y, ldy, gy, out)) return bf16_gemm(x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st);
  return tc.matmul(x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st);
}

}  // namespace fb::cuda
