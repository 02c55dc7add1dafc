#include "vision/pipeline.h"

namespace fb::vision {

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Result<PatchedImage> load_image(std::string_view bytes, const model::Config& c, const DecodeLimits& limits) {
  if (!c.has_vision()) return FB_ERROR(kUnsupported) << "model has no vision tower";
  PatchedImage out;
  RgbImage img = FB_TRY(decode_image(bytes, limits));
  out.width = img.width;
  out.height = img.height;
  PreparedImage pre = FB_TRY(preprocess(img, c.vision));
  out.plan = pre.plan;
  out.patches = std::move(pre.patches);
  const ImagePlan& pl = out.plan;
  // The key covers the bytes and everything that shapes the rows: the plan and the vision
  // config (spec/14 §6.2 "Prefix caching"). Same formula as when the tower ran here.
  const int64_t params[] = {pl.bw, pl.bh, pl.nvw, pl.nvh, pl.nlw, pl.nlh, c.vision.patch_size, c.vision.downsample,
                            c.vision.max_image_tokens, c.vision.min_pixels, c.dim};
  uint64_t h = fnv1a64(bytes);
  h = fnv1a64(std::string_view(reinterpret_cast<const char*>(params), sizeof params), h);
  out.hash = h ? h : 1;
  return out;
}

}  // namespace fb::vision
