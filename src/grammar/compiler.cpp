#include "grammar/compiler.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "base/check.h"
#include "grammar/schema_check.h"

namespace fb::grammar {

namespace {

// [policy] The value is written in one layout, single-line with ", " and ": " separators (xgrammar's
// default when whitespace is not free): a model cannot spend its budget on blanks (random weights
// did, cutting 4 of 100 values at max_tokens), and a DSpark draft agrees with the target more often.
constexpr bool kAnyWhitespace = false;

// The DSML tag marker (spec/15 §2, id 128825): an added token, given its text in the tool-call
// vocabulary only, so response_format grammars never allow it.
constexpr const char* kDsml = "｜DSML｜";

// [policy] Whitespace runs the grammar allows between DSML parameters and inside string="false"
// JSON values: the official layout needs one "\n" there (json.dumps values need one space); the
// output parser skips whitespace between tags, so a longer run would only waste the budget.
constexpr int kToolWhitespace = 1;

// Does any string in the schema carry a length bound? xgrammar drops those bounds when string
// exclusions apply, so such a tool's values keep their bounds and go without the exclusions.
bool has_length_bound(const nlohmann::ordered_json& s) {
  if (s.is_object()) {
    if (s.contains("minLength") || s.contains("maxLength")) return true;
    for (const auto& [k, v] : s.items())
      if (has_length_bound(v)) return true;
  } else if (s.is_array()) {
    for (const auto& v : s)
      if (has_length_bound(v)) return true;
  }
  return false;
}

// One request's grammar state. The reasoning phase (thinking mode) and the tokens after EOS are
// tracked here, outside the matcher, so accept/rollback stay one log.
class GrammarConstraint final : public engine::TokenConstraint {
 public:
  // eos_in_reasoning: the answer may be empty (tool_choice auto), so EOS may end the reasoning
  // as it may without a constraint; otherwise the value (or forced call) has to follow it.
  GrammarConstraint(const xgrammar::CompiledGrammar& g, std::shared_ptr<const std::vector<bool>> markup, int64_t vocab, int32_t eos,
                    int32_t think_end, bool reasoning, bool eos_in_reasoning = false)
      : m_(g, std::vector<int>{eos}), markup_(std::move(markup)), vocab_(vocab), eos_(eos), think_end_(think_end), reasoning_(reasoning),
        eos_in_reasoning_(eos_in_reasoning) {}

  void allowed(std::span<const int32_t> extra, std::vector<uint32_t>* bits) override {
    int n = 0;
    for (int32_t t : extra) {
      FB_CHECK(accept(t)) << "a draft the grammar refuses reached a verify row: token " << t;
      ++n;
    }
    fill(bits);
    rollback(n);
  }

  bool accept(int32_t t) override {
    if (ended_) {  // EOS in the reasoning: the engine stops there, a DSpark block may hold more
      log_.push_back(kAfterEos);
      return true;
    }
    if (reasoning_) {
      if (t == eos_ && eos_in_reasoning_) {
        log_.push_back(kReasoningEos);
        ended_ = true;
        return true;
      }
      if (t == eos_) return false;  // the value has not started
      log_.push_back(t == think_end_ ? kReasoningEnd : kReasoning);
      if (t == think_end_) reasoning_ = false;
      return true;
    }
    if (m_.IsTerminated()) {  // past EOS: the engine stops there, a DSpark block may hold more
      log_.push_back(kAfterEos);
      return true;
    }
    // Markup ids are refused here: the matcher would refuse them too, with a log line each.
    if (t < 0 || t >= vocab_ || (t != eos_ && (*markup_)[size_t(t)]) || !m_.AcceptToken(t)) return false;
    log_.push_back(kMatcher);
    return true;
  }

  void rollback(int n) override {
    FB_CHECK_LE(size_t(n), log_.size());
    for (; n > 0; --n) {
      const Entry e = log_.back();
      log_.pop_back();
      if (e == kMatcher) m_.Rollback(1);
      if (e == kReasoningEnd) reasoning_ = true;
      if (e == kReasoningEos) ended_ = false;
    }
  }

 private:
  enum Entry : uint8_t { kReasoning, kReasoningEnd, kReasoningEos, kMatcher, kAfterEos };

  void fill(std::vector<uint32_t>* bits) {
    const size_t words = size_t(xgrammar::GetBitmaskSize(int(vocab_)));
    bits->assign(words, 0);
    auto set = [&](int64_t t) { (*bits)[size_t(t / 32)] |= 1u << (t % 32); };
    if (ended_) {
      set(eos_);
      return;
    }
    if (reasoning_) {
      for (int64_t t = 0; t < vocab_; ++t) set(t);
      if (!eos_in_reasoning_) (*bits)[size_t(eos_ / 32)] &= ~(1u << (eos_ % 32));
      return;
    }
    if (m_.IsTerminated()) {
      set(eos_);
      return;
    }
    DLTensor d{};
    int64_t shape[1] = {int64_t(words)};
    d.data = bits->data();
    d.device = DLDevice{kDLCPU, 0};
    d.ndim = 1;
    d.dtype = DLDataType{kDLInt, 32, 1};
    d.shape = shape;
    m_.FillNextTokenBitmask(&d);
  }

  xgrammar::GrammarMatcher m_;
  std::shared_ptr<const std::vector<bool>> markup_;  // [vocab] ids no grammar allows (special, added, unused)
  int64_t vocab_;
  int32_t eos_, think_end_;
  bool reasoning_;
  bool eos_in_reasoning_;
  bool ended_ = false;
  std::vector<Entry> log_;
};

}  // namespace

struct Compiler::Impl {
  std::unique_ptr<xgrammar::GrammarCompiler> xg;
  // Tool calls: the same vocabulary plus the DSML marker token and tokens whose only control
  // bytes are "\n" (the DSML layout and raw string values need newlines).
  std::unique_ptr<xgrammar::GrammarCompiler> xg_tools;
  std::mutex mu;  // compile() from several HTTP threads
  std::shared_ptr<const std::vector<bool>> markup, markup_tools;
  int32_t eos = 0, think_end = -1;
};

Compiler::~Compiler() = default;

Result<std::unique_ptr<Compiler>> Compiler::create(const tokenizer::Tokenizer& tok, int64_t vocab_size, int32_t eos_id) {
  if (vocab_size < tok.vocab_size()) return FB_ERROR(kInvalidArgument) << "model vocabulary " << vocab_size << " is smaller than the tokenizer's " << tok.vocab_size();
  if (eos_id < 0 || eos_id >= vocab_size) return FB_ERROR(kInvalidArgument) << "EOS id " << eos_id << " is outside the vocabulary";
  std::vector<std::string> vocab(static_cast<size_t>(vocab_size)), tool_vocab(static_cast<size_t>(vocab_size));
  auto markup = std::make_shared<std::vector<bool>>(size_t(vocab_size), true);
  auto markup_tools = std::make_shared<std::vector<bool>>(size_t(vocab_size), true);
  // Tokens carrying a control byte (< 0x20) are never allowed either: in valid JSON those bytes are
  // only whitespace between tokens, which the single-line layout (kAnyWhitespace) excludes, and
  // xgrammar 0.2.9 let a raw 0x03 into a string with maxLength (found by the 100-seed run).
  auto has_control = [](const std::string& b) { return std::any_of(b.begin(), b.end(), [](char ch) { return (unsigned char)ch < 0x20; }); };
  // Tool calls: "\n" is the one control byte a token may carry (inside JSON strings xgrammar's
  // bounded-string class lets a raw tab through, as it did 0x03 above; a raw "\n" it refuses).
  auto has_control_but_newline = [](const std::string& b) {
    return std::any_of(b.begin(), b.end(), [](char ch) { return (unsigned char)ch < 0x20 && ch != '\n'; });
  };
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    if (tok.is_added(i) || tok.is_special(i) || tok.token_bytes(i).empty()) continue;
    const std::string& b = tok.token_bytes(i);
    if (!has_control(b)) {
      vocab[size_t(i)] = b;
      (*markup)[size_t(i)] = false;
    }
    if (!has_control_but_newline(b)) {
      tool_vocab[size_t(i)] = b;
      (*markup_tools)[size_t(i)] = false;
    }
  }
  const int32_t dsml = tok.token_id(kDsml);
  if (dsml < 0 || dsml >= vocab_size) return FB_ERROR(kInvalidArgument) << "the tokenizer has no " << kDsml << " token";
  tool_vocab[size_t(dsml)] = kDsml;
  (*markup_tools)[size_t(dsml)] = false;
  std::unique_ptr<Compiler> c(new Compiler());
  c->vocab_size_ = vocab_size;
  c->impl_ = std::make_unique<Impl>();
  c->impl_->eos = eos_id;
  c->impl_->markup = std::move(markup);
  c->impl_->markup_tools = std::move(markup_tools);
  c->impl_->think_end = tok.token_id("</think>");
  try {  // xgrammar reports errors by exceptions: caught at this boundary and in compile()
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, int(vocab_size), std::vector<int32_t>{eos_id});
    // One compile thread: compiles run on the HTTP threads, beside the engine thread's decoding.
    c->impl_->xg = std::make_unique<xgrammar::GrammarCompiler>(info, 1, true);
    xgrammar::TokenizerInfo tool_info(tool_vocab, xgrammar::VocabType::RAW, int(vocab_size), std::vector<int32_t>{eos_id});
    c->impl_->xg_tools = std::make_unique<xgrammar::GrammarCompiler>(tool_info, 1, true);
  } catch (const std::exception& e) {
    return FB_ERROR(kInternal) << "grammar vocabulary: " << e.what();
  }
  return c;
}

Result<std::shared_ptr<engine::TokenConstraint>> Compiler::compile(const ResponseFormat& f) const {
  std::string schema;
  bool strict = f.strict;
  if (f.kind == ResponseFormat::Kind::kJsonObject) {
    schema = R"({"type":"object"})";
    strict = false;  // any members
  } else {
    FB_RETURN_IF_ERROR(check_schema(f.schema));
    schema = f.schema.dump();
  }
  std::shared_ptr<engine::TokenConstraint> out;
  try {
    std::lock_guard<std::mutex> l(impl_->mu);
    xgrammar::CompiledGrammar g = impl_->xg->CompileJSONSchema(schema, kAnyWhitespace, std::nullopt, std::nullopt, strict);
    // A schema no value satisfies (e.g. an integer range with no integer in it) compiles to a
    // grammar that allows nothing at its start.
    GrammarConstraint probe(g, impl_->markup, vocab_size_, impl_->eos, impl_->think_end, false);
    std::vector<uint32_t> bits;
    probe.allowed({}, &bits);
    if (std::all_of(bits.begin(), bits.end(), [](uint32_t w) { return w == 0; }))
      return FB_ERROR(kInvalidArgument) << "response_format schema: no JSON value satisfies it";
    out = std::make_shared<GrammarConstraint>(g, impl_->markup, vocab_size_, impl_->eos, impl_->think_end, f.after_reasoning);
  } catch (const std::exception& e) {
    return FB_ERROR(kInvalidArgument) << "response_format schema: " << e.what();
  }
  return out;
}

Result<nlohmann::ordered_json> Compiler::tool_call_structural_tag(const ToolCallFormat& f) {
  using oj = nlohmann::ordered_json;
  const std::string m = kDsml;
  auto find = [&](const std::string& name) -> const ToolSpec* {
    for (const ToolSpec& t : f.tools)
      if (t.name == name) return &t;
    return nullptr;
  };
  // One invoke of tool t: "<｜DSML｜ invoke name="N">\n" + parameters + "</｜DSML｜ invoke>\n" (the "\n"
  // joining invokes, and the one before "</｜DSML｜ calls>", is the end of each invoke).
  auto invoke = [&](const ToolSpec& t, bool constrained) -> Result<oj> {
    if (t.name.empty() || t.name.size() > 256) return FB_ERROR(kInvalidArgument) << "tool name '" << t.name << "' must have 1 to 256 bytes";
    for (unsigned char ch : t.name)
      if (ch < 0x20 || ch == '"' || ch == '<' || ch == '>')
        return FB_ERROR(kInvalidArgument) << "tool name '" << t.name << "' has a character the DSML tool-call syntax cannot carry (control, '\"', '<' or '>')";
    if (t.name.find(m) != std::string::npos || t.name.find("|DSML|") != std::string::npos)
      return FB_ERROR(kInvalidArgument) << "tool name '" << t.name << "' contains the DSML marker";
    oj schema = oj::object();  // no schema, or a non-strict tool under auto: any parameters
    if (constrained && !t.parameters.is_null()) {
      const oj& p = t.parameters;
      if (!p.is_object()) return FB_ERROR(kInvalidArgument) << "tool '" << t.name << "': 'parameters' must be a JSON schema object";
      if (p.contains("type") && p["type"] != "object")
        return FB_ERROR(kInvalidArgument) << "tool '" << t.name << "': 'parameters' must be an object schema (type \"object\"), got type " << p["type"].dump();
      for (const char* k : {"anyOf", "enum", "const"})
        if (p.contains(k)) return FB_ERROR(kInvalidArgument) << "tool '" << t.name << "': '" << k << "' at the top of 'parameters' is not supported (the arguments must be one object of named parameters)";
      FB_RETURN_IF_ERROR(check_schema(p, "tool '" + t.name + "' parameters schema"));
      schema = p;
    }
    oj args = {{"type", "json_schema"}, {"json_schema", schema}, {"style", "deepseek_v4_1_xml"}, {"max_whitespace_cnt", kToolWhitespace}};
    // String values (raw, and JSON strings inside string="false" values) never contain a DSML
    // marker, so no value can hold a tag the output parser would take for the end of the value
    // (the format has no escape, spec/15 §8.2). Not with length bounds (see has_length_bound):
    // there a value could spell "</｜DSML｜parameter>" in theory; the grammar still ends it only
    // at the real closing tag.
    if (!has_length_bound(schema)) args["excludes"] = oj::array({m, "|DSML|"});
    return oj{{"type", "tag"}, {"begin", "<" + m + " invoke name=\"" + t.name + "\">\n"}, {"content", args}, {"end", "</" + m + " invoke>\n"}};
  };
  auto invokes = [&](bool only_strict) -> Result<oj> {
    oj tags = oj::array();
    for (const ToolSpec& t : f.tools) tags.push_back(FB_TRY(invoke(t, !only_strict || t.strict)));
    return oj{{"type", "tags_with_separator"}, {"tags", tags}, {"separator", ""}, {"at_least_one", true}, {"stop_after_first", !f.parallel}};
  };
  const std::string open = "\n\n<" + m + " calls>\n", close = "</" + m + " calls>";
  oj format;
  switch (f.choice) {
    case ToolCallFormat::Choice::kNamed: {
      const ToolSpec* t = find(f.name);
      if (!t) return FB_ERROR(kInvalidArgument) << "tool_choice names function '" << f.name << "', which is not among the request's tools";
      format = {{"type", "sequence"}, {"elements", oj::array({oj{{"type", "const_string"}, {"value", open}}, FB_TRY(invoke(*t, true)),
                                                               oj{{"type", "const_string"}, {"value", close}}})}};
      break;
    }
    case ToolCallFormat::Choice::kRequired:
      if (f.tools.empty()) return FB_ERROR(kInvalidArgument) << "tool_choice required needs at least one function tool";
      format = {{"type", "sequence"}, {"elements", oj::array({oj{{"type", "const_string"}, {"value", open}}, FB_TRY(invokes(false)),
                                                               oj{{"type", "const_string"}, {"value", close}}})}};
      break;
    case ToolCallFormat::Choice::kAuto: {
      if (f.answer) {
        // The answer format's JSON value, or one calls block (as kRequired's, strict tools only).
        // The value as compile(ResponseFormat) writes it (layout, `strict`), through xgrammar's EBNF:
        // a structural tag's own json_schema element would allow free whitespace and force strict.
        const bool object = f.answer->kind == ResponseFormat::Kind::kJsonObject;
        std::string ebnf;
        try {
          ebnf = xgrammar::Grammar::FromJSONSchema(object ? R"({"type":"object"})" : f.answer->schema.dump(), kAnyWhitespace, std::nullopt,
                                                   std::nullopt, object ? false : f.answer->strict)
                     .ToString();
        } catch (const std::exception& e) {
          return FB_ERROR(kInvalidArgument) << "response_format schema: " << e.what();
        }
        oj json = {{"type", "grammar"}, {"grammar", ebnf}};
        oj calls = {{"type", "sequence"}, {"elements", oj::array({oj{{"type", "const_string"}, {"value", open}}, FB_TRY(invokes(true)),
                                                                oj{{"type", "const_string"}, {"value", close}}})}};
        format = {{"type", "or"}, {"elements", oj::array({json, calls})}};
        break;
      }
      // Free text until "<｜DSML｜ calls>", then one calls block whose invokes name the request's
      // tools, strict tools' arguments conforming to their schemas; after it only EOS.
      oj block = {{"type", "tag"}, {"begin", "<" + m + " calls>\n"}, {"content", FB_TRY(invokes(true))}, {"end", close}};
      format = {{"type", "triggered_tags"}, {"triggers", oj::array({"<" + m + " calls>"})}, {"tags", oj::array({block})}, {"stop_after_first", true}};
      break;
    }
  }
  return oj{{"type", "structural_tag"}, {"format", format}};
}

Result<std::shared_ptr<engine::TokenConstraint>> Compiler::compile(const ToolCallFormat& f) const {
  const bool auto_answer = f.choice == ToolCallFormat::Choice::kAuto && f.answer;
  if (f.choice == ToolCallFormat::Choice::kAuto && !auto_answer && !f.restrict_names &&
      std::none_of(f.tools.begin(), f.tools.end(), [](const ToolSpec& t) { return t.strict; }))
    return std::shared_ptr<engine::TokenConstraint>();
  // The answer's schema alone first: its 400s (unsupported keyword, no value satisfies it) name the
  // response_format, which the calls alternative would otherwise hide.
  if (auto_answer) FB_RETURN_IF_ERROR(compile(*f.answer).status());
  const nlohmann::ordered_json tag = FB_TRY(tool_call_structural_tag(f));
  std::shared_ptr<engine::TokenConstraint> out;
  try {
    std::lock_guard<std::mutex> l(impl_->mu);
    xgrammar::CompiledGrammar g = impl_->xg_tools->CompileStructuralTag(tag.dump());
    GrammarConstraint probe(g, impl_->markup_tools, vocab_size_, impl_->eos, impl_->think_end, false);
    std::vector<uint32_t> bits;
    probe.allowed({}, &bits);
    if (std::all_of(bits.begin(), bits.end(), [](uint32_t w) { return w == 0; }))
      return FB_ERROR(kInvalidArgument) << "tools: no tool call satisfies the tools' parameter schemas";
    // Under auto the answer is optional (EOS may end the reasoning), unless it has a format.
    out = std::make_shared<GrammarConstraint>(g, impl_->markup_tools, vocab_size_, impl_->eos, impl_->think_end, f.after_reasoning,
                                              f.choice == ToolCallFormat::Choice::kAuto && !auto_answer);
  } catch (const std::exception& e) {
    return FB_ERROR(kInvalidArgument) << "tools: " << e.what();
  }
  return out;
}

}  // namespace fb::grammar
