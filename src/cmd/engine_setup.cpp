#include "cmd/engine_setup.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/mapped_file.h"
#include "cmd/commands.h"
#include "engine/executor_factory.h"
#include "engine/scripted_executor.h"

namespace fb::cmd {

namespace fs = std::filesystem;

void EngineSetup::add_flags(CLI::App& app) {
  app.add_option("--model", model_dir, "model folder (default: the built-in tiny model, tiny-model/)");
  app.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--no-dspark", no_dspark, "disable DSpark speculative decoding");
  app.add_option("--prefill-chunk", prefill_chunk, "prompt rows per prefill step (default: 256 on the CPU, 2048 with CUDA tensor-core prefill)");
  app.add_flag("--prefill-replay", prefill_replay,
               "approximate prefill (SWA bounded replay, spec/11 sec. 8.4): decoder layers run only over the last window of a long prompt");
  app.add_option("--max-context", max_context, "context limit in tokens (default: the model's)");
  app.add_option("--expert-slots", tiers.expert_slots,
                 "routed experts per layer kept resident (CUDA: HBM slots; CPU: the first host tier); the rest are read through the "
                 "host cache and the drives on demand (0: every expert resident; default -1: CUDA plans the slots from its free HBM, "
                 "all resident when they fit; the CPU keeps every expert)");
  app.add_option("--host-experts", tiers.host_experts, "with --expert-slots: expert records in the host-RAM cache (default: --expert-slots)");
  app.add_option("--expert-store", tiers.expert_store,
                 "with --expert-slots: expert-store replicas written by flashbox convert (default: read the snapshot's shards)");
  app.add_option("--expert-staging", tiers.expert_staging, "with --expert-slots on CUDA: staging slots per layer for LFU admission");
  app.add_option("--host-compute", tiers.host_compute,
                 "with --expert-slots on CUDA: cold experts computed on the host CPU beside the copies over PCIe (0 off, the default; "
                 "1 the misses split between the two; 2 every miss on the host). Exact class: the same bits. Fast class: a row's "
                 "bits then depend on which of its experts the host ran (docs/tiers.md)")
      ->check(CLI::Range(0, 2));
  app.add_flag("--expert-predict", tiers.expert_predict,
               "with --expert-slots: next-layer expert prediction: each tiered layer also routes its input through the next layer's "
               "gate and starts those experts' copies (CUDA slots) or drive reads (host tiers) a layer early; the same outputs (off by default)");
  app.add_option("--engram-cache-bytes", tiers.engram_cache_bytes,
                 "Engram tables on the drives: read their rows from the snapshot's shards with direct I/O through a host row cache of "
                 "this many bytes (0: no cache; -1: read them through the memory mapping, i.e. the page cache; default: the mapping "
                 "while the tables take at most half the available memory, else a row cache of min(1 GiB, 5% of it))");
  app.add_option("--engram-replica", tiers.engram_replicas,
                 "with --engram-cache-bytes: a copy of the snapshot's shard files on another drive (repeatable; reads spread over them, "
                 "a failing one is left out)");
  app.add_option("--engram-store", tiers.engram_store,
                 "read the Engram rows from these Engram stores (flashbox convert --engram; replicas on other drives; one 4 KiB read a "
                 "row) through the row cache of --engram-cache-bytes (default min(1 GiB, 5% of the memory))");
  app.add_option("--numerics", tiers.numerics,
                 "CUDA numerics class: fast (default: tensor cores, fused kernels, tolerance-gated) or exact (bit-identical to the CPU reference)")
      ->check(CLI::IsMember({"fast", "exact"}));
  app.add_flag("--op-times", tiers.op_times,
               "CUDA: time each op of the forward pass on the device (CUDA events) for the dashboard's and /metrics' step time by "
               "op family (the CPU executor always times its ops)");
  app.add_option("--kv-cache", kv_cache,
                 "disk KV cache folder: prompts that start with a stored prompt restore its state instead of prefilling it "
                 "(across requests and restarts; CPU executor for now)");
  app.add_option("--kv-cache-bytes", kv_cache_bytes, "size budget of --kv-cache (least recently used checkpoints go first)")->capture_default_str();
  app.add_option("--kv-checkpoint-every", kv_checkpoint_every,
                 "with --kv-cache: also checkpoint a generation every N generated tokens (0: only at its end, when the whole "
                 "conversation is stored for the next turn)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-queue", max_queue, "requests waiting for the engine before new ones are refused (HTTP 429)");
  app.add_option("--max-sessions", max_sessions,
                 "requests generated at once: each step carries every active session's decode rows (idle sessions stay cached for "
                 "prefix reuse)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kv-budget-bytes", kv_budget_bytes,
                 "KV memory for active sessions: a request is admitted when its KV at prompt + max_tokens positions (spec/12 "
                 "sizes) fits, else it waits in the queue (0: no byte limit, --max-sessions only)");
  app.add_option("--mixed-prefill-rows", mixed_prefill_rows,
                 "prompt rows per step while other sessions decode (0: measured: as many as keep the step within "
                 "--mixed-step-factor times a decode-only step)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mixed-step-factor", mixed_step_factor,
                 "bound on the time of a step carrying a prompt chunk beside decode rows, over a decode-only step's: the other "
                 "streams' inter-token gap while a prompt comes in")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  app.add_option("--scripted-output", scripted_output, "TEST ONLY: emit this file's text instead of running a model")->group("");
}

Result<LoadedEngine> load_engine(const EngineSetup& s) {
  LoadedEngine le;
  std::string dir = s.model_dir;
  if (dir.empty() && s.scripted_output.empty()) {
    for (const std::string cand : {std::string("tiny-model"), std::string(FB_SOURCE_DIR) + "/tiny-model"})
      if (fs::exists(fs::path(cand) / "config.json")) {
        dir = cand;
        break;
      }
    if (dir.empty()) {
      // Out of the box: the first run creates the built-in tiny model (a few seconds).
      std::fprintf(stderr, "no --model given: creating the built-in tiny model in tiny-model/ (once)\n");
      Status st = make_tiny_model("tiny-model", 0, false);
      if (!st.ok())
        return st.with_context("creating the built-in tiny model (or pass --model DIR, a DeepSeek-V4.1-Flash snapshot)");
      dir = "tiny-model";
    }
  }
  if (!dir.empty() && !fs::exists(fs::path(dir) / "config.json"))
    return FB_ERROR(kNotFound) << dir << " holds no config.json (pass --model with a model folder, or run flashbox make-tiny --out tiny-model)";
  std::string tok_path = std::string(FB_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json";
  if (!dir.empty() && fs::exists(fs::path(dir) / "tokenizer.json")) tok_path = (fs::path(dir) / "tokenizer.json").string();
  auto tok = tokenizer::Tokenizer::load(tok_path);
  if (!tok.ok()) return tok.status().with_context("loading the tokenizer " + tok_path);
  le.tok = std::make_unique<tokenizer::Tokenizer>(std::move(tok).value());

  std::unique_ptr<model::Executor> ex;
  std::shared_ptr<storage::TieredExperts> tiers;  // the experts' host tiers, when the executor reads through them
  if (!s.scripted_output.empty()) {
    std::string text = FB_TRY(read_file_bytes(s.scripted_output));
    std::vector<std::vector<int32_t>> scripts;
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("outputs") && j["outputs"].is_array()) {
      for (auto& o : j["outputs"])
        if (o.is_string()) scripts.push_back(le.tok->encode(o.get<std::string>()));
    } else {
      scripts.push_back(le.tok->encode(text));
    }
    ex = std::make_unique<engine::ScriptedExecutor>(le.tok->vocab_size(), std::move(scripts), s.max_context > 0 ? s.max_context : 65536);
    le.model_name = "scripted";
  } else {
    engine::ExecutorOptions eo = s.tiers;
    if (s.max_context > 0) eo.context_tokens = s.max_context;
    ex = FB_TRY(engine::make_executor(s.backend, dir, eo, &tiers));
    if (s.prefill_replay && !ex->supports_bounded_replay())
      return FB_ERROR(kUnsupported) << "--prefill-replay: the " << ex->name() << " executor does not run bounded replay (use --backend cpu)";
    le.model_dir = dir;
    le.model_name = fs::path(dir).filename().string();
    if (le.model_name.empty()) le.model_name = fs::path(dir).parent_path().filename().string();
    if (ex->config().vocab_size < le.tok->vocab_size())
      FB_LOG(kWarn) << "the model's vocabulary (" << ex->config().vocab_size << ") is smaller than the tokenizer's ("
                    << le.tok->vocab_size() << "): prompts with ids beyond it are rejected";
  }
  engine::EngineOptions eo;
  if (!s.kv_cache.empty()) {
    // The executor must serialize its sessions (an empty session answers whether it can).
    if (!ex->save_session(*ex->new_session()).ok()) {
      FB_LOG(kWarn) << "--kv-cache: the " << ex->name() << " executor does not serialize sessions yet; the disk KV cache is off";
    } else {
      auto store = engine::KvStore::open(s.kv_cache, s.kv_cache_bytes, ex->identity());
      if (!store.ok()) return store.status().with_context("--kv-cache " + s.kv_cache);
      std::fprintf(stderr, "kv cache: %s, %lld checkpoints, %.1f MB of %.1f MB\n", s.kv_cache.c_str(), (long long)(*store)->stats().entries,
                   double((*store)->stats().bytes) / 1e6, double(s.kv_cache_bytes) / 1e6);
      eo.generator.kv_store = std::shared_ptr<engine::KvStore>(std::move(store.value()));
      eo.generator.kv_checkpoint_every = s.kv_checkpoint_every;
    }
  }
  eo.generator.dspark = !s.no_dspark;
  eo.generator.prefill_chunk = s.prefill_chunk;
  eo.generator.prefill_replay = s.prefill_replay;
  eo.generator.max_context = s.max_context;
  eo.max_queue = s.max_queue;
  eo.max_sessions = s.max_sessions;
  eo.kv_budget_bytes = s.kv_budget_bytes;
  eo.mixed_prefill_rows = s.mixed_prefill_rows;
  eo.mixed_step_factor = s.mixed_step_factor;
  eo.expert_tiers = tiers;
  le.engine = std::make_unique<engine::Engine>(std::move(ex), *le.tok, eo);
  return le;
}

}  // namespace fb::cmd
