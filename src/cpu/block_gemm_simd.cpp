#include "cpu/block_gemm_simd.h"

// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_* placeholders).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "base/check.h"
#include "base/dtype.h"
#include "base/fmath.h"

// The ISA of the vector kernels (checked at run time by cpu_has_avx512).
#define FB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace fb::cpu::simd {

namespace {

std::atomic<bool> g_enabled{true};
constexpr int kRows = 2;  // output rows interleaved by the kernels (R = 2, 3, 4 measured: 2 best)

// The e2m1 values as vpermps's table (the reference's own decode fills it).
struct E2m1Table {
  alignas(64) float v[16];
  E2m1Table() {
    for (int i = 0; i < 16; ++i) v[i] = e2m1_to_f32(uint8_t(i));
  }
};
const E2m1Table& e2m1_table() {
  static const E2m1Table t;
  return t;
}

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
}

float* alloc_floats(int64_t n) {
  void* p = std::aligned_alloc(64, size_t(std::max<int64_t>(n, 16)) * sizeof(float));
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

// The e8m0 values of the group's 16 scale bytes (zeros past the valid ones): 2^(b - 127) is the
// f32 with exponent field b for b in 1..254; b = 0 gives 2^-127, a subnormal; 255 is NaN (the
// values e8m0_to_f32 gives, checked against it by the tests).
FB_AVX512 inline __m512 e8m0_values(const uint8_t* s, int valid) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(__mmask16(valid == 16 ? 0xFFFF : (1u << valid) - 1), s));
  static const int nan_bits = int(bits_from_f32(e8m0_to_f32(255)));
  __m512i v = _mm512_slli_epi32(b, 23);
  v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
  v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)), _mm512_set1_epi32(nan_bits));
  return _mm512_castsi512_ps(v);
}

// The reference's last steps for one output row: the group's scaled block sum t added into the
// accumulators of its valid lanes (b mod 16 = lane).
FB_AVX512 inline __m512 add_group(__m512 acc, __mmask16 valid, __m512 h0, __m512 h1, const float* qs, const uint8_t* s, int n_valid) {
  const __m512 scale = _mm512_mul_ps(_mm512_load_ps(qs), e8m0_values(s, n_valid));  // mul(qs[b], e8m0(S))
  const __m512 t = _mm512_mul_ps(_mm512_add_ps(h0, h1), scale);
  return _mm512_mask_add_ps(acc, valid, acc, t);
}

FB_AVX512 inline float finish(__m512 acc) {
  alignas(64) float a[16];
  _mm512_store_ps(a, acc);
  return fm::butterfly16(a);
}

// The group's 256 weight bytes (16 blocks of 16) of one row as 4 vectors: out[d] lane l = dword d
// of block l (bytes 4d .. 4d + 3: elements 8d .. 8d + 7, element 2j in byte j's low nibble).
// Contiguous masked loads (nothing read past the valid blocks), then a 4 x 4 transpose of dwords
// within 128-bit lanes across the loads.
FB_AVX512 inline void fp4_group_dwords(const uint8_t* base, int n_valid, __m512i (&out)[4]) {
  __m512i z[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const int blocks = std::max(0, std::min(4, n_valid - 4 * k));
    z[k] = _mm512_maskz_loadu_epi32(__mmask16((1u << (4 * blocks)) - 1), base + 64 * k);
  }
  // a01: dword 0 of blocks 0..7 in lanes 0..7, dword 1 of blocks 0..7 in lanes 8..15 (from z[0],
  // z[1]); b01 the same for blocks 8..15 (z[2], z[3]); a23 / b23 likewise dwords 2 and 3.
  const __m512i lo = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i hi = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i a01 = _mm512_permutex2var_epi32(z[0], lo, z[1]), b01 = _mm512_permutex2var_epi32(z[2], lo, z[3]);
  const __m512i a23 = _mm512_permutex2var_epi32(z[0], hi, z[1]), b23 = _mm512_permutex2var_epi32(z[2], hi, z[3]);
  // blocks 0..7 from a, 8..15 from b: the low 256 bits of each for the first d, the high for the second.
  out[0] = _mm512_shuffle_i64x2(a01, b01, 0x44);  // a.lo, b.lo
  out[1] = _mm512_shuffle_i64x2(a01, b01, 0xEE);  // a.hi, b.hi
  out[2] = _mm512_shuffle_i64x2(a23, b23, 0x44);
  out[3] = _mm512_shuffle_i64x2(a23, b23, 0xEE);
}

// MXFP4 rows (W packed e2m1 [N, K / 2], one e8m0 scale per row and block): a group's words are
// fp4_group_dwords' 4 vectors; element i is nibble i % 8 of word i / 8, its value from the
// 16-entry table (vpermps reads only the index's low 4 bits: the nibble, without masking).
struct Fp4Format {
  using Words = __m512i[4];
  __m512 lut;
  FB_AVX512 Fp4Format() : lut(_mm512_load_ps(e2m1_table().v)) {}
  FB_AVX512 static void load(const uint8_t* W, int64_t n, int64_t K, int64_t g, int n_valid, __mmask16, Words& w) {
    fp4_group_dwords(W + n * (K / 2) + g * 256, n_valid, w);
  }
  FB_AVX512 __m512 value(const Words& w, int i) const {
    const __m512i code = i % 8 == 0 ? w[i / 8] : _mm512_srli_epi32(w[i / 8], unsigned(4 * (i % 8)));
    return _mm512_permutexvar_ps(code, lut);
  }
  static int64_t scale_row(int64_t n) { return n; }
};

// Exact e4m3 values of the low byte of each lane (e4m3_to_f32's, NaN included), without
// subnormal arithmetic (slow on x86): a normal code's f32 is its bits moved into place with the
// exponent rebased (+120); a zero-exponent code is m x 2^-9 by an exact conversion and product;
// the sign bit moved over; 0x7F and 0xFF give NaN (its sign is not kept: every NaN rounds to bf16
// 0x7FC0).
FB_AVX512 inline __m512 e4m3_values(__m512i b, __m512 nan_value) {
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
  __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
  const __mmask16 sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  v = _mm512_mask_mul_ps(v, sub, _mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
  v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24)));
  return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)), nan_value);
}

// FP8 rows (W e4m3 [N, K], one e8m0 scale per 32 x 32): a group's words are dword j of each
// 32-byte block (gathered), element i is byte i % 4 of word i / 4.
struct Fp8Format {
  using Words = __m512i[8];
  __m512 nan_value;
  FB_AVX512 Fp8Format() : nan_value(_mm512_set1_ps(e4m3_to_f32(0x7F))) {}
  FB_AVX512 static void load(const uint8_t* W, int64_t n, int64_t K, int64_t g, int, __mmask16 valid, Words& w) {
    const __m512i block32 = _mm512_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448, 480);
    const uint8_t* base = W + n * K + g * 512;  // 16 blocks of 32 bytes
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      w[j] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, _mm512_add_epi32(block32, _mm512_set1_epi32(4 * j)), base, 1);
  }
  FB_AVX512 __m512 value(const Words& w, int i) const {
    const __m512i code = i % 4 == 0 ? w[i / 4] : _mm512_srli_epi32(w[i / 4], unsigned(8 * (i % 4)));
    return e4m3_values(_mm512_and_si512(code, _mm512_set1_epi32(0xFF)), nan_value);
  }
  static int64_t scale_row(int64_t n) { return n / 32; }
};

// R output rows at once: their 2R half-sum chains are independent, so the adds' latency hides
// behind each other (one row alone waits on one dependent add after another).
template <typename Fmt, int R>
FB_AVX512 inline void group_rows(const Fmt& f, const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n, float* y) {
  const int64_t K = q.K, KB = q.KB;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < q.groups; ++g) {
    const int n_valid = int(std::min<int64_t>(16, KB - 16 * g));
    const __mmask16 valid = n_valid == 16 ? __mmask16(0xFFFF) : __mmask16((1u << n_valid) - 1);
    const float* qv = q.values + g * 512;
    __m512 h0[R], h1[R];
    typename Fmt::Words w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      h0[r] = h1[r] = _mm512_setzero_ps();
      Fmt::load(W, n + r, K, g, n_valid, valid, w[r]);
    }
#pragma GCC unroll 32
    for (int i = 0; i < 32; ++i) {
      const __m512 x = _mm512_load_ps(qv + i * 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_mul_ps(x, f.value(w[r], i));
        if (i < 16) h0[r] = _mm512_add_ps(h0[r], p);
        else h1[r] = _mm512_add_ps(h1[r], p);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = add_group(acc[r], valid, h0[r], h1[r], q.scales + g * 16, S + Fmt::scale_row(n + r) * KB + g * 16, n_valid);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) y[r] = finish(acc[r]);
}

template <typename Fmt>
FB_AVX512 void rows_avx512(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, float* y) {
  const Fmt f;
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) group_rows<Fmt, kRows>(f, q, W, S, n, y + (n - n0));
  for (; n < n1; ++n) group_rows<Fmt, 1>(f, q, W, S, n, y + (n - n0));
}

// lane l of the 32 (two vectors of 16), element j of chunk c: the bf16 at 256 c + 8 l + j. The
// dword gather at 2 (8 l + j) bytes brings elements j and j + 1 of each lane (low, high half);
// D is a multiple of 8, so a lane has all 8 elements of a chunk or none (masked: no read, no add).
FB_AVX512 float lanes32_dot_bf16_avx512(const Lanes32Row& x, const uint16_t* w) {
  const __m512i lane8 = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);  // bytes of 8 l
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t c = 0; c < x.chunks; ++c) {
    const float* xt = x.t + c * 256;
    const uint8_t* base = reinterpret_cast<const uint8_t*>(w + c * 256);
    const int64_t lanes = std::min<int64_t>(32, (x.D - c * 256) / 8);  // lanes with elements in this chunk
    const __mmask16 m[2] = {__mmask16(lanes >= 16 ? 0xFFFF : (1u << lanes) - 1), __mmask16(lanes <= 16 ? 0 : lanes >= 32 ? 0xFFFF : (1u << (lanes - 16)) - 1)};
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m[h], _mm512_add_epi32(lane8, _mm512_set1_epi32(2 * j + 256 * h)), base, 1);
        const __m512 wa = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)), wb = _mm512_castsi512_ps(_mm512_and_si512(d, hi));
        v[h] = _mm512_mask_add_ps(v[h], m[h], v[h], _mm512_mul_ps(_mm512_load_ps(xt + j * 32 + 16 * h), wa));
        v[h] = _mm512_mask_add_ps(v[h], m[h], v[h], _mm512_mul_ps(_mm512_load_ps(xt + (j + 1) * 32 + 16 * h), wb));
      }
    }
  }
  alignas(64) float a[32];
  _mm512_store_ps(a, v[0]);
  _mm512_store_ps(a + 16, v[1]);
  return fm::butterfly32(a);
}

}  // namespace

Lanes32Row::~Lanes32Row() { std::free(t); }

void Lanes32Row::set(const float* x, int64_t d) {
  const int64_t c = (d + 255) / 256;
  if (c != chunks) {
    std::free(t);
    t = alloc_floats(c * 256);
  }
  D = d;
  chunks = c;
  std::memset(t, 0, size_t(chunks * 256) * sizeof(float));
  for (int64_t k = 0; k < D; ++k) t[(k / 256) * 256 + (k % 8) * 32 + (k / 8) % 32] = x[k];
}

float lanes32_dot_bf16(const Lanes32Row& x, const uint16_t* w) {
  FB_CHECK(cpu_has_avx512() && x.D % 8 == 0) << "simd::lanes32_dot_bf16: AVX-512 and D % 8 == 0 (D=" << x.D << ")";
  return lanes32_dot_bf16_avx512(x, w);
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed) && cpu_has_avx512(); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

QuantRowT::~QuantRowT() {
  std::free(values);
  std::free(scales);
}

void QuantRowT::set(const float* values_k, const float* scales_kb, int64_t k) {
  FB_CHECK(k > 0 && k % 32 == 0) << "block GEMM K=" << k;
  const int64_t kb = k / 32, groups_new = (kb + 15) / 16;
  if (groups_new != groups) {
    std::free(values);
    std::free(scales);
    values = alloc_floats(groups_new * 512);
    scales = alloc_floats(groups_new * 16);
  }
  K = k;
  KB = kb;
  groups = groups_new;
  std::memset(values, 0, size_t(groups * 512) * sizeof(float));
  std::memset(scales, 0, size_t(groups * 16) * sizeof(float));
  for (int64_t b = 0; b < KB; ++b) {
    const int64_t g = b / 16, l = b % 16;
    for (int i = 0; i < 32; ++i) values[g * 512 + i * 16 + l] = values_k[b * 32 + i];
    scales[g * 16 + l] = scales_kb[b];
  }
}

void fp4_rows_f32(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, float* y) {
  FB_CHECK(cpu_has_avx512()) << "simd::fp4_rows without AVX-512F";
  rows_avx512<Fp4Format>(q, W, S, n0, n1, y);
}

void fp8_rows_f32(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, float* y) {
  FB_CHECK(cpu_has_avx512()) << "simd::fp8_rows without AVX-512F";
  rows_avx512<Fp8Format>(q, W, S, n0, n1, y);
}

namespace {
template <typename RowsF32>
void rounded(int64_t n0, int64_t n1, uint16_t* y, RowsF32 rows) {
  float buf[256];
  for (int64_t a = n0; a < n1; a += 256) {
    const int64_t b = std::min<int64_t>(n1, a + 256);
    rows(a, b, buf);
    for (int64_t n = a; n < b; ++n) y[n - n0] = bf16_bits_from_f32(buf[n - a]);
  }
}
}  // namespace

void fp4_rows(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, uint16_t* y) {
  rounded(n0, n1, y, [&](int64_t a, int64_t b, float* f) { fp4_rows_f32(q, W, S, a, b, f); });
}

void fp8_rows(const QuantRowT& q, const uint8_t* W, const uint8_t* S, int64_t n0, int64_t n1, uint16_t* y) {
  rounded(n0, n1, y, [&](int64_t a, int64_t b, float* f) { fp8_rows_f32(q, W, S, a, b, f); });
}

}  // namespace fb::cpu::simd
