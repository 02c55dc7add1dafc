// Tokenizer unit tests: spec/15 §4 goldens, added tokens, decode and streaming decode,
// invalid UTF-8 policy, Engram map (count and sha256 of spec/15 §5), Unicode 15 pre-tokenizer classes.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include <unicode/uchar.h>

#include "tokenizer/engram_map.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/test_assets.h"
#include "tokenizer/utf8.h"

namespace fb::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

TEST(TokenizerGolden, BaseTexts) {
  const Tokenizer& t = v41_tokenizer();
  EXPECT_EQ(t.vocab_size(), 129280);
  EXPECT_EQ(t.added_tokens().size(), 1283u);
  EXPECT_EQ(t.encode("    int x = 1234;\n中文かなABC\nfoo_bar?!\n"),
            (Ids{361, 688, 1527, 438, 223, 6895, 22, 510, 21134, 49534, 29080, 201, 40897, 100869, 33, 8567}));
  EXPECT_EQ(t.encode(std::string("\xE2\x80\x8B\0", 4)), (Ids{35020, 191}));
  EXPECT_EQ(t.encode("Hello, world!"), (Ids{19923, 14, 2058, 3}));
  EXPECT_EQ(t.encode("I don't know"), (Ids{43, 2090, 1664, 1153}));
  EXPECT_EQ(t.encode("x1234y"), (Ids{90, 6895, 22, 91}));
  EXPECT_EQ(t.encode("<｜begin▁of▁sentence｜>OK<｜end▁of▁sentence｜>"), (Ids{0, 11932, 1}));
  EXPECT_EQ(t.encode("<｜begin▁of▁sentence｜><｜User｜>Answer with only the number: 2048 divided by 128 is"
                     "<｜Assistant｜></think>"),
            (Ids{0, 128803, 7805, 418, 1353, 270, 1167, 28, 223, 11154, 26, 7203, 513, 223, 7833, 344, 128804, 128822}));
}

TEST(TokenizerGolden, V41Prompts) {
  const Tokenizer& t = v41_tokenizer();
  EXPECT_EQ(t.encode("<｜begin▁of▁sentence｜><｜System｜>You are a helpful assistant.<｜User｜>What is 2+2?"
                     "<｜Assistant｜></think>"),
            (Ids{0, 128799, 3476, 477, 260, 11502, 22896, 16, 128803, 3085, 344, 223, 20, 13, 20, 33, 128804, 128822}));
  const Ids think = t.encode(
      "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more "
      "thorough the reasoning)\n\nYou are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
  EXPECT_EQ(think.size(), 43u);
  EXPECT_EQ(think, (Ids{0,     128799, 77666, 288,   9504, 482,  28,   223,    2402,   343,   16801,
                        223,   19,     15,    1457,  14,   270,  4077, 270,    1990,   14,    270,
                        850,   15146,  270,   22805, 868,  3476, 477,  260,    11502,  22896, 16,
                        128803, 3085,  344,   223,   20,   13,   20,   33,     128804, 128821}));
  EXPECT_EQ(t.encode("Simple arithmetic.</think>2 + 2 = 4.<｜end▁of▁sentence｜>"),
            (Ids{40593, 29568, 16, 128822, 20, 940, 223, 20, 438, 223, 22, 16, 1}));
  EXPECT_EQ(t.encode("<｜User｜><｜deepseek_image｜>\n\nWhat is in this image?<｜Assistant｜></think>"),
            (Ids{128803, 129264, 271, 3085, 344, 295, 566, 4609, 33, 128804, 128822}));
  EXPECT_EQ(t.encode("<｜User｜><tool_result>{\"temp_c\": 18}</tool_result><｜Assistant｜><think>"),
            (Ids{128803, 30, 72461, 46148, 32, 24313, 26343, 4941, 3362, 223, 864, 24568, 72461, 46148, 32, 128804,
                 128821}));
  EXPECT_EQ(
      t.encode("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
               "string=\"true\">Paris</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" "
               "string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>"),
      (Ids{271,    30,    128825, 10699, 1018, 30,    128825, 34756, 2329,  1281,   1133,  65,    50219, 3816,
           30,     128825, 10767, 2329,  1281, 37399, 4,      3418,  1281,  11476,  3320,  51119, 1718,  128825,
           10767,  1018,  30,     128825, 10767, 2329, 1281,  28026, 4,     3418,   1281,  19836, 3320,  21,
           1718,   128825, 10767, 1018,  1718,  128825, 34756, 1018, 1718,  128825, 10699,  32,    1}));
}

TEST(Tokenizer, AddedTokensAndFlags) {
  const Tokenizer& t = v41_tokenizer();
  EXPECT_EQ(t.token_id("<｜System｜>"), 128799);
  EXPECT_EQ(t.token_id("｜DSML｜"), 128825);
  EXPECT_EQ(t.token_id("<|EOT|>"), 128805);
  EXPECT_EQ(t.token_id("<|place_holder_mm_span_0442|>"), 129279);
  EXPECT_EQ(t.token_id("<｜deepseek_image｜>"), 129264);
  EXPECT_EQ(t.token_id("Ġthe"), 270);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_FALSE(t.is_special(128803));
  // Longest match wins: "</dsml:" (128841) over "<" + "/dsml:".
  EXPECT_EQ(t.encode("</dsml:"), (Ids{128841}));
  // Matching can be switched off for untrusted spans.
  EncodeOptions plain;
  plain.match_added_tokens = false;
  const Ids ids = t.encode("<think>", plain);
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(t.decode(ids), "<think>");
  EXPECT_EQ(t.decode(Ids{0, 11932, 1}, /*skip_special=*/true), "OK");
}

TEST(Tokenizer, InvalidUtf8IsReplacedPerMaximalSubpart) {
  const Tokenizer& t = v41_tokenizer();
  const std::string bad = "a\xC3(b\xE2\x82z\xF0\x9F\x98\xFF\xC0";
  EXPECT_EQ(utf8_sanitize(bad), "a\xEF\xBF\xBD(b\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(t.encode(bad)), utf8_sanitize(bad));
  EXPECT_EQ(t.encode(std::string(1, '\x80')), t.encode("\xEF\xBF\xBD"));
}

TEST(Tokenizer, StreamingDecodeHoldsPartialCharacters) {
  const Tokenizer& t = v41_tokenizer();
  const std::string text = "emoji 👩‍👩‍👧 中文 ﷺ مرحبا <think>x</think>";
  const Ids ids = t.encode(text);
  StreamDecoder d(t);
  std::string acc;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    EXPECT_TRUE(utf8_is_valid(piece));
    acc += piece;
  }
  acc += d.finish();
  EXPECT_EQ(acc, text);
  // Byte at a time: nothing is emitted until the character completes.
  StreamDecoder b(t);
  EXPECT_EQ(b.push_bytes("\xE4"), "");
  EXPECT_EQ(b.push_bytes("\xB8"), "");
  EXPECT_EQ(b.push_bytes("\xAD"), "中");
  EXPECT_EQ(b.push_bytes("\xE4"), "");
  EXPECT_EQ(b.push_bytes("A"), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(b.push_bytes("\xF0\x9F"), "");
  EXPECT_EQ(b.finish(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, LongRunsAreFast) {
  const Tokenizer& t = v41_tokenizer();
  for (const std::string& unit : {std::string("a"), std::string(" "), std::string("9"), std::string("中"),
                                  std::string("ab"), std::string("\n"), std::string("!")}) {
    std::string s;
    for (int i = 0; i < 200000; ++i) s += unit;
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = t.encode(s);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(t.decode(ids), s);
    EXPECT_LT(ms, 2000.0) << "unit '" << unit << "' took " << ms << " ms";
  }
}

// Code points first assigned in Unicode 15.0-16.0 (PCRE2 10.42's tables: unassigned). Expected
// ids are HF `tokenizers` 0.23.3 (Oniguruma, Unicode 16.0); the PCRE2-table build got all wrong.
TEST(TokenizerUnicode15, MatchesHf) {
  const Tokenizer& t = v41_tokenizer();
  EXPECT_EQ(t.encode(" \U0001FAF8!"), (Ids{7351, 107, 119, 3}));  // U+1FAF8 So
  EXPECT_EQ(t.encode("hi \U0001FA77 \U0001FAF8 ok"), (Ids{6366, 7351, 105, 118, 7351, 107, 119, 9109}));
  EXPECT_EQ(t.encode("a \U00031350\U00031351"), (Ids{67, 86387, 112, 238, 241, 175, 112, 238, 242}));  // CJK ext. H
  EXPECT_EQ(t.encode(" \U00011F04\U00011F00"), (Ids{86387, 242, 123, 229, 175, 242, 123, 225}));  // Kawi Lo, Mn
  EXPECT_EQ(t.encode(" \U00011F43"), (Ids{86387, 242, 123888}));                                   // Kawi Po
  EXPECT_EQ(t.encode(" \U0001E4D0\U0001E4D1"), (Ids{86387, 255, 244, 241, 175, 255, 244, 242}));  // Nag Mundari
  EXPECT_EQ(t.encode("abc \U0001DF25"), (Ids{32372, 83689, 123, 101}));  // Latin ext. G, Ll
  // HF's Oniguruma is Unicode 16.0: 15.1 (CJK ext. I, IDCs) and 16.0 additions come from the table.
  EXPECT_EQ(t.encode(" \U0002EBF0\U0002EBF1"), (Ids{86387, 109, 110, 111, 175, 109, 110, 112}));
  EXPECT_EQ(t.encode(" \u2FFC!"), (Ids{1327, 126, 123, 3}));
  EXPECT_EQ(t.encode(" \U00010D4A"), (Ids{86387, 241, 116, 235}));  // Garay letter
  // U+180E (Cf) is not \s for HF (it is for PCRE2).
  EXPECT_EQ(t.encode(" \u180E"), (Ids{223, 115522, 239}));
}

std::vector<std::string> pieces(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string> out;
  p.split(text, [&](std::string_view s) { out.emplace_back(s); });
  return out;
}

TEST(TokenizerUnicode15, PreTokenizerClasses) {
  auto p = PreTokenizer::create({"\\p{N}{1,3}", "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|\\s+"});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // Nag Mundari digits (Nd): runs of at most 3.
  const std::string d = "\U0001E4F0";
  EXPECT_EQ(pieces(*p, d + d + d + d), (std::vector<std::string>{d + d + d, d}));
  // Kawi letter + sign (Lo, Mn) is one word with a leading space; U+1FAF8 (So) is punctuation-like.
  EXPECT_EQ(pieces(*p, " \U00011F04\U00011F00 \U0001FAF8!x"),
            (std::vector<std::string>{" \U00011F04\U00011F00", " \U0001FAF8!", "x"}));
}

TEST(TokenizerUnicode15, ExpandUnicodeProperties) {
  using P = PreTokenizer;
  const std::string_view F = "";  // full expansion
  const std::string n = P::expand_unicode_properties("\\p{N}{1,3}", F);
  EXPECT_EQ(n.front(), '[');
  EXPECT_NE(n.find("\\x{30}-\\x{39}"), std::string::npos);
  EXPECT_NE(n.find("\\x{1E4F0}-\\x{1E4F9}"), std::string::npos);  // Unicode 15
  EXPECT_EQ(n.substr(n.size() - 6), "]{1,3}");
  // \pN, \p{N} and \P{^N} are the same set; \P{N} and \p{^N} its complement.
  EXPECT_EQ(P::expand_unicode_properties("\\pN", F), P::expand_unicode_properties("\\p{N}", F));
  EXPECT_EQ(P::expand_unicode_properties("\\P{^N}", F), P::expand_unicode_properties("\\p{N}", F));
  EXPECT_EQ(P::expand_unicode_properties("\\P{N}", F), P::expand_unicode_properties("\\p{^N}", F));
  EXPECT_EQ(P::expand_unicode_properties("\\P{N}", F).rfind("[\\x{0}-\\x{2F}\\x{3A}-", 0), 0u);
  // In a class the escapes of a run merge into one range list; other items stay as written.
  const std::string c = P::expand_unicode_properties("[^\\r\\n\\p{L}\\p{M}x]", F);
  EXPECT_EQ(c.rfind("[^\\r\\n\\x{41}-\\x{5A}", 0), 0u);
  EXPECT_EQ(c.substr(c.size() - 2), "x]");
  EXPECT_EQ(c.find("\\p"), std::string::npos);
  // Left to PCRE2: non-category names, \d/\w/\s, escapes next to a range dash, literal text,
  // POSIX classes, caseless patterns, surrogate-only categories.
  for (const char* keep : {"\\p{Han}\\p{Xan}\\d\\w\\h\\v", "[a\\p{L}-z]", "[a-\\p{L}]", "[+-\\p{L}]", "\\Q\\p{L}\\E",
                           "[[:alpha:]]", "(?i)\\p{Lu}", "\\p{Cs}", "[\\p{L}"})
    EXPECT_EQ(P::expand_unicode_properties(keep, F), keep);
  EXPECT_EQ(P::expand_unicode_properties("[\\]\\p{Zl}]", F), "[\\]\\x{2028}]");
  const std::string lc = P::expand_unicode_properties("\\p{LC}", F);  // [...]
  EXPECT_EQ(P::expand_unicode_properties("\\p{Zp}+[-\\p{L&}-]", F),
            "[\\x{2029}]+[-" + lc.substr(1, lc.size() - 2) + "-]");
  // Hybrid (what create() does): PCRE2's own \p{X} plus ICU's members newer than its tables.
  EXPECT_EQ(P::engine_unicode_version().rfind("14.0", 0), 0u) << "Debian 12 PCRE2 10.42";
  const std::string hn = P::expand_unicode_properties("\\p{N}{1,3}", "14.0.0");
  EXPECT_EQ(hn.rfind("[\\p{N}\\x{", 0), 0u) << hn;
  EXPECT_NE(hn.find("\\x{1E4F0}-\\x{1E4F9}"), std::string::npos);  // Unicode 15.0 (ICU)
  EXPECT_NE(hn.find("\\x{1CCF0}-\\x{1CCF9}"), std::string::npos);  // Unicode 16.0 (table)
  EXPECT_EQ(hn.find("\\x{30}"), std::string::npos);
  EXPECT_EQ(P::expand_unicode_properties("\\P{N}", "14.0.0"), "[^" + hn.substr(1, hn.size() - 1 - 5));
  const std::string hp = P::expand_unicode_properties("[\\p{P}\\p{Zs}]", "14.0.0");
  EXPECT_EQ(hp.rfind("[\\p{P}\\p{Zs}\\x{", 0), 0u) << hp;
  EXPECT_NE(hp.find("\\x{11F43}-\\x{11F4F}"), std::string::npos);
  EXPECT_EQ(P::expand_unicode_properties("\\pZ", "14.0.0"), "\\p{Z}");  // nothing new
  EXPECT_EQ(P::expand_unicode_properties("\\s+(?!\\S)", "14.0.0"),
            "[\\x{9}-\\x{D}\\x{85}\\p{Z}]+(?![^\\x{9}-\\x{D}\\x{85}\\p{Z}])");
  EXPECT_EQ(P::expand_unicode_properties("\\s", F).rfind("[\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-", 0),
            0u);
  EXPECT_EQ(P::expand_unicode_properties("[^\\P{N}]", "14.0.0"), P::expand_unicode_properties("[^\\P{N}]", F));
  EXPECT_EQ(P::expand_unicode_properties("\\p{Cn}", "14.0.0"), P::expand_unicode_properties("\\p{Cn}", F));
  // An engine newer than ICU: only the table is added.
  const std::string h99 = P::expand_unicode_properties("\\p{L}", "99.0.0");
  EXPECT_EQ(h99.rfind("[\\p{L}\\x{", 0), 0u);
  EXPECT_NE(h99.find("\\x{2EBF0}-\\x{2EE5D}"), std::string::npos);
  EXPECT_EQ(h99.find("\\x{31350}"), std::string::npos);
  // The table only adds code points ICU does not know.
  EXPECT_EQ(P::general_category_mask(0x2EBF0), uint32_t(U_GC_LO_MASK));  // CJK ext. I (15.1)
  EXPECT_EQ(P::general_category_mask(0x1CCF0), uint32_t(U_GC_ND_MASK));  // Unicode 16.0
  EXPECT_EQ(u_charType(0x2EBF0), U_UNASSIGNED);
}

// Every code point of planes 0-3 and 14 (but surrogates and '!'; planes 4-13 and the private-use
// planes 15-16 sampled) against general_category_mask() (ICU + the Unicode 16.0 table), for the
// categories of the DeepSeek patterns, a few more and \s; \p and \P (also inside a class),
// hybrid (create()) and fully expanded; and split()'s fast path (pattern as written, subjects
// below U+0800) for every code point it is used for.
TEST(TokenizerUnicode15, ClassesMatchIcuForEveryCodePoint) {
  std::string subject;
  std::vector<UChar32> cps;
  for (UChar32 c = 0; c <= 0x10FFFF; ++c) {
    if ((c >= 0xD800 && c <= 0xDFFF) || c == '!') continue;
    if ((c >= 0x40000 && c < 0xE0000) || c >= 0xF0000) {
      if (c % 0x101 != 0 && (c & 0xFFFF) < 0xFFFD) continue;
    }
    cps.push_back(c);
    utf8_append(&subject, char32_t(c));
    subject += '!';
  }
  for (const char* name : {"L", "M", "N", "P", "S", "Lu", "Ll", "Nd", "L&", "Cn", "Co", "s"}) {
    const bool space = std::string_view(name) == "s";  // \s: Z, \t-\r, U+0085
    const int32_t mask = u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY_MASK,
                                                space ? "Z" : std::string_view(name) == "L&" ? "LC" : name);
    ASSERT_NE(mask, UCHAR_INVALID_CODE) << name;
    for (const bool negate : {false, true}) {
      const std::string esc = space ? (negate ? "\\S" : "\\s") : std::string(negate ? "\\P{" : "\\p{") + name + "}";
      for (const bool full : {false, true}) {
        for (const bool in_class : {false, true}) {
          if (in_class && !negate) continue;  // [\P{X}]: the full-expansion branch for negations
          // `X!` is one piece when X matches; otherwise X is a gap and '!' a piece of its own.
          const std::string e = in_class ? "[" + esc + "]" : esc;
          const std::string pattern = (full ? PreTokenizer::expand_unicode_properties(e, "") : e) + "!|!";
          auto p = PreTokenizer::create({pattern});
          ASSERT_TRUE(p.ok()) << p.status().to_string();
          std::vector<bool> got;
          p->split(subject, [&](std::string_view s) {
            if (s != "!") got.push_back(s.back() == '!');
          });
          ASSERT_EQ(got.size(), cps.size()) << esc;
          size_t bad = 0;
          for (size_t k = 0; k < cps.size(); ++k) {
            const bool want = ((PreTokenizer::general_category_mask(char32_t(cps[k])) & uint32_t(mask)) != 0 ||
                               (space && ((cps[k] >= 9 && cps[k] <= 13) || cps[k] == 0x85))) != negate;
            if (got[k] != want && ++bad <= 3)
              ADD_FAILURE() << e << (full ? " full" : " hybrid") << " U+" << std::hex << cps[k];
          }
          // One code point below U+0800 per subject: split() takes the pattern as written there
          // (PCRE2's own tables; no newer code point or U+180E can occur).
          for (UChar32 c = 0; c < 0x800; ++c) {
            if (c == '!') continue;
            std::string one;
            utf8_append(&one, char32_t(c));
            std::vector<std::string> ps;
            p->split(one + "!", [&](std::string_view s) { ps.emplace_back(s); });
            const bool want = ((PreTokenizer::general_category_mask(char32_t(c)) & uint32_t(mask)) != 0 ||
                               (space && ((c >= 9 && c <= 13) || c == 0x85))) != negate;
            EXPECT_EQ(ps.size() == 1, want) << e << " U+" << std::hex << c;
          }
        }
      }
    }
  }
}

TEST(EngramMap, V41CountAndHash) {
  const Tokenizer& t = v41_tokenizer();
  auto m = derive_engram_map(t);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->n_classes, kEngramV41Classes);
  EXPECT_EQ(engram_map_sha256(m->map), kEngramV41Sha256);
  EXPECT_EQ(m->map[0], 0);
  EXPECT_EQ(m->map[1], 1);
  EXPECT_EQ(m->pad_class(), 2);
  for (int32_t id : {455, 1805, 20852, 270, 671}) EXPECT_EQ(m->map[size_t(id)], 237) << id;
  for (int32_t id : {223, 201, 271}) EXPECT_EQ(m->map[size_t(id)], 174) << id;
  EXPECT_EQ(m->map[128803], 98615);
  EXPECT_EQ(m->map[128821], 98633);
  EXPECT_EQ(m->map[128822], 98634);
}

}  // namespace
}  // namespace fb::tokenizer
