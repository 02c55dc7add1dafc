#include "model/fp8_weight.h"

#include "base/dtype.h"

namespace fb::model {

std::vector<uint16_t> dequant_fp8_weight(const TensorView& w, const TensorView& w_scale) {
  const int64_t N = w.dim(0), K = w.dim(1), KB = w_scale.dim(1);
  float e4m3[256];  // exact values of every code
  for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_f32(uint8_t(i));
  std::vector<uint16_t> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      out[size_t(n * K + k)] = bf16_bits_from_f32(e4m3[w.data[n * K + k]] * e8m0_to_f32(w_scale.data[(n / 32) * KB + k / 32]));
  return out;
}

}  // namespace fb::model
