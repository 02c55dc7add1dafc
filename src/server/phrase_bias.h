// Phrase bias from client JSON (issue 27, [policy]): a request's `phrase_bias` and the server's
// default list (`serve --phrase-bias FILE`, same format) -> engine::PhraseBias entries (token ids),
// the sampler's rule being in engine/sampler.h. Accepted forms: {"text": bias, ...} or
// [{"phrase": "text", "bias": b} | {"tokens": [ids], "bias": b}, ...]; bias in [-100, 100].
// Every error is kInvalidArgument naming the entry. No engine calls.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "base/status.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace fb::server {

constexpr size_t kMaxPhraseBiasEntries = 256;  // per request (a default list may hold 4x as many)

// `where` names the source in errors ("'phrase_bias'", "--phrase-bias FILE"). A text phrase is
// tokenized as written and, when it does not start with whitespace, also with one leading space
// (the form it takes after a word), as two entries; identical token lists keep the last bias.
Result<std::vector<engine::PhraseBias>> parse_phrase_bias(const nlohmann::ordered_json& v, const tokenizer::Tokenizer& tok,
                                                          const std::string& where, size_t max_entries = kMaxPhraseBiasEntries);

// The server's defaults, then the request's: a request entry with the same tokens as a default
// replaces it (bias 0 switches a default off), others are added.
std::vector<engine::PhraseBias> merge_phrase_bias(const std::vector<engine::PhraseBias>& defaults, std::vector<engine::PhraseBias> request);

}  // namespace fb::server
