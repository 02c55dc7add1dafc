// flashbox make-tiny --out DIR --seed N [--vision]: the built-in tiny model. Writes the random
// checkpoint, copies the V4.1 tokenizer next to it (with its licence) and the Engram token map
// derived from that tokenizer, so the folder is a complete, self-describing model.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "base/mapped_file.h"
#include "base/progress.h"
#include "cmd/commands.h"
#include "loader/snapshot.h"
#include "loader/tiny_model.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace fb::cmd {

namespace fs = std::filesystem;

namespace {

struct Args {
  std::string out = "tiny-model";
  uint64_t seed = 0;
  bool vision = false;
  bool smooth = false;
  std::string tokenizer;
};

}  // namespace

Status make_tiny_model(const std::string& out, uint64_t seed, bool vision, const std::string& tokenizer_path, bool smooth) {
  const std::string tok_path = tokenizer_path.empty() ? std::string(FB_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json" : tokenizer_path;
  auto tok = FB_TRY(tokenizer::Tokenizer::load(tok_path));
  auto em = FB_TRY(tokenizer::derive_engram_map(tok));
  loader::TinyModelOptions o;
  o.out_dir = out;
  o.seed = seed;
  o.vision = vision;
  o.smooth = smooth;
  o.vocab_size = tok.vocab_size();
  o.engram_compressed_vocab = em.n_classes;
  std::fprintf(stderr, "make-tiny: writing %s (seed %llu%s)...\n", out.c_str(), (unsigned long long)seed,
               std::string(vision ? ", vision" : "").append(smooth ? ", smooth (hidden 1024, complete selections)" : "").c_str());
  Progress progress("make-tiny", 0, ProgressUnit::kBytes);  // bytes and tensors, on a terminal only
  o.progress = &progress;
  FB_RETURN_IF_ERROR(loader::write_tiny_model(o));
  std::error_code ec;
  fs::copy_file(tok_path, fs::path(out) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
  fs::path lic = fs::path(tok_path).parent_path() / "LICENSE";
  if (!ec && fs::exists(lic)) fs::copy_file(lic, fs::path(out) / "TOKENIZER_LICENSE", fs::copy_options::overwrite_existing, ec);
  if (ec) return FB_ERROR(kIo) << "copying the tokenizer: " << ec.message();
  FB_RETURN_IF_ERROR(write_file_atomic((fs::path(out) / "engram_token_map.i32").string(), em.map.data(), em.map.size() * 4));
  auto snap = FB_TRY(loader::Snapshot::open(out));
  if (!snap->validate().ok()) return FB_ERROR(kInternal) << "the written model does not validate:\n" << snap->validate().to_string();
  std::printf("wrote %s: %zu tensors, vocab %lld, engram classes %d\n", out.c_str(), snap->tensor_names().size(), (long long)o.vocab_size,
              em.n_classes);
  return Status();
}

namespace {

int run(const Args& a) {
  Status st = make_tiny_model(a.out, a.seed, a.vision, a.tokenizer, a.smooth);
  if (!st.ok()) {
    std::fprintf(stderr, "make-tiny: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Runner add_make_tiny(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--out", a->out, "output folder (default tiny-model)");
  app.add_option("--seed", a->seed, "random seed (default 0)");
  app.add_flag("--vision", a->vision, "include a small ViT and aligner");
  app.add_flag("--smooth", a->smooth,
               "hidden 1024 and every selection complete (all experts active, index top-k and candidate pool beyond 4,096 positions): "
               "logits continuous in arithmetic error, for comparing numerics classes");
  app.add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the repository's V4.1 asset)");
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
