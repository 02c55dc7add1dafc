// Shared setup of serve/chat/run: model folder (default: the built-in tiny model), tokenizer
// (DIR/tokenizer.json, else the V4.1-equivalent asset), backend, engine options.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/executor_factory.h"

namespace fb::cmd {

struct EngineSetup {
  std::string model_dir;          // empty: tiny-model/ in the working or source directory
  std::string backend = "cpu";
  bool no_dspark = false;
  int prefill_chunk = 0;          // 0: the executor's preference (CPU 256, CUDA 2048)
  bool prefill_replay = false;    // [approx-approved] SWA bounded replay of long prompts (spec/11 §8.4)
  int64_t max_context = 0;
  int max_queue = 64;             // waiting requests before new ones get 429
  int max_sessions = 8;           // requests generating at once (shared steps, issue 20)
  uint64_t kv_budget_bytes = 0;   // KV admission budget (0: none; max_sessions only)
  int64_t mixed_prefill_rows = 0; // prompt rows in a step that carries decode rows (0: measured, see mixed_step_factor)
  double mixed_step_factor = 2.0; // such a step's time over a decode-only step's (engine::PrefillPolicy)
  std::string scripted_output;    // TEST ONLY: a scripted executor emits this text (or JSON {"outputs": [...]})
  std::string kv_cache;           // disk KV cache folder (empty: off)
  uint64_t kv_cache_bytes = uint64_t(8) << 30;
  int64_t kv_checkpoint_every = 4096;  // GeneratorOptions::kv_checkpoint_every
  engine::ExecutorOptions tiers = auto_tiers();  // routed experts through the tiers (--expert-slots ...)
  static engine::ExecutorOptions auto_tiers() {
    engine::ExecutorOptions o;
    o.expert_slots = engine::ExecutorOptions::kAutoSlots;
    o.engram_cache_bytes = engine::ExecutorOptions::kAutoEngramCache;
    return o;
  }
  void add_flags(CLI::App& app);
};

struct LoadedEngine {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<engine::Engine> engine;
  std::string model_name;
  std::string model_dir;          // resolved model folder (empty for the scripted executor)
};

// Errors carry a message telling the user what to do (e.g. run make-tiny).
Result<LoadedEngine> load_engine(const EngineSetup& s);

}  // namespace fb::cmd
