// The Engram token map of a model folder: DIR/engram_token_map.i32 when present (an explicit
// override, as the fixtures ship), otherwise derived from DIR/tokenizer.json (spec/11 §6.1).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace fb::tokenizer {

// tokenizer.json of a model folder, falling back to the repository's V4.1-equivalent asset.
std::string tokenizer_path_for_model(const std::string& model_dir);
Result<std::vector<int32_t>> engram_map_for_model(const std::string& model_dir);

}  // namespace fb::tokenizer
