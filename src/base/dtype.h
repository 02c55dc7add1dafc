// Number formats of the checkpoint and caches: bf16, fp8 e4m3 ("fn": no inf, max 448),
// e8m0 (exponent-only scale byte), e2m1 (fp4, two per byte, even element in the LOW nibble).
// Scalar reference conversions only; every fast path must agree with these bit for bit.
// spec/10 §4, spec/11 §1.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace fb {

// Storage dtypes seen in safetensors files (spec/10 §2.1) plus a few of our own.
enum class DType : uint8_t { kBF16, kF16, kF32, kF64, kF8E4M3, kF8E8M0, kI8, kU8, kI16, kI32, kI64, kBool };

// Bytes per element; every dtype here is at least one byte (fp4 is stored as I8 pairs).
size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "BF16", "F8_E4M3", ...
bool parse_dtype(std::string_view s, DType* out);

inline float f32_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- bf16 -------------------------------------------------------------------------------------
struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }
inline float to_f32(bf16 v) { return bf16_to_f32(v.bits); }

// Round-to-nearest-even; NaN becomes the canonical quiet NaN 0x7FC0 (as torch does).
inline uint16_t bf16_bits_from_f32(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}
inline bf16 to_bf16(float f) { return bf16{bf16_bits_from_f32(f)}; }
// f32 -> bf16 -> f32 in one step: the value a bf16 tensor would hold.
inline float round_bf16(float f) { return bf16_to_f32(bf16_bits_from_f32(f)); }

// ---- fp8 e4m3 ("fn") -------------------------------------------------------------------------
constexpr float kE4M3Max = 448.0f;

float e4m3_to_f32(uint8_t code);
// Round-to-nearest-even with saturation to +-448 (also for +-inf); NaN -> 0x7F | sign.
// The sign of zero is kept (-0 -> 0x80).
uint8_t e4m3_from_f32(float f);

// ---- e8m0 ------------------------------------------------------------------------------------
// value = 2^(b - 127); 0xFF is NaN; there is no zero.
float e8m0_to_f32(uint8_t code);
// Exact powers of two only (2^-127 .. 2^127); anything else is a bug at the call site.
uint8_t e8m0_from_pow2(float f);

// ---- e2m1 (fp4) ------------------------------------------------------------------------------
// Code: bit 3 = sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0.
float e2m1_to_f32(uint8_t code);
// Round-to-nearest-even on the code for |v| <= 6 (callers clamp first; larger saturates to 6).
// The sign bit is copied from v, so a small negative value gives code 8 (-0). spec/11 §1.5.
uint8_t e2m1_from_f32(float v);
// Element i of a packed row: even i in the low nibble, odd i in the high nibble.
inline uint8_t e2m1_code_at(const uint8_t* packed, int64_t i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}

}  // namespace fb
