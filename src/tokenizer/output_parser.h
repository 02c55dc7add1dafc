// OutputParser: streaming split of decoded model output into reasoning, answer text and DSML
// tool calls with typed parameters (spec/15 §8.2-8.3). Robust by construction: malformed or
// unterminated DSML falls back to plain text; work per byte is bounded (no re-scans of large
// values), so it never hangs. Invariant: feeding text in any chunking gives the same events
// (after merging adjacent text pieces) as feeding it at once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace fb::tokenizer {

struct ToolParam {
  std::string name;
  std::string raw;         // the text between the tags, verbatim
  bool is_string = true;   // string="true"
  bool valid_json = true;  // string="false" values that parse as JSON
  nlohmann::ordered_json value;  // typed value (string, or the parsed JSON; raw string if invalid)
};

struct ParsedToolCall {
  std::string name;
  std::vector<ToolParam> params;
  // spec/15 §8.2: "{" + join(", ", JSON(key) + ": " + value) + "}"; invalid if a non-string value
  // is not JSON (valid_json false).
  std::string arguments;
  bool valid_json = true;
};

struct OutputEvent {
  enum class Kind { kReasoning, kText, kToolCall };
  Kind kind;
  std::string text;       // kReasoning, kText
  ParsedToolCall call;    // kToolCall
};

class OutputParser {
 public:
  // thinking: the prompt ended in <think>, so output starts as reasoning until </think>.
  explicit OutputParser(bool thinking);
  // Appends decoded text; returns the events that became final.
  std::vector<OutputEvent> feed(std::string_view text);
  // End of generation (EOS or a length stop): flushes everything held back. A missing </think>
  // leaves everything as reasoning (our policy); an unterminated call block becomes text.
  std::vector<OutputEvent> finish();
  bool saw_eos() const { return saw_eos_; }
  int n_tool_calls() const { return n_calls_; }

 private:
  enum class State { kReasoning, kContent, kCalls, kDone };
  void step(std::vector<OutputEvent>* ev, bool at_end);
  bool parse_calls(std::vector<OutputEvent>* ev, bool at_end);  // false: need more input
  void emit(std::vector<OutputEvent>* ev, OutputEvent::Kind kind, std::string_view text);
  // Emits buf_[0, eos) as `kind` and ends the output at the EOS marker found at `eos`.
  void finish_at_eos(std::vector<OutputEvent>* ev, OutputEvent::Kind kind, size_t eos);

  State state_;
  std::string buf_;     // text not yet turned into events
  size_t scan_ = 0;     // bytes of buf_ already known not to hold the marker being searched
  size_t calls_pos_ = 0;       // kCalls: unused parse cursor (invokes are erased once emitted)
  size_t value_scan_ = 0;      // kCalls: where the search for a value's closing tag resumes
  size_t value_scan_from_ = 0; // the value start value_scan_ belongs to
  int calls_in_block_ = 0;     // invokes emitted from the current block
  std::string block_prefix_;   // "\n\n" + opening tag, shown as text if the block is malformed
  bool saw_eos_ = false;
  int n_calls_ = 0;
};

// Whole-completion convenience: the merged events of one feed() + finish().
std::vector<OutputEvent> parse_output(std::string_view text, bool thinking);

}  // namespace fb::tokenizer
