#include "vision/pipeline.h"

#include "loader/bind.h"
#include "loader/snapshot.h"
#include "model/weights.h"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::vision {

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

ImagePipeline::~ImagePipeline() = default;

Result<std::unique_ptr<ImagePipeline>> ImagePipeline::open(const std::string& model_dir) {
  std::unique_ptr<ImagePipeline> p(new ImagePipeline());
  p->snap_ = FB_TRY(loader::Snapshot::open(model_dir));
  if (!p->snap_->config().has_vision()) return FB_ERROR(kUnsupported) << "model has no vision tower";
  p->weights_ = std::make_unique<model::ModelWeights>(loader::bind_weights(*p->snap_));
  p->tower_ = std::make_unique<VisionTower>(p->snap_->config(), p->weights_->vision);
  return p;
}

const model::Config& ImagePipeline::config() const { return snap_->config(); }

Result<EmbeddedImage> ImagePipeline::embed(std::string_view bytes, const DecodeLimits& limits) const {
  const model::Config& c = snap_->config();
  EmbeddedImage out;
  RgbImage img = FB_TRY(decode_image(bytes, limits));
  out.width = img.width;
  out.height = img.height;
  PreparedImage pre = FB_TRY(preprocess(img, c.vision));
  out.plan = pre.plan;
  const ImagePlan& pl = pre.plan;
  const auto vit = tower_->vit(pre.patches, pl.nvh, pl.nvw);
  const auto aligned = tower_->align(vit, pl.nvh, pl.nvw);
  out.types = span_types(pl.nlh, pl.nlw);
  out.embeddings = span_embeddings(out.types, aligned, weights_->vision, c.dim);
  // The key covers the bytes and everything that shapes the rows: the plan and the vision
  // config (spec/14 §6.2 "Prefix caching").
  const int64_t params[] = {pl.bw, pl.bh, pl.nvw, pl.nvh, pl.nlw, pl.nlh, c.vision.patch_size, c.vision.downsample,
                            c.vision.max_image_tokens, c.vision.min_pixels, c.dim};
  uint64_t h = fnv1a64(bytes);
  h = fnv1a64(std::string_view(reinterpret_cast<const char*>(params), sizeof params), h);
  out.hash = h ? h : 1;
  return out;
}

}  // namespace fb::vision
