// Reference image preprocessing (spec/14 §3, reference image_processor.py load_image): the
// target-size plan, Pillow-exact BICUBIC resampling, ImageOps.pad with grey 127, normalisation
// to BF16 and patching. Pure functions of (image, VisionConfig); bit-exact with Pillow.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "vision/image.h"

namespace fb::vision {

// The resize plan of reference plan_image_grid / safe_resize (spec/14 §3.2).
struct ImagePlan {
  int bw = 0, bh = 0;    // resized (padded) pixel size, multiples of patch_size
  int nvw = 0, nvh = 0;  // ViT patch grid
  int nlw = 0, nlh = 0;  // LLM grid after the downsample x downsample folding
  int span_tokens() const { return nlh * (nlw + 1) + 2; }
  int n_patches() const { return nvw * nvh; }
};
Result<ImagePlan> plan_image(int width, int height, const model::VisionConfig& vc);

// Pillow Image.resize(size, BICUBIC) on RGB: separable a = -0.5 kernel widened by the scale when
// shrinking, 22-bit fixed-point coefficients, horizontal pass then vertical, 8-bit rounding in
// between; an unchanged size is a plain copy (Pillow's ImagingResample).
RgbImage resize_bicubic(const RgbImage& in, int out_w, int out_h);

// ImageOps.pad(image, (bw, bh), BICUBIC, color=(fill,fill,fill), centering=(0.5, 0.5)).
RgbImage pad_image(const RgbImage& in, int bw, int bh, uint8_t fill = 127);

struct PreparedImage {
  ImagePlan plan;
  std::vector<uint16_t> patches;  // bf16 [n_patches, 3 * p * p], patch row-major, channel-major inside
};
// The whole of load_image after decoding: plan, resize/pad (or stretch when max_wh_ratio says
// so), normalise (v/255 - 0.5)/0.5 in f32 -> bf16, patchify.
Result<PreparedImage> preprocess(const RgbImage& img, const model::VisionConfig& vc);

// bf16 of ((p / 255) - 0.5) / 0.5 in f32, for p = 0..255.
uint16_t normalized_pixel_bf16(uint8_t p);

}  // namespace fb::vision
