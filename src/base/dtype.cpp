#include "base/dtype.h"

#include <cmath>

#include "base/check.h"
#include "base/fmath.h"

namespace fb {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16: case DType::kF16: case DType::kI16: return 2;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  static constexpr DType kAll[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF64,
                                   DType::kF8E4M3, DType::kF8E8M0, DType::kI8, DType::kU8,
                                   DType::kI16, DType::kI32, DType::kI64, DType::kBool};
  for (DType t : kAll) {
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

float e4m3_to_f32(uint8_t code) {
  const bool neg = code & 0x80;
  const int e = (code >> 3) & 0xF;
  const int m = code & 0x7;
  float v;
  if (e == 0xF && m == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = float(m) * 0x1p-9f;  // subnormal: m/8 * 2^-6
  } else {
    v = (1.0f + float(m) * 0.125f) * std::ldexp(1.0f, e - 7);
  }
  return neg ? -v : v;
}

uint8_t e4m3_from_f32(float f) {
  uint32_t u = bits_from_f32(f);
  const uint8_t sign = (u >> 24) & 0x80;
  if (std::isnan(f)) return uint8_t(sign | 0x7F);
  float a = std::fabs(f);
  if (a >= kE4M3Max) return uint8_t(sign | 0x7E);  // saturate (inf included)
  // Quantum of the binade that holds a: normals have 3 mantissa bits, subnormals step 2^-9.
  int exp;
  std::frexp(a, &exp);  // a = frac * 2^exp, frac in [0.5, 1)
  int e_unbiased = exp - 1;  // a in [2^e, 2^(e+1))
  if (e_unbiased < -6) e_unbiased = -6;
  const float quantum = std::ldexp(1.0f, e_unbiased - 3);
  // a / quantum is exact (power of two); rint rounds half to even under the default mode.
  float q = std::nearbyint(a / quantum);
  float r = q * quantum;  // exact
  if (r == 0.0f) return sign;
  if (r >= kE4M3Max) return uint8_t(sign | 0x7E);
  int re;
  std::frexp(r, &re);
  int be = re - 1 + 7;  // biased exponent
  if (be <= 0) {        // subnormal
    int m = int(r / 0x1p-9f);
    return uint8_t(sign | m);
  }
  int m = int((r / std::ldexp(1.0f, re - 1) - 1.0f) * 8.0f);
  return uint8_t(sign | (be << 3) | m);
}

float e8m0_to_f32(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(code) - 127);
}

uint8_t e8m0_from_pow2(float f) {
  int exp;
  float frac = std::frexp(f, &exp);
  FB_CHECK(frac == 0.5f) << "e8m0 needs a positive power of two, got " << f;
  int b = exp - 1 + 127;
  FB_CHECK(b >= 0 && b <= 254) << "e8m0 exponent out of range: " << f;
  return uint8_t(b);
}

float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = kMag[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t e2m1_from_f32(float v) { return fm::e2m1_code(v); }

}  // namespace fb
