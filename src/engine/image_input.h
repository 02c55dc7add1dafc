// Image content parts of a request (issue 10, API half; spec/15 §6.3 step 1, spec/14 §6.1), the
// engine-level API the server calls on its HTTP threads (never on the engine thread): finds them in
// prompt order, turns each into bytes by the server's policy (base64 data URLs and
// Anthropic base64 sources always; local files only with --allow-local-images; never the
// network), decodes and preprocesses them into patches (vision::load_image), and expands every
// placeholder id of the tokenized prompt into its span. The tower is NOT run here: the engine
// thread runs it on its executor. Every bad image is kInvalidArgument (400) naming the image.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "model/config.h"
#include "vision/image.h"

namespace fb::engine {

struct ImagePolicy {
  const model::Config* vision = nullptr;          // the model's config; null: it has no vision tower
  bool allow_local = false;                       // file:// URLs and plain paths
  int max_images = 64;                            // per request
  size_t max_bytes = 32u << 20;                   // encoded bytes per image (DeepSeek API: 32 MiB)
  vision::DecodeLimits limits{16384, 178956970};  // decoded side / pixels
};

// Image parts of OpenAI-style messages (content parts of type image_url / image, also inside
// tool_result parts), in the order the prompt encoder numbers its placeholders.
std::vector<nlohmann::ordered_json> collect_image_parts(const nlohmann::ordered_json& messages);

// One image part -> encoded image bytes, by the policy.
Result<std::string> image_part_bytes(const nlohmann::ordered_json& part, const ImagePolicy& policy);

// Replaces the i-th `image_token_id` of req->prompt with the span of image i and fills
// req->images (patches, grid, content hash). The placeholder count must equal parts.size().
Status expand_images(const std::vector<nlohmann::ordered_json>& parts, const ImagePolicy& policy, int32_t image_token_id,
                     Request* req);

}  // namespace fb::engine
