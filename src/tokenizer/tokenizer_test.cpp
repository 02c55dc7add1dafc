// Tokenizer unit tests: spec/15 §4 goldens, added tokens, decode and streaming decode,
// invalid UTF-8 policy, Engram map (count and sha256 of spec/15 §5).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "tokenizer/engram_map.h"
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
