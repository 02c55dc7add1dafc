#include "tokenizer/fuzz_targets.h"

#include <random>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8.h"

namespace fb::tokenizer {

namespace {

std::vector<OutputEvent> merged(std::vector<OutputEvent> ev) {
  std::vector<OutputEvent> out;
  for (auto& e : ev) {
    if (e.kind != OutputEvent::Kind::kToolCall && e.text.empty()) continue;
    if (!out.empty() && e.kind != OutputEvent::Kind::kToolCall && out.back().kind == e.kind) {
      out.back().text += e.text;
    } else {
      out.push_back(std::move(e));
    }
  }
  return out;
}

bool same(const std::vector<OutputEvent>& a, const std::vector<OutputEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].kind != b[i].kind || a[i].text != b[i].text) return false;
    if (a[i].call.name != b[i].call.name || a[i].call.arguments != b[i].call.arguments) return false;
  }
  return true;
}

}  // namespace

int fuzz_dsml_parser(const uint8_t* data, size_t n) {
  if (n == 0) return 0;
  const bool thinking = data[0] & 1;
  const uint32_t chunk_seed = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, n - 1);
  const std::vector<OutputEvent> whole = merged(parse_output(text, thinking));
  OutputParser p(thinking);
  std::vector<OutputEvent> ev;
  std::minstd_rand rng(chunk_seed + 1);
  size_t i = 0;
  while (i < text.size()) {
    const size_t k = std::min(text.size() - i, size_t(1 + rng() % 7));
    for (auto& e : p.feed(text.substr(i, k))) ev.push_back(std::move(e));
    i += k;
  }
  for (auto& e : p.finish()) ev.push_back(std::move(e));
  ev = merged(std::move(ev));
  FB_CHECK(same(whole, ev)) << "chunked parse differs from whole parse (" << whole.size() << " vs " << ev.size()
                            << " events)";
  for (const auto& e : whole)
    if (e.kind == OutputEvent::Kind::kToolCall) FB_CHECK(!e.call.arguments.empty() && e.call.arguments[0] == '{');
  return 0;
}

int fuzz_encode_decode(const Tokenizer& tok, const uint8_t* data, size_t n) {
  const std::string_view text(reinterpret_cast<const char*>(data), n);
  const std::string want = utf8_sanitize(text);
  for (bool added : {true, false}) {
    EncodeOptions o;
    o.match_added_tokens = added;
    const std::vector<int32_t> ids = tok.encode(text, o);
    for (int32_t id : ids) FB_CHECK(tok.is_valid_id(id)) << id;
    const std::string got = tok.decode(ids);
    FB_CHECK(got == want) << "decode(encode(x)) != lossy(x), " << got.size() << " vs " << want.size() << " bytes";
    StreamDecoder d(tok);
    std::string s;
    for (int32_t id : ids) {
      std::string piece = d.push(id);
      FB_CHECK(utf8_is_valid(piece));
      s += piece;
    }
    s += d.finish();
    FB_CHECK(s == got) << "streaming decode differs";
  }
  return 0;
}

std::string fuzz_random_output_text(uint64_t seed) {
  static const char* kFrags[] = {
      "<｜DSML｜ calls>", "\n\n<｜DSML｜ calls>\n", "</｜DSML｜ calls>", "<｜DSML｜ invoke name=\"", "<｜DSML｜ invoke",
      "</｜DSML｜ invoke>", "<｜DSML｜ parameter name=\"", "<｜DSML｜ parameter", "</｜DSML｜ parameter>",
      "\" string=\"true\">", "\" string=\"false\">", " string=\"maybe\">", "\">\n", "\"", ">", "\n", "\n\n", " ",
      "</think>", "<think>", "<｜end▁of▁sentence｜>", "<|DSML| calls>", "<｜DSML｜tool_calls>", "｜DSML｜", "</",
      "<", "｜", "get_weather", "city", "Paris", "{\"a\": [1, 2]}", "3", "tr", "name=", "中文", "😀", "\xE4\xB8",
      "\xFF", "x"};
  std::mt19937_64 rng(seed);
  std::string s;
  const int n = int(rng() % 60);
  for (int i = 0; i < n; ++i) {
    if (rng() % 8 == 0) {
      s.push_back(char(rng() % 256));
    } else {
      s += kFrags[rng() % (sizeof kFrags / sizeof kFrags[0])];
    }
  }
  return s;
}

}  // namespace fb::tokenizer
