// Image inputs through the server's parsing and the engine (issue 10): the policy on image
// sources (data URLs, local files only when allowed, never the network), bad images as 400s,
// placeholder -> span expansion with patches (the HTTP thread only decodes and preprocesses),
// the tower on the engine thread through the executor (same tokens as the CPU tower fed to the
// generator directly), and prefix reuse keyed on the image content (a prompt with a different
// image must never reuse another image's KV, spec/14 §6.2).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/image_input.h"
#include "engine/scripted_executor.h"
#include "loader/tiny_model.h"
#include "server/http_status.h"
#include "server/request_parse.h"
#include "tokenizer/test_assets.h"
#include "vision/pipeline.h"
#include "vision/span.h"
#include "vision/tower.h"

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

// The CPU model with the stub Engram map the tests use (id mod the compressed vocabulary).
std::unique_ptr<cpu::CpuModel> load_cpu(const std::string& dir) {
  std::vector<int32_t> map(129280);
  for (size_t i = 0; i < map.size(); ++i) map[i] = int32_t(i % 99092);
  auto m = cpu::CpuModel::load(dir, map);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Forwards everything to a CPU model and records where the tower runs.
class WatchedExecutor final : public model::Executor {
 public:
  explicit WatchedExecutor(std::unique_ptr<cpu::CpuModel> m) : m_(std::move(m)) {}
  const model::Config& config() const override { return m_->config(); }
  const char* name() const override { return "watched-cpu"; }
  std::unique_ptr<model::SessionState> new_session() const override { return m_->new_session(); }
  bool supports_bounded_replay() const override { return m_->supports_bounded_replay(); }
  Result<model::StepOutput> forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                    model::Taps* taps = nullptr) override {
    return m_->forward(step, sessions, taps);
  }
  Status draft_commit(model::SessionState& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) override {
    return m_->draft_commit(s, first_pos, tap_rows, n);
  }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) override {
    return m_->draft(s, anchor, tap_row, p);
  }
  Result<model::DraftOutput> draft_sampled(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p,
                                           const model::DraftPicker& pick) override {
    return m_->draft_sampled(s, anchor, tap_row, p, pick);
  }
  Result<std::vector<uint16_t>> encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw, std::vector<uint16_t>* vit) override {
    ++encodes;
    tower_thread = std::this_thread::get_id();
    return m_->encode_image(patches, nvh, nvw, vit);
  }
  Result<std::vector<uint16_t>> image_span_markers() const override { return m_->image_span_markers(); }
  std::atomic<int> encodes{0};
  std::thread::id tower_thread;  // written on the engine thread, read after its request is done

 private:
  std::unique_ptr<cpu::CpuModel> m_;
};

class ImageInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("fb_image_input_" + std::to_string(::getpid())));
    loader::TinyModelOptions o;
    o.out_dir = dir_->string();
    o.vision = true;
    ASSERT_TRUE(loader::write_tiny_model(o).ok());
    ref_ = load_cpu(dir_->string()).release();
    ASSERT_NE(ref_, nullptr);
    ASSERT_TRUE(ref_->config().has_vision());
  }
  static void TearDownTestSuite() {
    delete ref_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  ParseContext ctx(bool allow_local = false) const {
    ParseContext c;
    c.tok = &tokenizer::v41_tokenizer();
    c.max_context = 1 << 16;
    c.images.vision = &ref_->config();
    c.images.allow_local = allow_local;
    return c;
  }
  static std::string png_url(const char* name) { return "data:image/png;base64," + b64(*read_file_bytes(testdata(name))); }
  static const model::Config& cfg() { return ref_->config(); }
  static int64_t span_len(const engine::ImageInput& im) {
    const int r = cfg().vision.downsample;
    return int64_t((im.nvh + r - 1) / r) * ((im.nvw + r - 1) / r + 1) + 2;
  }
  static inline fs::path* dir_ = nullptr;
  static inline cpu::CpuModel* ref_ = nullptr;  // config + the reference CPU tower (never in an engine)
};

// Runs one request to its end; token ids come from the logprob events (req.logprobs >= 0).
struct RunResult {
  std::vector<int32_t> ids;
  std::vector<double> logprobs;
  engine::Usage usage;
  bool ok = false;
};
RunResult run_request(engine::Engine& eng, const engine::Request& req) {
  RunResult out;
  engine::EventQueue q;
  auto id = eng.submit(req, q.sink());
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  if (!id.ok()) return out;
  engine::Event e;
  for (;;) {
    if (!q.pop(&e, 120000)) {
      ADD_FAILURE() << "timeout";
      return out;
    }
    if (e.kind == engine::Event::Kind::kLogprob) {
      out.ids.push_back(e.token.id);
      out.logprobs.push_back(e.token.logprob);
    }
    if (e.kind == engine::Event::Kind::kError) {
      ADD_FAILURE() << e.status.to_string();
      return out;
    }
    if (e.kind == engine::Event::Kind::kDone) break;
  }
  out.usage = e.usage;
  out.ok = true;
  return out;
}

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
  // The HTTP thread hands over the preprocessed patches, nothing encoded.
  auto pre = vision::preprocess(*vision::decode_image(*read_file_bytes(testdata("s300x200.png"))), cfg().vision);
  ASSERT_TRUE(pre.ok());
  EXPECT_EQ(im.nvh, pre->plan.nvh);
  EXPECT_EQ(im.nvw, pre->plan.nvw);
  EXPECT_EQ(im.patches, pre->patches);
  const int64_t L = span_len(im);
  EXPECT_EQ(L, pre->plan.span_tokens());
  EXPECT_NE(im.hash, 0u);
  for (int64_t k = 0; k < L; ++k) EXPECT_EQ(r->req.prompt[size_t(im.pos + k)], 129264);
  EXPECT_NE(r->req.prompt[size_t(im.pos - 1)], 129264);
  EXPECT_NE(r->req.prompt[size_t(im.pos + L)], 129264);
  EXPECT_NE(r->prompt_text.find("<｜deepseek_image｜>"), std::string::npos);
  // The same message with "\n\n" + placeholder costs one id for the placeholder, then L - 1 more.
  EXPECT_GT(int64_t(r->req.prompt.size()), int64_t(text_only->req.prompt.size()) + L - 1);
  // Anthropic base64 block: same image, same patches and hash.
  ojson a = ojson::parse(R"({"max_tokens": 3, "messages": [{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
      {"type": "text", "text": "What is this?"}]}]})");
  a["messages"][0]["content"][0]["source"]["data"] = b64(*read_file_bytes(testdata("s300x200.png")));
  auto ra = parse_request(Endpoint::kMessages, a, ctx());
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  ASSERT_EQ(ra->req.images.size(), 1u);
  EXPECT_EQ(ra->req.images[0].hash, im.hash);
  EXPECT_EQ(ra->req.images[0].patches, im.patches);
}

TEST_F(ImageInputTest, DifferentImagesHaveDifferentKeys) {
  auto hash_of = [&](const std::string& url) {
    auto r = parse_request(Endpoint::kChat, chat_with(url_part(url)), ctx());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() && r->req.images.size() == 1 ? r->req.images[0].hash : uint64_t(0);
  };
  const std::string png = *read_file_bytes(testdata("s300x200.png"));
  const uint64_t a = hash_of("data:image/png;base64," + b64(png));
  EXPECT_EQ(hash_of("data:image/png;base64," + b64(png)), a);  // deterministic
  EXPECT_NE(hash_of(png_url("s73x91.png")), a);                 // other pixels
  EXPECT_NE(hash_of(png_url("s13x67.png")), hash_of(png_url("s67x13.png")));
  EXPECT_NE(hash_of("data:image/png;base64," + b64(png + "trailing bytes")), a);  // other bytes, same pixels
}

// The tower runs through the engine's executor on the engine thread, and the output is the same,
// token for token and logprob for logprob, as the rows the server used to build on its own
// thread with the CPU tower (vision::VisionTower + span_embeddings from the weights) fed to a
// Generator.
TEST_F(ImageInputTest, TowerRunsOnTheEngineThreadWithTheReferenceTokens) {
  ojson body = chat_with(url_part(png_url("s300x200.png")));
  body["messages"][0]["content"].push_back(url_part(png_url("s73x91.png")));
  auto r = parse_request(Endpoint::kChat, body, ctx());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->req.images.size(), 2u);
  engine::Request req = r->req;
  req.max_tokens = 8;
  req.logprobs = 0;
  ASSERT_TRUE(req.sampling.greedy());

  engine::GeneratorOptions go;
  go.prefill_chunk = 64;  // image rows land in several chunks
  go.dspark = false;      // one token per step on both sides
  auto m = load_cpu(dir_->string());
  ASSERT_NE(m, nullptr);
  auto* watched = new WatchedExecutor(std::move(m));
  engine::EngineOptions eo;
  eo.generator = go;
  engine::Engine eng(std::unique_ptr<model::Executor>(watched), tokenizer::v41_tokenizer(), eo);
  EXPECT_EQ(watched->encodes.load(), 0);  // parsing ran no tower
  const RunResult got = run_request(eng, req);
  ASSERT_TRUE(got.ok);
  EXPECT_EQ(watched->encodes.load(), 2);
  EXPECT_NE(watched->tower_thread, std::this_thread::get_id());
  EXPECT_EQ(got.usage.prompt_tokens, int64_t(req.prompt.size()));
  EXPECT_GT(eng.stats().image_encode_s, 0.0);

  // The reference: decode and preprocess the bytes afresh, CPU tower, span rows from the weights.
  const int64_t N = int64_t(req.prompt.size()), dim = cfg().dim;
  engine::PromptEmbeddings pe;
  pe.row.assign(size_t(N), -1);
  pe.key.assign(size_t(N), 0);
  const vision::VisionTower tower(cfg(), ref_->weights().vision);
  const char* files[] = {"s300x200.png", "s73x91.png"};
  for (size_t i = 0; i < 2; ++i) {
    auto pre = vision::preprocess(*vision::decode_image(*read_file_bytes(testdata(files[i]))), cfg().vision);
    ASSERT_TRUE(pre.ok());
    const vision::ImagePlan& pl = pre->plan;
    const auto aligned = tower.align(tower.vit(pre->patches, pl.nvh, pl.nvw), pl.nvh, pl.nvw);
    const auto types = vision::span_types(pl.nlh, pl.nlw);
    const auto rows = vision::span_embeddings(types, aligned, ref_->weights().vision, int(dim));
    const int32_t first = int32_t(pe.data.size() / size_t(dim));
    pe.data.insert(pe.data.end(), rows.begin(), rows.end());
    ASSERT_EQ(int64_t(types.size()), span_len(req.images[i]));
    for (size_t k = 0; k < types.size(); ++k) {
      const size_t p = size_t(req.images[i].pos) + k;
      pe.row[p] = first + int32_t(k);
      pe.key[p] = 1 + p;
    }
  }
  engine::Generator gen(*ref_, go);
  ASSERT_TRUE(gen.prefill(req.prompt, {}, &pe).ok());
  engine::Rng rng;
  RunResult want;
  while (int64_t(want.ids.size()) < req.max_tokens) {
    std::vector<int32_t> toks;
    std::vector<engine::TokenLogprob> lps;
    ASSERT_TRUE(gen.next(req.sampling, rng, &toks, &lps, 0).ok());
    ASSERT_EQ(toks.size(), 1u);
    want.ids.push_back(toks[0]);
    want.logprobs.push_back(lps[0].logprob);
    if (toks[0] == cfg().eos_token_id) break;
  }
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.logprobs, want.logprobs);
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
  auto m = load_cpu(dir_->string());
  ASSERT_NE(m, nullptr);
  engine::EngineOptions eo;
  eo.max_sessions = 1;
  eo.generator.prefill_chunk = 64;  // image rows land in several chunks
  engine::Engine eng(std::unique_ptr<model::Executor>(std::move(m)), tokenizer::v41_tokenizer(), eo);
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
  EXPECT_EQ(st.images_encoded, 3);  // the second run of url_a reused the image's KV: no tower run
  EXPECT_EQ(st.prefill_tokens, st.prompt_tokens - st.cached_tokens);
  // Malformed image inputs are refused by the engine at submit (nothing runs).
  const int64_t P = 3LL * cfg().vision.patch_size * cfg().vision.patch_size;
  engine::Request bad;
  bad.prompt = {1, 129264, 129264, 129264, 129264, 2};  // 1x1 grid: START, IMAGE, NEWLINE, END
  bad.images.push_back(engine::ImageInput{1, 1, 1, std::vector<uint16_t>(size_t(P)), 1});
  bad.max_tokens = 1;
  auto submit_code = [&](const engine::Request& rq) {
    engine::EventQueue q;
    auto id = eng.submit(rq, q.sink());
    return id.ok() ? StatusCode::kOk : id.status().code();
  };
  EXPECT_EQ(submit_code(bad), StatusCode::kOk);
  engine::Request b1 = bad;
  b1.prompt[2] = 5;  // not the image token
  EXPECT_EQ(submit_code(b1), StatusCode::kInvalidArgument);
  engine::Request b2 = bad;
  b2.images[0].patches.pop_back();  // patches do not fill the grid
  EXPECT_EQ(submit_code(b2), StatusCode::kInvalidArgument);
  engine::Request b3 = bad;
  b3.images[0].pos = 3;  // the span runs past the prompt
  EXPECT_EQ(submit_code(b3), StatusCode::kInvalidArgument);
}

// A text-only model refuses image inputs in the engine too (400 through the server's table).
TEST(ImageInputNoVision, EngineRefusesImagesOnATextOnlyModel) {
  const auto& tok = tokenizer::v41_tokenizer();
  engine::Engine eng(std::make_unique<engine::ScriptedExecutor>(tok.vocab_size(), std::vector<std::vector<int32_t>>{{1}}, 4096), tok,
                     engine::EngineOptions{});
  ASSERT_FALSE(eng.config().has_vision());
  engine::Request req;
  req.prompt = {1, 129264, 129264, 129264, 129264, 2};
  req.images.push_back(engine::ImageInput{1, 1, 1, std::vector<uint16_t>(3 * 14 * 14), 1});
  engine::EventQueue q;
  auto id = eng.submit(req, q.sink());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(http_error_for(id.status().code()).http, 400);
  EXPECT_NE(id.status().message().find("model has no vision tower"), std::string::npos);
}

TEST(HttpStatusTable, QueueFullIs429ContextOverflowStays400) {
  EXPECT_EQ(http_error_for(StatusCode::kUnavailable).http, 429);
  EXPECT_STREQ(http_error_for(StatusCode::kUnavailable).anthropic_type, "overloaded_error");
  EXPECT_EQ(http_error_for(StatusCode::kResourceExhausted).http, 400);
}

}  // namespace
}  // namespace fb::server
