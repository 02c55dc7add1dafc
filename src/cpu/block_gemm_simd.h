// The block-scaled GEMMs of the CPU reference (cpu::fp8_gemm, cpu::fp4_gemm) by AVX-512, the same
// bits: each lane of a vector is one 32-element block of an output row, and every lane runs the
// reference's operations in the reference's order (the two 16-term half sums sequential from
// zero, the scaled block sum added into accumulator b mod 16, butterfly16 at the end), so
// vectorising across blocks reorders nothing [exact]. Used by fp8_gemm / fp4_gemm when the CPU
// has AVX-512F, BW and VL; the scalar loops stay the definition (tests compare the two bit for bit).
//
// Why: a routed expert at the released dimensions is 35.4 M MXFP4 weights; the scalar loop takes
// ~18 ms a token on one thread (these kernels 2.9 ms), too slow for computing cold experts on the
// host where their bytes already are (issue 22).
#pragma once

#include <cstdint>

namespace fb::cpu::simd {

// Whether the vector kernels run here (AVX-512F/BW/VL on this CPU, and not switched off).
bool enabled();
// Tests and A/B: force the scalar reference (false) or allow the vector kernels (true, default).
void set_enabled(bool on);

// One activation row quantised by act_quant (values: the e4m3 value of each code, K of them;
// scales: K / 32 powers of two), laid out for the kernels: groups of 16 blocks, element i of the
// group's block l at [g * 512 + i * 16 + l], blocks past K / 32 zero.
struct QuantRowT {
  int64_t K = 0, KB = 0, groups = 0;
  float* values = nullptr;  // [groups * 512], 64-byte aligned
  float* scales = nullptr;  // [groups * 16]
  QuantRowT() = default;
  QuantRowT(const QuantRowT&) = delete;
  QuantRowT& operator=(const QuantRowT&) = delete;
  ~QuantRowT();
  void set(const float* values_k, const float* scales_kb, int64_t K);
};

// y[n - n0] for output rows [n0, n1): exactly fp4_gemm's values for the row q (W packed e2m1
// [N, K / 2], S e8m0 [N, K / 32]).
void fp4_rows(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, uint16_t* y);
// The same for fp8_gemm (W e4m3 [N, K], S e8m0 [ceil(N / 32), K / 32]: one scale per 32 x 32).
void fp8_rows(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, uint16_t* y);
// The f32 sums before the bf16 rounding (tests: a reordered sum rarely survives the rounding).
void fp4_rows_f32(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, float* y);
void fp8_rows_f32(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, float* y);

// An f32 row x laid out for lanes32 dots with bf16 weight rows (the LM head): fm::lanes32_sum
// gives term k to lane (k / 8) mod 32, so lane l sums k = 256 c + 8 l + j in (c, j) order; here
// [c * 256 + j * 32 + l] = x[256 c + 8 l + j], zero past D.
struct Lanes32Row {
  int64_t D = 0, chunks = 0;
  float* t = nullptr;  // [chunks * 256], 64-byte aligned
  Lanes32Row() = default;
  Lanes32Row(const Lanes32Row&) = delete;
  Lanes32Row& operator=(const Lanes32Row&) = delete;
  ~Lanes32Row();
  void set(const float* x, int64_t D);
};

// fm::lanes32_sum(D, mul(x[k], bf16 w[k])) exactly: each vector lane is one of the 32 lanes and
// adds its terms in the scalar loop's order (masked past D), then the same butterfly. D % 8 == 0.
float lanes32_dot_bf16(const Lanes32Row& x, const uint16_t* w);

}  // namespace fb::cpu::simd
