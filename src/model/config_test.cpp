#include "model/config.h"

#include <gtest/gtest.h>

#include "base/mapped_file.h"
#include "model/schema.h"

namespace fb::model {
namespace {

Config released() {
  auto text = read_file_bytes(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  EXPECT_TRUE(text.ok());
  auto c = Config::from_hf_json(*text);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

TEST(Config, ReleasedRoles) {
  Config c = released();
  ASSERT_EQ(c.roles.size(), 43u);
  EXPECT_EQ(c.roles[0].ratio, 0);
  EXPECT_TRUE(c.roles[2].kv_source && c.roles[2].index_source);
  EXPECT_EQ(c.roles[5].kv_layer, 2);
  EXPECT_EQ(c.roles[5].index_layer, 2);
  EXPECT_EQ(c.roles[13].kv_layer, 8);
  EXPECT_TRUE(c.roles[20].candidate_source);
  EXPECT_FALSE(c.roles[20].pool_restricted);
  EXPECT_TRUE(c.roles[24].index_source && !c.roles[24].kv_source && c.roles[24].pool_restricted);
  EXPECT_EQ(c.roles[24].kv_layer, 20);
  EXPECT_EQ(c.roles[27].index_layer, 24);
  EXPECT_EQ(c.roles[39].index_layer, 36);
  EXPECT_EQ(c.roles[1].engram_table, 0);
  EXPECT_EQ(c.roles[14].engram_table, 1);
  EXPECT_EQ(c.roles[37].dspark_tap, 0);
  EXPECT_EQ(c.roles[39].dspark_tap, 2);
  EXPECT_TRUE(c.roles[40].is_draft);
  EXPECT_EQ(c.roles[41].n_experts, 128);
  EXPECT_EQ(c.roles[41].n_active, 3);
  EXPECT_EQ(c.engram_pad_id, 2);
  EXPECT_TRUE(c.has_vision());
  EXPECT_EQ(c.decoder_start, 20);  // spec/11 §8.1: the encoder is layers 0-19
}

// spec/10 §3.5 and §5: 96,085 tensors; per-class payload bytes.
TEST(Schema, ReleasedInventory) {
  Config c = released();
  auto specs = expected_tensors(c);
  EXPECT_EQ(specs.size(), 96085u);
  ByteInventory inv = inventory(specs);
  auto b = [&](ByteClass k) { return inv.bytes[size_t(k)]; };
  EXPECT_EQ(b(ByteClass::kRoutedExperts), 288777830400LL);
  EXPECT_EQ(b(ByteClass::kEngramTables), 202758032400LL);
  EXPECT_EQ(b(ByteClass::kEmbed), 1323827200LL);
  EXPECT_EQ(b(ByteClass::kSharedExperts), 1416960000LL);
  EXPECT_EQ(b(ByteClass::kDraft), 7721740680LL + 211133952LL);
  EXPECT_EQ(b(ByteClass::kIndexer), 45130752LL);
  EXPECT_EQ(b(ByteClass::kCompressor), 36704256LL);
  EXPECT_EQ(b(ByteClass::kMhc), 157295040LL);
  EXPECT_EQ(b(ByteClass::kRouter), 157409280LL);
  EXPECT_EQ(b(ByteClass::kEngramOther), 315043840LL);
  // attention FP8 projections 5,069,568,000 + norms and sinks 972,800 (spec/10 §5)
  EXPECT_EQ(b(ByteClass::kAttention), 5069568000LL + 972800LL);
  EXPECT_EQ(inv.total() - b(ByteClass::kVision), 509315486040LL);
  // Per-expert bytes (spec/10 §4.2).
  int64_t e0 = 0;
  for (const auto& s : specs)
    if (s.layer == 0 && s.expert == 0) e0 += s.nbytes();
  EXPECT_EQ(e0, 18800640);
}

TEST(Config, TinyFixtureParses) {
  auto c = Config::from_file(std::string(FB_SHARED_DIR) + "/fixtures/tiny-s0/checkpoint/config.json");
  if (!c.ok()) GTEST_SKIP() << "fixtures not present";
  EXPECT_EQ(c->n_layers, 6);
  EXPECT_EQ(c->roles[2].kv_layer, 1);
  EXPECT_EQ(c->roles[5].index_layer, 5);
  EXPECT_TRUE(c->roles[5].pool_restricted);
  EXPECT_EQ(c->roles[0].engram_table, 0);
  EXPECT_EQ(c->decoder_start, 3);  // last KV source (1, 3)
  EXPECT_EQ(expected_tensors(*c).size(), 411u);
}

TEST(Config, RejectsBadInput) {
  EXPECT_FALSE(Config::from_hf_json("").ok());
  EXPECT_FALSE(Config::from_hf_json("[1,2]").ok());
  EXPECT_FALSE(Config::from_hf_json("{\"text_config\": 3}").ok());
  auto text = read_file_bytes(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  ASSERT_TRUE(text.ok());
  std::string s = *text;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = s;
    size_t p = t.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    t.replace(p, from.size(), to);
    return t;
  };
  EXPECT_FALSE(Config::from_hf_json(replace("\"hidden_size\": 5120", "\"hidden_size\": \"5120\"")).ok());
  EXPECT_FALSE(Config::from_hf_json(replace("\"hidden_size\": 5120", "\"hidden_size\": 5121")).ok());
  EXPECT_FALSE(Config::from_hf_json(replace("\"kv_source_layer_ids\": [\n   2,", "\"kv_source_layer_ids\": [\n   3,")).ok());
  // The HF-port spelling of the pad key is accepted too.
  auto alt = Config::from_hf_json(replace("engram_pad_token_id", "engram_pad_id"));
  EXPECT_TRUE(alt.ok()) << alt.status().to_string();
}

}  // namespace
}  // namespace fb::model
