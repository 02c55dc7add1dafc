// flashbox convert --model DIR --out DIR [--replicas DIR...]: writes the expert-major store
// (storage/expert_store.h) and its replicas, each atomically, and validates every copy.
#include <cstdio>
#include <memory>

#include "base/progress.h"
#include "cmd/commands.h"
#include "loader/snapshot.h"
#include "storage/expert_store.h"

namespace fb::cmd {

namespace {

struct ConvertArgs {
  std::string model, out;
  std::vector<std::string> replicas;
};

int run_convert(const ConvertArgs& a) {
  auto snap = loader::Snapshot::open(a.model);
  if (!snap.ok()) {
    std::fprintf(stderr, "convert: %s\n", snap.status().to_string().c_str());
    return 2;
  }
  // Experts written, rate and ETA on a terminal only (a log or a pipe gets the result line alone).
  Progress progress("convert", 0, "experts");
  Status st = storage::write_expert_store(**snap, a.out, a.replicas, [&progress](const storage::ConvertProgress& p) {
    progress.set_total(p.total);
    progress.update(p.done);
  });
  if (st.ok()) progress.finish();
  if (!st.ok()) {
    std::fprintf(stderr, "convert: %s\n", st.to_string().c_str());
    return 1;
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
  return [a] { return run_convert(*a); };
}

}  // namespace fb::cmd
