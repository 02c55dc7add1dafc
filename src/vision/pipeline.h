// The host half of one image's way into a prompt (spec/14 §3, §6.2): bytes -> decode ->
// reference preprocessing -> patches, plus the content hash that keys prefix reuse. No weights:
// the tower (ViT + aligner) runs on the engine's executor (model::Executor::encode_image), so
// whoever prepares an image (the server's HTTP threads) never holds a copy of the tower.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace fb::vision {

struct PatchedImage {
  int width = 0, height = 0;      // decoded size
  ImagePlan plan;                 // span of plan.span_tokens() rows
  std::vector<uint16_t> patches;  // bf16 [plan.n_patches(), 3 * p * p], the tower's input
  uint64_t hash = 0;              // content hash of the bytes and of everything that shapes the rows (never 0)
};

// The reference's load_image on bytes. Errors: malformed or unsupported bytes, limits
// (kInvalidArgument / kUnsupported); kUnsupported when the config has no vision tower.
Result<PatchedImage> load_image(std::string_view bytes, const model::Config& c, const DecodeLimits& limits = {});

// FNV-1a 64 (content keys; not cryptographic).
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 1469598103934665603ull);

}  // namespace fb::vision
