#include "server/phrase_bias.h"

#include <algorithm>

namespace fb::server {

namespace {

using ojson = nlohmann::ordered_json;

// Adds or replaces (same tokens: the later bias wins).
void put(std::vector<engine::PhraseBias>* out, engine::PhraseBias e) {
  for (auto& x : *out)
    if (x.tokens == e.tokens) {
      x.bias = e.bias;
      return;
    }
  out->push_back(std::move(e));
}

Result<float> bias_of(const ojson& v, const std::string& what) {
  if (!v.is_number()) return FB_ERROR(kInvalidArgument) << what << ": the bias must be a number";
  const double b = v.get<double>();
  if (!(b >= -100 && b <= 100)) return FB_ERROR(kInvalidArgument) << what << ": the bias must be in [-100, 100] (got " << b << ")";
  return float(b);
}

Status add_text(const std::string& text, float bias, const tokenizer::Tokenizer& tok, const std::string& what,
                std::vector<engine::PhraseBias>* out) {
  if (text.empty()) return FB_ERROR(kInvalidArgument) << what << ": the phrase is empty";
  std::vector<std::string> forms = {text};
  const unsigned char c0 = static_cast<unsigned char>(text[0]);
  if (!(c0 == ' ' || c0 == '\n' || c0 == '\t' || c0 == '\r')) forms.push_back(" " + text);
  for (const std::string& f : forms) {
    std::vector<int32_t> ids = tok.encode(f);
    if (ids.size() > size_t(engine::kMaxPhraseTokens))
      return FB_ERROR(kInvalidArgument) << what << ": the phrase has " << ids.size() << " tokens; at most " << engine::kMaxPhraseTokens;
    put(out, {std::move(ids), bias});
  }
  return Status();
}

}  // namespace

Result<std::vector<engine::PhraseBias>> parse_phrase_bias(const ojson& v, const tokenizer::Tokenizer& tok, const std::string& where,
                                                          size_t max_entries) {
  std::vector<engine::PhraseBias> out;
  if (v.is_null()) return out;
  if (!v.is_object() && !v.is_array())
    return FB_ERROR(kInvalidArgument) << where << " must be an object {\"phrase\": bias} or a list of {\"phrase\"|\"tokens\", \"bias\"}";
  if (v.size() > max_entries) return FB_ERROR(kInvalidArgument) << where << " has " << v.size() << " entries; at most " << max_entries;
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string what = where + " entry \"" + it.key() + "\"";
      FB_RETURN_IF_ERROR(add_text(it.key(), FB_TRY(bias_of(it.value(), what)), tok, what, &out));
    }
    return out;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const ojson& e = v[i];
    const std::string what = where + "[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("bias") || (e.contains("phrase") == e.contains("tokens")))
      return FB_ERROR(kInvalidArgument) << what << " must be an object with \"bias\" and one of \"phrase\" (a string) or \"tokens\" (token ids)";
    const float bias = FB_TRY(bias_of(e["bias"], what));
    if (e.contains("phrase")) {
      if (!e["phrase"].is_string()) return FB_ERROR(kInvalidArgument) << what << ": \"phrase\" must be a string";
      FB_RETURN_IF_ERROR(add_text(e["phrase"].get<std::string>(), bias, tok, what, &out));
      continue;
    }
    const ojson& t = e["tokens"];
    if (!t.is_array() || t.empty() || t.size() > size_t(engine::kMaxPhraseTokens))
      return FB_ERROR(kInvalidArgument) << what << ": \"tokens\" must be a list of 1 to " << engine::kMaxPhraseTokens << " token ids";
    engine::PhraseBias pb;
    pb.bias = bias;
    for (const auto& id : t) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok.vocab_size())
        return FB_ERROR(kInvalidArgument) << what << ": " << id.dump() << " is not a token id of the vocabulary of " << tok.vocab_size();
      pb.tokens.push_back(int32_t(id.get<int64_t>()));
    }
    put(&out, std::move(pb));
  }
  return out;
}

std::vector<engine::PhraseBias> merge_phrase_bias(const std::vector<engine::PhraseBias>& defaults, std::vector<engine::PhraseBias> request) {
  std::vector<engine::PhraseBias> out = defaults;
  for (auto& e : request) put(&out, std::move(e));
  // A zero bias changes nothing: dropped, so a request that switches every default off costs nothing.
  std::erase_if(out, [](const engine::PhraseBias& e) { return e.bias == 0.0f; });
  return out;
}

}  // namespace fb::server
