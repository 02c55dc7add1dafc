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

// One request's grammar state. The reasoning phase (thinking mode) and the tokens after EOS are
// tracked here, outside the matcher, so accept/rollback stay one log.
class JsonConstraint final : public engine::TokenConstraint {
 public:
  JsonConstraint(const xgrammar::CompiledGrammar& g, std::shared_ptr<const std::vector<bool>> markup, int64_t vocab, int32_t eos,
                 int32_t think_end, bool reasoning)
      : m_(g, std::vector<int>{eos}), markup_(std::move(markup)), vocab_(vocab), eos_(eos), think_end_(think_end), reasoning_(reasoning) {}

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
    if (reasoning_) {
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
    }
  }

 private:
  enum Entry : uint8_t { kReasoning, kReasoningEnd, kMatcher, kAfterEos };

  void fill(std::vector<uint32_t>* bits) {
    const size_t words = size_t(xgrammar::GetBitmaskSize(int(vocab_)));
    bits->assign(words, 0);
    auto set = [&](int64_t t) { (*bits)[size_t(t / 32)] |= 1u << (t % 32); };
    if (reasoning_) {
      for (int64_t t = 0; t < vocab_; ++t) set(t);
      (*bits)[size_t(eos_ / 32)] &= ~(1u << (eos_ % 32));
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
  std::vector<Entry> log_;
};

}  // namespace

struct Compiler::Impl {
  std::unique_ptr<xgrammar::GrammarCompiler> xg;
  std::mutex mu;  // compile() from several HTTP threads
  std::shared_ptr<const std::vector<bool>> markup;
  int32_t eos = 0, think_end = -1;
};

Compiler::~Compiler() = default;

Result<std::unique_ptr<Compiler>> Compiler::create(const tokenizer::Tokenizer& tok, int64_t vocab_size, int32_t eos_id) {
  if (vocab_size < tok.vocab_size()) return FB_ERROR(kInvalidArgument) << "model vocabulary " << vocab_size << " is smaller than the tokenizer's " << tok.vocab_size();
  if (eos_id < 0 || eos_id >= vocab_size) return FB_ERROR(kInvalidArgument) << "EOS id " << eos_id << " is outside the vocabulary";
  std::vector<std::string> vocab(static_cast<size_t>(vocab_size));
  auto markup = std::make_shared<std::vector<bool>>(size_t(vocab_size), true);
  // Tokens carrying a control byte (< 0x20) are never allowed either: in valid JSON those bytes are
  // only whitespace between tokens, which the single-line layout (kAnyWhitespace) excludes, and
  // xgrammar 0.2.9 let a raw 0x03 into a string with maxLength (found by the 100-seed run).
  auto has_control = [](const std::string& b) { return std::any_of(b.begin(), b.end(), [](char ch) { return (unsigned char)ch < 0x20; }); };
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    if (!tok.is_added(i) && !tok.is_special(i) && !tok.token_bytes(i).empty() && !has_control(tok.token_bytes(i))) {
      vocab[size_t(i)] = tok.token_bytes(i);
      (*markup)[size_t(i)] = false;
    }
  std::unique_ptr<Compiler> c(new Compiler());
  c->vocab_size_ = vocab_size;
  c->impl_ = std::make_unique<Impl>();
  c->impl_->eos = eos_id;
  c->impl_->markup = std::move(markup);
  c->impl_->think_end = tok.token_id("</think>");
  try {  // xgrammar reports errors by exceptions: caught at this boundary and in compile()
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, int(vocab_size), std::vector<int32_t>{eos_id});
    // One compile thread: compiles run on the HTTP threads, beside the engine thread's decoding.
    c->impl_->xg = std::make_unique<xgrammar::GrammarCompiler>(info, 1, true);
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
    JsonConstraint probe(g, impl_->markup, vocab_size_, impl_->eos, impl_->think_end, false);
    std::vector<uint32_t> bits;
    probe.allowed({}, &bits);
    if (std::all_of(bits.begin(), bits.end(), [](uint32_t w) { return w == 0; }))
      return FB_ERROR(kInvalidArgument) << "response_format schema: no JSON value satisfies it";
    out = std::make_shared<JsonConstraint>(g, impl_->markup, vocab_size_, impl_->eos, impl_->think_end, f.after_reasoning);
  } catch (const std::exception& e) {
    return FB_ERROR(kInvalidArgument) << "response_format schema: " << e.what();
  }
  return out;
}

}  // namespace fb::grammar
