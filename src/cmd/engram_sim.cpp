// flashbox engram-sim TEXT... [--model DIR] [--cache-gib 1,4,16,64] [--warm-share 0.5] [--max-tokens N]
//
// How well a host row cache of the Engram tables would serve real text (issue 22): each file (or
// every text file under a folder) is one document, tokenized with the model's tokenizer, mapped
// to Engram classes, hashed to row ids as the executors hash them, and every row looked up in the
// row cache's own policy (storage::RowClock) at each budget. The first share of the tokens warms
// the caches; the rest are counted. Prints, per budget, the hit rate and what the misses cost the
// drives per token (each missed row is two reads: codes and scales are separate tensors; O_DIRECT
// reads whole 4 KiB blocks). Without --model: the released config and the bundled tokenizer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cmd/commands.h"
#include "model/config.h"
#include "storage/engram_rows.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/model_map.h"
#include "tokenizer/tokenizer.h"

namespace fb::cmd {

namespace {

namespace fs = std::filesystem;

struct Args {
  std::vector<std::string> inputs;
  std::string model;
  std::vector<double> cache_gib{1, 4, 16, 64};
  double warm_share = 0.5;
  int64_t max_tokens = 4000000;
  int64_t max_doc_tokens = 65536;
};

bool text_file(const fs::path& p) {
  static const std::set<std::string> ext{".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".py", ".rs", ".go", ".js", ".ts", ".java",
                                         ".md", ".txt", ".rst", ".sh", ".json", ".toml", ".yaml", ".yml", ".html", ".css", ".cmake"};
  return ext.count(p.extension().string()) != 0;
}

// Files in a stable order: each input as given, a folder's text files sorted by path.
std::vector<fs::path> list_files(const std::vector<std::string>& inputs) {
  std::vector<fs::path> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> v;
      for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec) && text_file(it->path())) v.push_back(it->path());
      std::sort(v.begin(), v.end());
      out.insert(out.end(), v.begin(), v.end());
    } else {
      out.emplace_back(in);
    }
  }
  return out;
}

int run(const Args& a) {
  std::string cfg_path = a.model.empty() ? std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json" : a.model + "/config.json";
  auto cfg = model::Config::from_file(cfg_path);
  if (!cfg.ok()) {
    std::fprintf(stderr, "engram-sim: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  const model::Config& c = *cfg;
  if (c.engram_layer_ids.empty()) {
    std::fprintf(stderr, "engram-sim: %s has no Engram layers\n", cfg_path.c_str());
    return 2;
  }
  std::string tok_path = std::string(FB_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json";
  if (!a.model.empty() && fs::exists(fs::path(a.model) / "tokenizer.json")) tok_path = (fs::path(a.model) / "tokenizer.json").string();
  auto tok = tokenizer::Tokenizer::load(tok_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "engram-sim: %s\n", tok.status().to_string().c_str());
    return 2;
  }
  std::vector<int32_t> map;
  if (!a.model.empty()) {
    auto m = tokenizer::engram_map_for_model(a.model);
    if (!m.ok()) {
      std::fprintf(stderr, "engram-sim: %s\n", m.status().to_string().c_str());
      return 2;
    }
    map = std::move(*m);
  } else {
    auto m = tokenizer::derive_engram_map(*tok);
    if (!m.ok()) {
      std::fprintf(stderr, "engram-sim: %s\n", m.status().to_string().c_str());
      return 2;
    }
    map = std::move(m->map);
  }
  if (int64_t(map.size()) <= c.engram_pad_id) {
    std::fprintf(stderr, "engram-sim: the Engram map has %zu entries\n", map.size());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> docs;
  int64_t total = 0, files = 0, unmapped = 0;
  for (const fs::path& f : list_files(a.inputs)) {
    if (total >= a.max_tokens) break;
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "engram-sim: cannot read %s\n", f.string().c_str());
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.empty()) continue;
    std::vector<int32_t> ids = tok->encode(text);
    if (int64_t(ids.size()) > a.max_doc_tokens) ids.resize(size_t(a.max_doc_tokens));
    if (int64_t(ids.size()) > a.max_tokens - total) ids.resize(size_t(a.max_tokens - total));
    std::vector<int32_t> cls(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool ok = ids[i] >= 0 && size_t(ids[i]) < map.size();
      cls[i] = ok ? map[size_t(ids[i])] : map[size_t(c.engram_pad_id)];
      unmapped += ok ? 0 : 1;
    }
    total += int64_t(cls.size());
    ++files;
    docs.push_back(std::move(cls));
  }
  if (total == 0) {
    std::fprintf(stderr, "engram-sim: no text in the inputs\n");
    return 2;
  }
  const double tok_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint64_t> budgets;
  for (double g : a.cache_gib) budgets.push_back(uint64_t(std::max(0.0, g) * double(uint64_t(1) << 30)));
  const uint64_t warm = uint64_t(double(total) * std::clamp(a.warm_share, 0.0, 0.99));
  const auto t1 = std::chrono::steady_clock::now();
  const auto res = storage::simulate_engram_cache(c, docs, map[size_t(c.engram_pad_id)], budgets, warm);
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  const int64_t per_token = int64_t(c.engram_layer_ids.size()) * (c.engram_max_ngram - 1) * c.engram_n_heads;
  uint64_t table_rows = 0;
  for (int64_t n : c.engram_num_embeddings) table_rows += uint64_t(n);
  const int row_b = c.engram_head_dim + c.engram_head_dim / 32;
  std::printf("engram-sim: %lld tokens from %lld files (%lld ids outside the map), tokenized in %.1f s; %lld rows a token, tables of "
              "%.1f GiB (%llu rows of %d B); the first %llu tokens warm the caches, %llu measured; simulated in %.1f s\n",
              (long long)total, (long long)files, (long long)unmapped, tok_s, (long long)per_token,
              double(table_rows) * row_b / double(uint64_t(1) << 30), (unsigned long long)table_rows, row_b, (unsigned long long)warm,
              (unsigned long long)(uint64_t(total) - warm), sim_s);
  std::printf("%10s %14s %9s %16s %16s %18s\n", "cache_GiB", "rows_held", "hit_rate", "drive_rows/tok", "drive_reads/tok", "4K_read_KiB/tok");
  for (const storage::EngramSimResult& r : res) {
    const double hit = r.lookups ? double(r.hits) / double(r.lookups) : 0.0;
    const double miss_tok = r.tokens ? double(r.lookups - r.hits) / double(r.tokens) : 0.0;
    std::printf("%10.2f %14lld %9.4f %16.2f %16.2f %18.1f\n", double(r.budget_bytes) / double(uint64_t(1) << 30), (long long)r.held_rows, hit,
                miss_tok, 2 * miss_tok, 2 * miss_tok * 4.0);
  }
  std::printf("engram-sim: a cache larger than the rows the text asks for behaves as the largest shown (rows_held < its capacity: "
              "every miss was a first touch)\n");
  return 0;
}

}  // namespace

Runner add_engram_sim(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("inputs", a->inputs, "text files or folders (their source and text files, sorted); each file is one document")->required();
  app.add_option("--model", a->model, "model folder (config.json, tokenizer, Engram map); default: the released config, bundled tokenizer");
  app.add_option("--cache-gib", a->cache_gib, "row cache budgets to simulate, GiB")->delimiter(',')->capture_default_str();
  app.add_option("--warm-share", a->warm_share, "share of the tokens that only warms the caches")->capture_default_str();
  app.add_option("--max-tokens", a->max_tokens, "stop reading inputs after this many tokens")->capture_default_str();
  app.add_option("--max-doc-tokens", a->max_doc_tokens, "tokens kept of each document (a session's context)")->capture_default_str();
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
