#include "tokenizer/model_map.h"

#include <cstring>
#include <filesystem>

#include "base/mapped_file.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

namespace fs = std::filesystem;

std::string tokenizer_path_for_model(const std::string& model_dir) {
  fs::path p = fs::path(model_dir) / "tokenizer.json";
  if (fs::exists(p)) return p.string();
  return std::string(FB_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json";
}

Result<std::vector<int32_t>> engram_map_for_model(const std::string& model_dir) {
  fs::path file = fs::path(model_dir) / "engram_token_map.i32";
  if (fs::exists(file)) {
    std::string b = FB_TRY(read_file_bytes(file.string()));
    if (b.size() % 4) return FB_ERROR(kCorrupt) << file.string() << ": size is not a multiple of 4";
    std::vector<int32_t> m(b.size() / 4);
    std::memcpy(m.data(), b.data(), b.size());
    return m;
  }
  Tokenizer tok = FB_TRY(Tokenizer::load(tokenizer_path_for_model(model_dir)));
  EngramMap em = FB_TRY(derive_engram_map(tok));
  return std::move(em.map);
}

}  // namespace fb::tokenizer
