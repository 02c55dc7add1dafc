// One image from bytes to span rows (spec/14 §3-§6): decode, reference preprocessing, the CPU
// ViT + aligner, span types and embeddings, and a content hash for prefix-cache keys. The server
// uses it for image content parts; the weights come from the model folder (mapped read-only,
// shared with the executor through the page cache). Thread-safe: embed() is const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace fb::loader {
class Snapshot;
}
namespace fb::model {
struct ModelWeights;
}

namespace fb::vision {

class VisionTower;

struct EmbeddedImage {
  ImagePlan plan;
  int width = 0, height = 0;          // decoded size
  std::vector<int32_t> types;         // span types (spec/14 §6.1), length plan.span_tokens()
  std::vector<uint16_t> embeddings;   // bf16 [types.size(), dim]
  uint64_t hash = 0;                  // content hash of the bytes and the preprocessing plan (never 0)
};

class ImagePipeline {
 public:
  // Opens the model folder's checkpoint; kUnsupported when it has no vision tower.
  static Result<std::unique_ptr<ImagePipeline>> open(const std::string& model_dir);
  ~ImagePipeline();

  const model::Config& config() const;
  // Errors: malformed or unsupported image bytes, limits (kInvalidArgument / kUnsupported).
  Result<EmbeddedImage> embed(std::string_view bytes, const DecodeLimits& limits = {}) const;

 private:
  ImagePipeline() = default;
  std::unique_ptr<loader::Snapshot> snap_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::unique_ptr<VisionTower> tower_;
};

// FNV-1a 64 (content keys; not cryptographic).
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 1469598103934665603ull);

}  // namespace fb::vision
