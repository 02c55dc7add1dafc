// FP8 weights of the release (e4m3 codes [N, K] with e8m0 scales per 32x32 block, [ceil(N/32), K/32])
// dequantised to bf16 on the host. Each value is code * scale, a power-of-two scaling of an e4m3
// value, so the bf16 result is exact. Both executors use it where the reference holds a weight as
// BF16 (wo_a); no backend code here.
#pragma once

#include <cstdint>
#include <vector>

#include "base/tensor_view.h"

namespace fb::model {

// [N, K] bf16 bits of w (e4m3 [N, K]) scaled by w_scale (e8m0 [ceil(N/32), K/32]).
std::vector<uint16_t> dequant_fp8_weight(const TensorView& w, const TensorView& w_scale);

}  // namespace fb::model
