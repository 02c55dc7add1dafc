#include "tokenizer/tokenize_command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "base/mapped_file.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

namespace {

int usage(const char* msg) {
  std::fprintf(stderr,
               "error: %s\nusage: flashbox tokenize --tokenizer PATH [--decode [--skip-special]] [--no-added] "
               "[--jsonl] [--engram-map OUT]\n",
               msg);
  return 2;
}

void print_ids(const std::vector<int32_t>& ids, std::string* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out->push_back(' ');
    *out += std::to_string(ids[i]);
  }
  out->push_back('\n');
}

}  // namespace

int run_tokenize_command(int argc, char** argv) {
  std::string path, engram_out;
  bool decode = false, skip_special = false, jsonl = false;
  EncodeOptions opts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else if (a == "--engram-map" && i + 1 < argc) {
      engram_out = argv[++i];
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--skip-special") {
      skip_special = true;
    } else if (a == "--no-added") {
      opts.match_added_tokens = false;
    } else if (a == "--jsonl") {
      jsonl = true;
    } else {
      return usage(("unknown or incomplete argument " + a).c_str());
    }
  }
  if (path.empty()) return usage("--tokenizer PATH is required");
  auto tok = Tokenizer::load(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  if (!engram_out.empty()) {
    auto m = derive_engram_map(*tok);
    if (!m.ok()) {
      std::fprintf(stderr, "error: %s\n", m.status().to_string().c_str());
      return 1;
    }
    std::string bytes(m->map.size() * 4, '\0');
    for (size_t i = 0; i < m->map.size(); ++i)
      for (int k = 0; k < 4; ++k) bytes[4 * i + size_t(k)] = char(uint32_t(m->map[i]) >> (8 * k));
    if (Status st = write_file_atomic(engram_out, bytes.data(), bytes.size()); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
      return 1;
    }
    std::printf("ids %d classes %d sha256 %s\n", tok->vocab_size(), m->n_classes, engram_map_sha256(m->map).c_str());
    return 0;
  }
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::string out;
  if (decode) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < input.size()) {
      while (i < input.size() && std::isspace(uint8_t(input[i]))) ++i;
      if (i == input.size()) break;
      size_t j = i;
      while (j < input.size() && !std::isspace(uint8_t(input[j]))) ++j;
      char* end = nullptr;
      const std::string word = input.substr(i, j - i);
      const long v = std::strtol(word.c_str(), &end, 10);
      if (*end != '\0' || !tok->is_valid_id(int32_t(v)) || v != long(int32_t(v))) {
        std::fprintf(stderr, "error: '%s' is not a token id of this tokenizer (0..%d)\n", word.c_str(),
                     tok->vocab_size() - 1);
        return 1;
      }
      ids.push_back(int32_t(v));
      i = j;
    }
    out = tok->decode(ids, skip_special);
  } else if (jsonl) {
    size_t line_no = 0, start = 0;
    while (start < input.size()) {
      size_t end = input.find('\n', start);
      if (end == std::string::npos) end = input.size();
      ++line_no;
      const std::string_view line(input.data() + start, end - start);
      start = end + 1;
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_string()) {
        std::fprintf(stderr, "error: stdin line %zu is not a JSON string\n", line_no);
        return 1;
      }
      print_ids(tok->encode(j.get_ref<const std::string&>(), opts), &out);
    }
  } else {
    print_ids(tok->encode(input, opts), &out);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace fb::tokenizer
