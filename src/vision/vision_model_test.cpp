// The built-in tiny model with --vision (loader::write_tiny_model) loads, and an image runs end to
// end through decode, preprocessing, ViT, aligner and a prefill whose span rows carry embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "loader/tiny_model.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::vision {
namespace {

namespace fs = std::filesystem;

TEST(VisionTinyModel, ImageRunsThroughMakeTinyVision) {
  const fs::path dir = fs::temp_directory_path() / ("fb_vision_tiny_" + std::to_string(::getpid()));
  const loader::TinyModelOptions o{.out_dir = dir.string(), .vision = true};
  ASSERT_TRUE(loader::write_tiny_model(o).ok());
  // make-tiny derives the Engram map from the tokenizer; a stand-in map keeps this test
  // independent of the tokenizer asset.
  const std::vector<int32_t> map = loader::modular_engram_map(o.vocab_size, o.engram_compressed_vocab);
  auto m = cpu::CpuModel::load(dir.string(), map);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const model::Config& c = (*m)->config();
  ASSERT_TRUE(c.has_vision());
  auto bytes = read_file_bytes((fs::path(FB_SOURCE_DIR) / "src/vision/testdata/s300x200.png").string());
  auto img = decode_image(*bytes);
  ASSERT_TRUE(img.ok());
  auto pre = preprocess(*img, c.vision);
  ASSERT_TRUE(pre.ok());
  EXPECT_LE(pre->plan.span_tokens(), c.vision.max_image_tokens);
  VisionTower tower(c, (*m)->weights().vision);
  const auto aligned = tower.align(tower.vit(pre->patches, pre->plan.nvh, pre->plan.nvw), pre->plan.nvh, pre->plan.nvw);
  ASSERT_EQ(aligned.size(), size_t(pre->plan.nlh) * size_t(pre->plan.nlw) * size_t(c.dim));
  const auto types = span_types(pre->plan.nlh, pre->plan.nlw);
  const auto emb = span_embeddings(types, aligned, (*m)->weights().vision, c.dim);
  // prompt: 3 text tokens, the span, 2 text tokens; one prefill from position 0
  const int64_t n = 5 + int64_t(types.size());
  model::Step st;
  auto text = [&](int64_t p, int32_t tok) {
    model::Row r;
    r.pos = p;
    r.token = tok;
    r.kind = model::RowKind::kPrefill;
    r.prefill_end = n;
    r.want_logits = p == n - 1;
    st.rows.push_back(r);
  };
  for (int p = 0; p < 3; ++p) text(p, 100 + p);
  append_span_rows(st, 0, 3, types, emb, c.dim, int32_t(c.image_token_id), n);
  text(n - 2, 200);
  text(n - 1, 201);
  auto sess = (*m)->new_session();
  auto out = (*m)->forward(st, {sess.get()});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->logits.size(), size_t(c.vocab_size));
  for (float v : out->logits) ASSERT_TRUE(std::isfinite(v));
  // A different image must change the logits (the span really feeds the backbone).
  model::Step st2 = st;
  for (auto& x : st2.embeddings) x = uint16_t(x ^ 0x0001);
  auto sess2 = (*m)->new_session();
  auto out2 = (*m)->forward(st2, {sess2.get()});
  ASSERT_TRUE(out2.ok());
  EXPECT_NE(out->logits, out2->logits);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fb::vision
