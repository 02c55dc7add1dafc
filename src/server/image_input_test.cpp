// Image inputs through the server's parsing and the engine (issue 10, API half): the policy on
// image sources (data URLs, local files only when allowed, never the network), bad images as
// 400s, placeholder -> span expansion, and prefix reuse keyed on the image content (a prompt with
// a different image must never reuse another image's KV, spec/14 §6.2).
#include <gtest/gtest.h>

#include <filesystem>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "engine/engine.h"
#include "loader/tiny_model.h"
#include "server/http_status.h"
#include "server/image_input.h"
#include "server/request_parse.h"
#include "tokenizer/test_assets.h"
#include "vision/pipeline.h"

namespace fb::server {
namespace {

namespace fs = std::filesystem;

std::string b64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) o += t[(v >> (6 * k)) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    o += t[v >> 18];
    o += t[(v >> 12) & 63];
    o += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8;
    o += t[v >> 18];
    o += t[(v >> 12) & 63];
    o += t[(v >> 6) & 63];
    o += '=';
  }
  return o;
}

std::string testdata(const char* name) { return (fs::path(FB_SOURCE_DIR) / "src/vision/testdata" / name).string(); }

class ImageInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("fb_image_input_" + std::to_string(::getpid())));
    loader::TinyModelOptions o;
    o.out_dir = dir_->string();
    o.vision = true;
    ASSERT_TRUE(loader::write_tiny_model(o).ok());
    auto p = vision::ImagePipeline::open(dir_->string());
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pipe_ = p->release();
  }
  static void TearDownTestSuite() {
    delete pipe_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  ParseContext ctx(bool allow_local = false) const {
    ParseContext c;
    c.tok = &tokenizer::v41_tokenizer();
    c.max_context = 1 << 16;
    c.images.vision = pipe_;
    c.images.allow_local = allow_local;
    return c;
  }
  static std::string png_url(const char* name) { return "data:image/png;base64," + b64(*read_file_bytes(testdata(name))); }
  static inline fs::path* dir_ = nullptr;
  static inline vision::ImagePipeline* pipe_ = nullptr;
};

ojson chat_with(const ojson& part) {
  ojson text = ojson::object();
  text["type"] = "text";
  text["text"] = "What is this?";
  ojson msg = ojson::object();
  msg["role"] = "user";
  msg["content"] = ojson::array({text, part});
  ojson body = ojson::object();
  body["messages"] = ojson::array({msg});
  body["max_tokens"] = 3;
  body["temperature"] = 0;
  return body;
}
ojson url_part(const std::string& url) {
  ojson p = ojson::object();
  p["type"] = "image_url";
  p["image_url"] = ojson::object();
  p["image_url"]["url"] = url;
  return p;
}

TEST_F(ImageInputTest, ChatImageExpandsIntoItsSpan) {
  auto text_only = parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"What is this?"}]})"), ctx());
  ASSERT_TRUE(text_only.ok());
  auto r = parse_request(Endpoint::kChat, chat_with(url_part(png_url("s300x200.png"))), ctx());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->req.images.size(), 1u);
  const engine::ImageInput& im = r->req.images[0];
  const int64_t L = int64_t(im.types.size());
  EXPECT_EQ(im.types.front(), 0);
  EXPECT_EQ(im.types.back(), 3);
  EXPECT_EQ(int64_t(im.embeddings.size()), L * pipe_->config().dim);
  EXPECT_NE(im.hash, 0u);
  for (int64_t k = 0; k < L; ++k) EXPECT_EQ(r->req.prompt[size_t(im.pos + k)], 129264);
  EXPECT_NE(r->prompt_text.find("<｜deepseek_image｜>"), std::string::npos);
  // The same message with "\n\n" + placeholder costs one id for the placeholder, then L - 1 more.
  EXPECT_GT(int64_t(r->req.prompt.size()), int64_t(text_only->req.prompt.size()) + L - 1);
  // Anthropic base64 block: same image, same rows and hash.
  ojson a = ojson::parse(R"({"max_tokens": 3, "messages": [{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
      {"type": "text", "text": "What is this?"}]}]})");
  a["messages"][0]["content"][0]["source"]["data"] = b64(*read_file_bytes(testdata("s300x200.png")));
  auto ra = parse_request(Endpoint::kMessages, a, ctx());
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  ASSERT_EQ(ra->req.images.size(), 1u);
  EXPECT_EQ(ra->req.images[0].hash, im.hash);
  EXPECT_EQ(ra->req.images[0].embeddings, im.embeddings);
}

TEST_F(ImageInputTest, SourcesPolicyAndBadImagesAre400) {
  auto code = [&](const ojson& part, bool allow_local = false) {
    auto r = parse_request(Endpoint::kChat, chat_with(part), ctx(allow_local));
    return r.ok() ? 200 : http_error_for(r.status().code()).http;
  };
  auto msg = [&](const ojson& part) {
    auto r = parse_request(Endpoint::kChat, chat_with(part), ctx());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(code(url_part("https://example.com/cat.png")), 400);
  EXPECT_NE(msg(url_part("http://example.com/cat.png")).find("not fetched"), std::string::npos);
  EXPECT_EQ(code(url_part(testdata("s300x200.png"))), 400);                           // local path, not allowed
  EXPECT_NE(msg(url_part("file://" + testdata("s300x200.png"))).find("--allow-local-images"), std::string::npos);
  EXPECT_EQ(code(url_part("file://" + testdata("s300x200.png")), true), 200);
  EXPECT_EQ(code(url_part("/no/such/file.png"), true), 400);
  EXPECT_EQ(code(url_part("data:image/png;base64,!!!!")), 400);                         // bad base64
  EXPECT_EQ(code(url_part("data:image/png;base64," + b64("not an image at all"))), 400);
  std::string png = *read_file_bytes(testdata("s300x200.png"));
  EXPECT_EQ(code(url_part("data:image/png;base64," + b64(png.substr(0, png.size() / 2)))), 400);  // truncated
  EXPECT_EQ(code(url_part("data:image/gif;base64," + b64("GIF89a\x01\x00\x01\x00"))), 400);
  EXPECT_EQ(code(ojson::parse(R"({"type": "image_url", "image_url": 5})")), 400);
  EXPECT_EQ(code(ojson::parse(R"({"type": "image", "source": {"type": "base64"}})")), 400);
  EXPECT_EQ(code(url_part("ftp://x/y.png")), 400);
  // No vision tower: 400 with that message.
  ParseContext plain;
  plain.tok = &tokenizer::v41_tokenizer();
  plain.max_context = 1 << 16;
  auto r = parse_request(Endpoint::kChat, chat_with(url_part(png_url("s300x200.png"))), plain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(http_error_for(r.status().code()).http, 400);
  EXPECT_NE(r.status().message().find("model has no vision tower"), std::string::npos);
}

TEST_F(ImageInputTest, PrefixReuseIsKeyedOnTheImage) {
  std::vector<int32_t> map(129280);
  for (size_t i = 0; i < map.size(); ++i) map[i] = int32_t(i % 99092);
  auto m = cpu::CpuModel::load(dir_->string(), map);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  engine::EngineOptions eo;
  eo.max_sessions = 1;
  eo.generator.prefill_chunk = 64;  // image rows land in several chunks
  engine::Engine eng(std::unique_ptr<model::Executor>(std::move(m).value()), tokenizer::v41_tokenizer(), eo);
  auto run = [&](const std::string& url) {
    auto r = parse_request(Endpoint::kChat, chat_with(url_part(url)), ctx());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    engine::EventQueue q;
    auto id = eng.submit(r->req, q.sink());
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    engine::Event e;
    for (;;) {
      if (!q.pop(&e, 60000)) {
        ADD_FAILURE() << "timeout";
        break;
      }
      if (e.kind == engine::Event::Kind::kError) ADD_FAILURE() << e.status.to_string();
      if (e.kind == engine::Event::Kind::kDone || e.kind == engine::Event::Kind::kError) break;
    }
    return std::make_pair(r->req.images[0].pos, e.usage);
  };
  const std::string png = *read_file_bytes(testdata("s300x200.png"));
  const std::string url_a = "data:image/png;base64," + b64(png);
  const auto [pos_a, ua] = run(url_a);
  EXPECT_EQ(ua.cached_tokens, 0);
  EXPECT_GE(ua.completion_tokens, 1);
  const auto [pos_a2, ua2] = run(url_a);  // same image: the whole prompt but its last row
  EXPECT_EQ(ua2.cached_tokens, ua2.prompt_tokens - 1);
  // Other image bytes with the same size (the same PNG with bytes after IEND, which decoders
  // ignore), so the prompt ids are IDENTICAL: only the content key stops the reuse (at most the
  // text before the span; when the CPU session cannot roll back that far nothing is reused).
  // Different pixels of the same size: tests/server/test_e2e.py.
  const std::string url_b = "data:image/png;base64," + b64(png + std::string("trailing bytes"));
  const auto [pos_b, ub] = run(url_b);
  EXPECT_EQ(pos_b, pos_a);
  EXPECT_EQ(ub.prompt_tokens, ua.prompt_tokens);
  EXPECT_LE(ub.cached_tokens, pos_b);
  const auto [pos_c, uc] = run(url_a);  // and back: no reuse of the twin's span either
  EXPECT_LE(uc.cached_tokens, pos_c);
  const engine::EngineStats st = eng.stats();
  EXPECT_EQ(st.images, 4);
  EXPECT_EQ(st.prefill_tokens, st.prompt_tokens - st.cached_tokens);
  // Images on a model without a vision tower are refused by the engine as well.
  engine::Request bad;
  bad.prompt = {1, 2, 3};
  bad.images.push_back(engine::ImageInput{1, {0}, std::vector<uint16_t>(size_t(pipe_->config().dim)), 1});
  bad.prompt[1] = 5;  // not the image token
  engine::EventQueue q;
  EXPECT_FALSE(eng.submit(bad, q.sink()).ok());
}

TEST(HttpStatusTable, QueueFullIs429ContextOverflowStays400) {
  EXPECT_EQ(http_error_for(StatusCode::kUnavailable).http, 429);
  EXPECT_STREQ(http_error_for(StatusCode::kUnavailable).anthropic_type, "overloaded_error");
  EXPECT_EQ(http_error_for(StatusCode::kResourceExhausted).http, 400);
}

}  // namespace
}  // namespace fb::server
