// Tensor-core GEMMs for prefill steps [reference-defining]: the block-scaled FP8 / MXFP4 / bf16
// GEMMs of ops.h computed as bf16 x bf16 -> f32 matmuls on Hopper tensor cores (cuBLASLt).
//
// Why this is the reference's arithmetic up to summation order: every operand is first expanded
// to its exact value. An act_quant code times its power-of-two scale, an e4m3 weight times its
// e8m0 block scale and an e2m1 weight times its e8m0 scale each have at most 4 significant bits, so
// all of them are exact bf16 numbers (bf16 has f32's exponent range). Every product x_k * w_k is
// then the reference's product, and the matmul differs from cpu::fp8_gemm / fp4_gemm only in how
// the f32 sum over k is ordered and rounded inside the tensor cores: spec/11 §0 lists that order
// as an irreducible point. The bf16 GEMMs take their operands as they are. Outputs are rounded
// to bf16 (or kept f32) exactly where the CUDA-core launchers round them.
//
// Not bit-identical to the CPU reference, so the executor uses it only for steps made of prefill
// rows (decode and verify rows always take the exact GEMV kernels: DSpark's greedy identity
// compares decode rows only). Tolerance and measurements: docs/numerics.md, docs/history.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "base/status.h"
#include "cuda/device.h"
#include "cuda/ops.h"

namespace fb::cuda {

class TcGemm {
 public:
  static Result<std::unique_ptr<TcGemm>> create();
  ~TcGemm();
  TcGemm(const TcGemm&) = delete;
  TcGemm& operator=(const TcGemm&) = delete;

  // G strided groups of D [M, N] = X [M, K] . W [N, K]^T, row-major: x + g*gx (row stride ldx),
  // w + g*gw (row stride K), d + g*gd (row stride ldd); elements, not bytes. kF32Add adds the
  // product to the f32 D already there.
  // w_kn: W is stored [K, N] row-major instead (D = X . W).
  Status matmul(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* d, int64_t ldd, GemmOut out, int64_t G,
                int64_t gx, int64_t gw, int64_t gd, cudaStream_t st, bool w_kn = false);

  // Scratch owned by the GEMM object, grown on demand. Growing synchronises the stream first
  // (earlier kernels may still read the old buffer). Callers use one slot per operand that must
  // stay alive across the calls they make: 0..3 the GEMM launchers and the routed experts,
  // 4..7 tc_sparse_attention.
  static constexpr int kSlots = 8;
  Result<uint16_t*> scratch(int slot, int64_t elems, cudaStream_t st);
  Result<void*> scratch_bytes(int slot, size_t bytes, cudaStream_t st);
  // Device bytes the scratch slots hold now (memory::prefill_step_bytes counts them as `tc`), and
  // freeing them (the next use grows them again), for a caller that sizes its steps from free HBM.
  size_t scratch_held() const {
    size_t n = 0;
    for (const DeviceBuffer& b : scratch_) n += b.bytes();
    return n;
  }
  void release_scratch() {
    for (DeviceBuffer& b : scratch_) b.reset();
  }
  // Device bytes of the cuBLASLt workspace, held from create() on (the executor's memory ledger).
  size_t workspace_held() const { return workspace_.bytes(); }

 private:
  TcGemm() = default;
  struct Plan;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  DeviceBuffer scratch_[kSlots];
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t>, std::shared_ptr<Plan>> plans_;
};

// Whether a matmul's operands meet cuBLASLt's 16-byte alignment (pointers, leading dimensions and
// group strides); launchers fall back to the CUDA-core kernels when not.
bool tc_gemm_shape_ok(const void* x, int64_t K, int64_t ldx, int64_t gx, const void* w, int64_t gw, const void* d, int64_t ldd, int64_t gd,
                      GemmOut out);

// y [M, N] bf16 = act_quant codes q . W^T (fp8_gemm_q's result up to summation order).
Status tc_fp8_gemm_q(TcGemm& tc, const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st);
// act_quant(x) into q, then tc_fp8_gemm_q (fp8_gemm's result up to summation order).
Status tc_fp8_gemm(TcGemm& tc, const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y, const QuantBuf& q, cudaStream_t st);
// bf16_gemm on tensor cores (same arguments).
Status tc_bf16_gemm(TcGemm& tc, const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                    int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st);

// Sparse attention with a sink (cpu::sparse_attention, spec/11 §1.7) for the rows of a prefill
// step: per row its keys gathered as exact bf16 values (64-key blocks in list order, empty
// entries zero), the 64 x n scores of all heads as one batched matmul, the CPU's online-softmax
// sequence per (row, head) over the blocks (block max, alpha, p, bf16(p), the p-sum in j order,
// the sink), each block's P.V sums as a batched matmul, and the fold acc = acc * alpha_b + S_b in
// block order. [reference-defining]: the reference's own kernel forms the dots on tensor cores;
// only the order inside the dots and the P.V sums differs from the CPU. Needs keys.max_keys.
Status tc_sparse_attention(TcGemm& tc, const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale,
                           uint16_t* out, cudaStream_t st);

// Index scores (ops.h index_scores) of a prefill step: per run of rows sharing one session's
// index keys, the keys' exact bf16 values once, every (row, head) dot as one matmul rounded to
// bf16 (the CPU's round_bf16(d)), then the CPU's chain per (row, entry): relu, times the head
// weight (bf16), summed over heads in order, bf16. [reference-defining]: only the order inside
// the 128-term dots differs. keys_base_host / n_vis_host / n_scored_host: the host copies of
// the device lists (grouping and launch sizes).
Status tc_index_scores(TcGemm& tc, const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const std::vector<uint64_t>& keys_base_host,
                       const std::vector<int64_t>& n_vis_host, const std::vector<int64_t>& n_scored_host, int64_t key_bytes, const int64_t* n_vis,
                       const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask = nullptr, int64_t mask_ld = 0,
                       const int64_t* mask_len = nullptr);

// mHC mixes (ops.h hc_mixes) of a prefill step: the f32 weights fn split exactly into three bf16
// parts (fn = hi + mid + lo: 8 + 8 + 8 significant bits), so x . fn = x . hi + x . mid + x . lo
// with every product exact; three tensor-core matmuls accumulate into the dots, then the squares'
// sum, the scaling and Sinkhorn exactly as the CPU (hc_mixes_with_dots). [reference-defining]:
// only the summation order and the two extra f32 roundings of the three partial sums differ.
Status tc_hc_mixes(TcGemm& tc, const uint16_t* x, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale,
                   const float* base, int iters, float eps, HcMix* out, cudaStream_t st);

// ---- pieces of the grouped (by expert) MXFP4 path ----------------------------------------------
// out [n, K] bf16: row i = exact value of act_quant row src[i] / src_div (src == nullptr: row i).
Status tc_dequant_act(const QuantBuf& q, int64_t K, const int32_t* src, int64_t src_div, int64_t n, uint16_t* out, cudaStream_t st);
// out [N, K] bf16 = exact values of an FP8 32x32-block weight / of expert e's MXFP4 weight.
Status tc_dequant_fp8(const Fp8W& w, uint16_t* out, cudaStream_t st);
Status tc_dequant_fp4(const Fp4W& w, int64_t expert, uint16_t* out, cudaStream_t st);
// tc_dequant_fp4 by 32-blocks (one 16-byte load and four 16-byte stores a thread, integer exponent
// arithmetic where the scale keeps every value a normal bf16) when the expert's codes and `out` are
// 16-byte aligned; off, a thread per 8 elements in float arithmetic. The same bits either way.
// Process-wide, set from CudaRunOptions::dequant_x32.
void set_tc_dequant_x32(bool on);
// out[i] = v[idx[i]] (f32).
Status tc_gather_f32(const float* v, const int32_t* idx, int64_t n, float* out, cudaStream_t st);
// dst[idx[i], :] = src[i, :] (bf16 rows of `cols`).
Status tc_scatter_rows(const uint16_t* src, const int32_t* idx, int64_t n, int64_t cols, uint16_t* dst, cudaStream_t st);

}  // namespace fb::cuda
