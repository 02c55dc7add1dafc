// Tokenizer: byte-level BPE loaded from an HF tokenizer.json, with HF `tokenizers` semantics
// (spec/15 §1): added-token matching (leftmost-longest) first, then the regex pre-tokenizer,
// then BPE merges by rank over ByteLevel bytes. Immutable after load; safe to share across
// threads. Invariant: decode(encode(t)) == t for valid UTF-8 t.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/pre_tokenizer.h"

namespace fb::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;  // only affects decode(skip_special=true)
};

struct EncodeOptions {
  // Match added-token strings in the text (HF default). False treats them as plain text
  // (a hardened server may use this for user-controlled spans; spec/15 §1.1).
  bool match_added_tokens = true;
};

class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& path);
  static Result<Tokenizer> from_json_text(std::string_view json_text);

  // Invalid UTF-8 in `text` is first replaced by U+FFFD per maximal invalid subpart (what
  // Python's bytes.decode(errors="replace") would hand to HF), then encoded.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // HF decode: ByteLevel bytes of every token concatenated, then lossy UTF-8.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Raw bytes a token contributes to the output (added tokens: their content). id must be valid.
  const std::string& token_bytes(int32_t id) const { return id_bytes_[size_t(id)]; }
  // The token's string as written in tokenizer.json (ByteLevel symbols for vocab entries).
  std::string token_string(int32_t id) const;
  // Id of an exact token string (added content or ByteLevel vocab string); -1 if none.
  int32_t token_id(std::string_view token_string) const;
  bool is_added(int32_t id) const { return added_index_[size_t(id)] >= 0; }
  bool is_special(int32_t id) const;
  bool is_valid_id(int32_t id) const { return id >= 0 && size_t(id) < id_bytes_.size(); }
  int32_t vocab_size() const { return int32_t(id_bytes_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // sha256 (hex) of the tokenizer.json bytes this was loaded from.
  const std::string& source_sha256() const { return source_sha256_; }

 private:
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t added = -1;                              // index into added_ when a token ends here
  };
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  // Length of the longest added token starting at text[0], its index in *added (0 if none).
  size_t match_added(std::string_view text, int32_t* added) const;

  PreTokenizer pre_;
  std::vector<std::string> id_bytes_;   // [vocab] raw bytes per id
  std::vector<int32_t> added_index_;    // [vocab] index into added_ or -1
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // BPE vocab, keyed by raw bytes
  std::unordered_map<uint64_t, uint64_t> merges_;         // (left<<32|right) -> (rank<<32|merged)
  int32_t byte_id_[256] = {};
  std::vector<TrieNode> trie_;
  bool added_first_byte_[256] = {};
  std::string source_sha256_;
};

// GPT-2 ByteLevel alphabet (spec/15 §1): the code point that stands for byte b, and the inverse.
char32_t byte_level_char(uint8_t b);
// Maps a ByteLevel string back to bytes; false if it holds a character outside the alphabet.
bool byte_level_to_bytes(std::string_view s, std::string* out);

}  // namespace fb::tokenizer
