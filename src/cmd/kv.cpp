// flashbox kv ls|verify|rm DIR: the disk KV cache's checkpoint files for operators (engine/kv_store.h,
// docs/formats.md). ls lists them; verify checks each whole (exit 1 when any is damaged); rm
// deletes the named files, or every checkpoint with --all. The server need not be stopped for ls
// and verify; rm of a file the server holds only costs that checkpoint.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cmd/commands.h"
#include "engine/kv_store.h"

namespace fb::cmd {

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string action, dir;
  std::vector<std::string> files;
  bool all = false;
};

std::vector<fs::path> checkpoints(const std::string& dir) {
  std::vector<fs::path> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".fbkv") v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

int run(const Args& a) {
  if (!fs::is_directory(a.dir)) {
    std::fprintf(stderr, "flashbox kv: %s is not a folder\n", a.dir.c_str());
    return 2;
  }
  if (a.action == "ls" || a.action == "verify") {
    int bad = 0;
    uint64_t total = 0;
    const auto files = checkpoints(a.dir);
    for (const auto& f : files) {
      auto info = engine::verify_kv_file(f.string());
      if (!info.ok()) {
        ++bad;
        std::printf("%-48s DAMAGED: %s\n", f.filename().string().c_str(), info.status().message().c_str());
        continue;
      }
      total += info->bytes;
      // a delta checkpoint is checked as a file here; its rebuild (parent chain, rebuilt checksum)
      // is checked when a server or run restores it, and an orphan is dropped at the store's open
      const std::string kind = info->parent_tokens >= 0 ? "  delta of the " + std::to_string(info->parent_tokens) + "-token checkpoint" : "";
      std::printf("%-48s %8lld tokens %12.1f KB  model %016llx%s\n", f.filename().string().c_str(), (long long)info->n_tokens,
                  double(info->bytes) / 1e3, (unsigned long long)info->model_id, kind.c_str());
    }
    std::printf("%zu checkpoints, %.1f MB%s\n", files.size(), double(total) / 1e6, bad ? (", " + std::to_string(bad) + " damaged").c_str() : "");
    return a.action == "verify" && bad > 0 ? 1 : 0;
  }
  // rm
  std::vector<fs::path> victims;
  if (a.all) victims = checkpoints(a.dir);
  for (const auto& f : a.files) victims.push_back(fs::path(a.dir) / fs::path(f).filename());
  if (victims.empty()) {
    std::fprintf(stderr, "flashbox kv rm: name checkpoint files or pass --all\n");
    return 2;
  }
  int rc = 0;
  for (const auto& f : victims) {
    std::error_code ec;
    if (f.extension() != ".fbkv" || !fs::remove(f, ec)) {
      std::fprintf(stderr, "flashbox kv rm: %s: %s\n", f.string().c_str(), ec ? ec.message().c_str() : "not a checkpoint file");
      rc = 1;
    } else {
      std::printf("removed %s\n", f.filename().string().c_str());
    }
  }
  return rc;
}

}  // namespace

Runner add_kv(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("action", a->action, "ls, verify or rm")->required()->check(CLI::IsMember({"ls", "verify", "rm"}));
  app.add_option("dir", a->dir, "the --kv-cache folder")->required();
  app.add_option("files", a->files, "rm: checkpoint file names");
  app.add_flag("--all", a->all, "rm: every checkpoint in the folder");
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
