#include "tokenizer/output_parser.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "tokenizer/python_json.h"

namespace fb::tokenizer {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
// Accepted DSML markers: V4.1's fullwidth form plus lenient ASCII pipes (spec/15 §8.3).
constexpr std::array<std::string_view, 2> kDsmlMarks = {"｜DSML｜", "|DSML|"};
// Block openings: V4.1 "<｜DSML｜ calls>" and V4's "<｜DSML｜tool_calls>", each with both marks.
constexpr std::array<std::string_view, 4> kBlockOpen = {"<｜DSML｜ calls>", "<|DSML| calls>", "<｜DSML｜tool_calls>",
                                                         "<|DSML|tool_calls>"};
constexpr size_t kMaxAttrBytes = 1024;

enum class Match { kYes, kPartial, kNo };

// Does s[pos..] start with lit? kPartial when s ends inside a prefix of lit.
Match match_lit(std::string_view s, size_t pos, std::string_view lit) {
  const size_t avail = s.size() - std::min(pos, s.size());
  const size_t n = std::min(avail, lit.size());
  if (s.compare(pos, n, lit.substr(0, n)) != 0) return Match::kNo;
  return n == lit.size() ? Match::kYes : Match::kPartial;
}

// "<" or "</", a DSML mark, an optional space, then one of the names. On kYes, *end is after it.
Match match_tag(std::string_view s, size_t pos, bool closing, std::initializer_list<std::string_view> names,
                size_t* end) {
  Match m = match_lit(s, pos, closing ? "</" : "<");
  if (m != Match::kYes) return m;
  pos += closing ? 2 : 1;
  for (std::string_view mark : kDsmlMarks) {
    m = match_lit(s, pos, mark);
    if (m == Match::kPartial) return m;
    if (m == Match::kNo) continue;
    size_t p = pos + mark.size();
    if (p == s.size()) return Match::kPartial;
    if (s[p] == ' ') ++p;
    bool partial = false;
    for (std::string_view name : names) {
      Match nm = match_lit(s, p, name);
      if (nm == Match::kYes) {
        *end = p + name.size();
        return Match::kYes;
      }
      if (nm == Match::kPartial) partial = true;
    }
    return partial ? Match::kPartial : Match::kNo;
  }
  return Match::kNo;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Parses  ATTR="VALUE"  after optional whitespace at *pos. kYes fills *value and advances *pos.
Match parse_attr(std::string_view s, size_t* pos, std::string_view attr, std::string* value) {
  size_t p = *pos;
  while (p < s.size() && is_ws(s[p])) ++p;
  if (p == s.size()) return Match::kPartial;
  Match m = match_lit(s, p, attr);
  if (m != Match::kYes) return m;
  p += attr.size();
  m = match_lit(s, p, "=\"");
  if (m != Match::kYes) return m;
  p += 2;
  const size_t q = s.find('"', p);
  if (q == std::string_view::npos) return s.size() - p > kMaxAttrBytes ? Match::kNo : Match::kPartial;
  if (q - p > kMaxAttrBytes || s.substr(p, q - p).find('\n') != std::string_view::npos) return Match::kNo;
  *value = std::string(s.substr(p, q - p));
  *pos = q + 1;
  return Match::kYes;
}

// Longest suffix of s that is a proper prefix of one of the markers (held back while streaming).
size_t holdback(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t k = std::min(m.size() - 1, s.size()); k > best; --k) {
      if (s.substr(s.size() - k) == m.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

ParsedToolCall finish_call(std::string name, std::vector<ToolParam> params) {
  ParsedToolCall c;
  c.name = std::move(name);
  std::string args = "{";
  for (size_t i = 0; i < params.size(); ++i) {
    ToolParam& p = params[i];
    if (i) args += ", ";
    args += python_json_string(p.name) + ": ";
    if (p.is_string) {
      p.value = p.raw;
      args += python_json_string(p.raw);
    } else {
      json v = json::parse(p.raw, nullptr, /*allow_exceptions=*/false);
      p.valid_json = !v.is_discarded();
      p.value = p.valid_json ? std::move(v) : json(p.raw);
      c.valid_json = c.valid_json && p.valid_json;
      args += p.raw;
    }
  }
  c.arguments = args + "}";
  c.params = std::move(params);
  return c;
}

}  // namespace

OutputParser::OutputParser(bool thinking) : state_(thinking ? State::kReasoning : State::kContent) {}

void OutputParser::emit(std::vector<OutputEvent>* ev, OutputEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!ev->empty() && ev->back().kind == kind && kind != OutputEvent::Kind::kToolCall) {
    ev->back().text.append(text);
    return;
  }
  OutputEvent e{kind, std::string(text), {}};
  ev->push_back(std::move(e));
}

void OutputParser::finish_at_eos(std::vector<OutputEvent>* ev, OutputEvent::Kind kind, size_t eos) {
  emit(ev, kind, std::string_view(buf_).substr(0, eos));
  saw_eos_ = true;
  state_ = State::kDone;
  buf_.clear();
}

std::vector<OutputEvent> OutputParser::feed(std::string_view text) {
  std::vector<OutputEvent> ev;
  if (state_ == State::kDone) return ev;
  buf_.append(text);
  step(&ev, /*at_end=*/false);
  return ev;
}

std::vector<OutputEvent> OutputParser::finish() {
  std::vector<OutputEvent> ev;
  if (state_ != State::kDone) step(&ev, /*at_end=*/true);
  state_ = State::kDone;
  buf_.clear();
  return ev;
}

void OutputParser::step(std::vector<OutputEvent>* ev, bool at_end) {
  // Every iteration consumes input or changes state forward; bounded by the buffer length.
  for (;;) {
    if (state_ == State::kReasoning) {
      const size_t from = scan_ > 32 ? scan_ - 32 : 0;
      const size_t think = buf_.find(kThinkEnd, from), eos = buf_.find(kEos, from);
      if (eos != std::string::npos && (think == std::string::npos || eos < think)) {
        finish_at_eos(ev, OutputEvent::Kind::kReasoning, eos);
        return;
      }
      if (think != std::string::npos) {
        emit(ev, OutputEvent::Kind::kReasoning, std::string_view(buf_).substr(0, think));
        buf_.erase(0, think + kThinkEnd.size());
        scan_ = 0;
        state_ = State::kContent;
        continue;
      }
      const size_t hold = at_end ? 0 : holdback(buf_, {kThinkEnd, kEos});
      emit(ev, OutputEvent::Kind::kReasoning, std::string_view(buf_).substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      scan_ = buf_.size();
      return;
    }
    if (state_ == State::kContent) {
      size_t best = std::string::npos, best_len = 0;
      const size_t from = scan_ > 32 ? scan_ - 32 : 0;
      for (std::string_view m : kBlockOpen) {
        const size_t p = buf_.find(m, from);
        if (p < best) best = p, best_len = m.size();
      }
      const size_t eos = buf_.find(kEos, from);
      if (eos != std::string::npos && eos < best) {
        finish_at_eos(ev, OutputEvent::Kind::kText, eos);
        return;
      }
      if (best != std::string::npos) {
        // The "\n\n" before a call block belongs to the block, not to the answer.
        size_t text_end = best;
        if (best >= 2 && buf_.compare(best - 2, 2, "\n\n") == 0) text_end = best - 2;
        emit(ev, OutputEvent::Kind::kText, std::string_view(buf_).substr(0, text_end));
        block_prefix_ = buf_.substr(text_end, best + best_len - text_end);
        buf_.erase(0, best + best_len);
        calls_pos_ = 0;
        calls_in_block_ = 0;
        value_scan_ = 0;
        value_scan_from_ = SIZE_MAX;
        scan_ = 0;
        state_ = State::kCalls;
        continue;
      }
      size_t hold = 0;
      if (!at_end) {
        hold = holdback(buf_, {kEos});
        for (std::string_view m : kBlockOpen) {
          hold = std::max(hold, holdback(buf_, {m}));
          const std::string nm = "\n\n" + std::string(m);
          hold = std::max(hold, holdback(buf_, {nm}));
        }
      }
      emit(ev, OutputEvent::Kind::kText, std::string_view(buf_).substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      scan_ = buf_.size();
      return;
    }
    if (state_ == State::kCalls) {
      if (parse_calls(ev, at_end)) continue;
      return;
    }
    return;  // kDone
  }
}

// Parses invokes from buf_[0..]; emits each complete one and erases it. Returns true when the
// state changed (block closed or fell back to text) so step() should continue, false when more
// input is needed.
bool OutputParser::parse_calls(std::vector<OutputEvent>* ev, bool at_end) {
  for (;;) {
    const std::string_view s = buf_;
    size_t p = 0, end = 0;
    while (p < s.size() && is_ws(s[p])) ++p;
    Match m = p == s.size() ? Match::kPartial : match_tag(s, p, true, {"calls>", "tool_calls>"}, &end);
    if (m == Match::kYes) {
      buf_.erase(0, end);
      state_ = State::kContent;  // lenient: text after the block is answer text
      scan_ = 0;
      return true;
    }
    Match inv = p == s.size() ? Match::kPartial : match_tag(s, p, false, {"invoke"}, &end);
    if (m == Match::kPartial || inv == Match::kPartial) {
      if (!at_end) return false;
      inv = Match::kNo;
    }
    std::string name;
    std::vector<ToolParam> params;
    Match r = inv;
    if (inv == Match::kYes) {
      size_t q = end;
      r = parse_attr(s, &q, "name", &name);
      if (r == Match::kYes) r = match_lit(s, q, ">");
      if (r == Match::kYes) {
        ++q;
        // Parameters until the invoke closes.
        for (;;) {
          while (q < s.size() && is_ws(s[q])) ++q;
          if (q == s.size()) {
            r = Match::kPartial;
            break;
          }
          size_t e2 = 0;
          Match close = match_tag(s, q, true, {"invoke>"}, &e2);
          if (close == Match::kYes) {
            q = e2;
            break;
          }
          Match par = match_tag(s, q, false, {"parameter"}, &e2);
          if (par != Match::kYes) {
            r = (close == Match::kPartial || par == Match::kPartial) ? Match::kPartial : Match::kNo;
            break;
          }
          ToolParam tp;
          std::string str;
          size_t a = e2;
          r = parse_attr(s, &a, "name", &tp.name);
          if (r == Match::kYes) r = parse_attr(s, &a, "string", &str);
          if (r == Match::kYes) r = match_lit(s, a, ">");
          if (r == Match::kYes && str != "true" && str != "false") r = Match::kNo;
          if (r != Match::kYes) break;
          ++a;
          // Value: everything up to the closing parameter tag (may span lines). Resume the
          // search where the last feed stopped so long values are scanned once.
          size_t v = value_scan_from_ == a ? std::max(a, value_scan_) : a;
          value_scan_from_ = a;
          size_t vend = std::string::npos, after = 0;
          for (;;) {
            const size_t lt = s.find("</", v);
            if (lt == std::string_view::npos) {
              value_scan_ = s.size() > a + 2 ? s.size() - 2 : a;
              break;
            }
            Match ct = match_tag(s, lt, true, {"parameter>"}, &after);
            if (ct == Match::kYes) {
              vend = lt;
              break;
            }
            if (ct == Match::kPartial) {
              value_scan_ = lt;
              break;
            }
            v = lt + 1;
          }
          if (vend == std::string::npos) {
            r = Match::kPartial;
            break;
          }
          value_scan_ = 0;
        value_scan_from_ = SIZE_MAX;
          tp.is_string = str == "true";
          tp.raw = std::string(s.substr(a, vend - a));
          const bool dup = std::any_of(params.begin(), params.end(), [&](const ToolParam& x) { return x.name == tp.name; });
          if (dup) {
            r = Match::kNo;
            break;
          }
          params.push_back(std::move(tp));
          q = after;
        }
        end = q;
      }
    }
    if (r == Match::kYes) {
      OutputEvent e{OutputEvent::Kind::kToolCall, {}, finish_call(std::move(name), std::move(params))};
      ev->push_back(std::move(e));
      ++n_calls_;
      ++calls_in_block_;
      buf_.erase(0, end);
      value_scan_ = 0;
        value_scan_from_ = SIZE_MAX;
      continue;
    }
    if (r == Match::kPartial && !at_end) return false;
    // Malformed or unterminated: the rest of the block is plain text. Re-scan it as content
    // after the part already shown, so a later well-formed block can still be recognised.
    std::string text = calls_in_block_ == 0 ? block_prefix_ : std::string();
    emit(ev, OutputEvent::Kind::kText, text);
    value_scan_ = 0;
        value_scan_from_ = SIZE_MAX;
    scan_ = 0;
    state_ = State::kContent;
    return true;
  }
}

std::vector<OutputEvent> parse_output(std::string_view text, bool thinking) {
  OutputParser p(thinking);
  std::vector<OutputEvent> ev = p.feed(text);
  for (auto& e : p.finish()) {
    if (!ev.empty() && e.kind != OutputEvent::Kind::kToolCall && ev.back().kind == e.kind) {
      ev.back().text += e.text;
    } else {
      ev.push_back(std::move(e));
    }
  }
  return ev;
}

}  // namespace fb::tokenizer
