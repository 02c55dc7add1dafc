// flashbox convert --model DIR --out DIR [--replicas DIR...] [--engram]: writes the expert-major
// store (storage/expert_store.h) and its replicas, each atomically, and validates every copy;
// with --engram also the Engram store (storage/engram_rows.h: rows of codes + scales together,
// one 4 KiB read a row) into the same folders.
#include <cstdio>
#include <memory>
#include <string>

#include "base/progress.h"
#include "cmd/commands.h"
#include "loader/snapshot.h"
#include "storage/engram_rows.h"
#include "storage/expert_store.h"

namespace fb::cmd {

namespace {

struct ConvertArgs {
  std::string model, out;
  std::vector<std::string> replicas;
  bool engram = false;
};

int run_convert(const ConvertArgs& a) {
  auto snap = loader::Snapshot::open(a.model);
  if (!snap.ok()) {
    std::fprintf(stderr, "convert: %s\n", snap.status().to_string().c_str());
    return 2;
  }
  // On a terminal only (a log or a pipe gets the result line alone), one line per phase: the
  // experts written, each replica's copy (bytes), each copy's records read back and checked.
  std::unique_ptr<Progress> progress = std::make_unique<Progress>("convert", 0, "experts");
  using Phase = storage::ConvertProgress::Phase;
  Phase phase = Phase::kWrite;
  std::string dir = a.out;
  Status st = storage::write_expert_store(**snap, a.out, a.replicas, [&](const storage::ConvertProgress& p) {
    if (p.phase != phase || p.dir != dir) {
      progress->finish();
      phase = p.phase;
      dir = p.dir;
      if (phase == Phase::kCopy)
        progress = std::make_unique<Progress>("copy to " + dir, p.total, ProgressUnit::kBytes);
      else
        progress = std::make_unique<Progress>("validate " + dir, p.total, "experts");
    }
    progress->set_total(p.total);
    progress->update(p.done);
  });
  if (st.ok()) progress->finish();
  if (!st.ok()) {
    std::fprintf(stderr, "convert: %s\n", st.to_string().c_str());
    return 1;
  }
  if (a.engram) {
    std::vector<std::string> dirs{a.out};
    dirs.insert(dirs.end(), a.replicas.begin(), a.replicas.end());
    std::unique_ptr<Progress> ep;
    std::string at;
    Status es = storage::write_engram_store(**snap, dirs, [&](const std::string& d, uint64_t done, uint64_t total) {
      if (d != at) {
        if (ep) ep->finish();
        ep = std::make_unique<Progress>("engram store " + d, int64_t(total), ProgressUnit::kBytes);
        at = d;
      }
      ep->update(int64_t(done));
    });
    if (ep && es.ok()) ep->finish();
    if (!es.ok()) {
      std::fprintf(stderr, "convert: --engram: %s\n", es.to_string().c_str());
      return 1;
    }
    std::printf("convert: wrote the Engram store %s in %zu folder(s); every copy checked\n", storage::kEngramStoreFile, dirs.size());
  }
  auto store = storage::ExpertStore::open(a.out);
  std::printf("convert: wrote %s/%s (%d layers, %llu B per expert) and %zu replica(s); every copy validated\n", a.out.c_str(),
              storage::kStoreFile, (*store)->n_layers(), (unsigned long long)(*store)->layout().stride_bytes, a.replicas.size());
  return 0;
}

}  // namespace

Runner add_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  app.add_option("--model", a->model, "snapshot folder (config.json, index, shards)")->required();
  app.add_option("--out", a->out, "folder for experts.fbx")->required();
  app.add_option("--replicas", a->replicas, "more folders (other drives) that get a byte-identical copy");
  app.add_flag("--engram", a->engram,
               "also write the Engram store (engram.fbe: every Engram row's codes and scales together, one 4 KiB read a row) into "
               "--out and each replica, for --engram-store");
  return [a] { return run_convert(*a); };
}

}  // namespace fb::cmd
