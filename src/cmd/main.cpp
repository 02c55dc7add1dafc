// flashbox: DeepSeek-V4.1-Flash inference runtime. Thin dispatch to the subcommands.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cmd/commands.h"
#ifdef FB_HAVE_TOKENIZER
#include "tokenizer/tokenize_command.h"
#endif

int main(int argc, char** argv) {
#ifdef FB_HAVE_TOKENIZER
  // `tokenize` owns its own flags (reads stdin, prints ids).
  if (argc >= 2 && std::string(argv[1]) == "tokenize") return fb::tokenizer::run_tokenize_command(argc - 1, argv + 1);
#endif
  CLI::App app{"flashbox: DeepSeek-V4.1-Flash on one box"};
  app.require_subcommand(1);
  int threads = 0;
  std::string log_level = "info";
  app.add_option("--threads", threads, "CPU threads (0 = all cores)");
  app.add_option("--log", log_level, "log level: debug, info, warn, error");
  std::map<CLI::App*, fb::cmd::Runner> runners;
  auto reg = [&](const char* name, const char* help, fb::cmd::Runner (*add)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    runners[sub] = add(*sub);
  };
  reg("inspect", "validate a snapshot and print its config, layer roles and bytes per class", fb::cmd::add_inspect);
  reg("check-fixture", "run an official-reference fixture and compare logits, ids, taps and drafts", fb::cmd::add_check_fixture);
  reg("replay-quality", "KL and top-1 of bounded-replay prefill against exact prefill (spec/11 sec. 8.4)", fb::cmd::add_replay_quality);
  reg("probe", "measure RAM, cores, drives and the GPU; print the memory plan and decode bounds", fb::cmd::add_probe);
  reg("convert", "write the expert-major store (and replicas) from a snapshot", fb::cmd::add_convert);
  reg("kv", "list, verify or remove the disk KV cache's checkpoints (ls|verify|rm DIR)", fb::cmd::add_kv);
#ifdef FB_HAVE_TOKENIZER
  reg("make-tiny", "write a random checkpoint in the released format (the built-in tiny model)", fb::cmd::add_make_tiny);
  reg("engram-sim", "the Engram row cache's hit rate on real text at several budgets (drive reads per token)", fb::cmd::add_engram_sim);
  app.add_subcommand("tokenize", "encode stdin with a tokenizer.json (or --decode ids); see --help of the subcommand");
#endif
#ifdef FB_HAVE_BENCH
  reg("bench", "benchmark rows (CSV) next to the measured physical limits", fb::cmd::add_bench);
#endif
#ifdef FB_HAVE_SERVER
  reg("serve", "OpenAI- and Anthropic-compatible HTTP server", fb::cmd::add_serve);
  reg("chat", "interactive multi-turn chat (/reset, /save FILE, /quit)", fb::cmd::add_chat);
  reg("run", "answer one prompt (-p) and exit", fb::cmd::add_run);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  fb::set_thread_count(threads);
  if (log_level == "debug") fb::set_log_level(fb::LogLevel::kDebug);
  else if (log_level == "warn") fb::set_log_level(fb::LogLevel::kWarn);
  else if (log_level == "error") fb::set_log_level(fb::LogLevel::kError);
  for (auto& [sub, run] : runners)
    if (sub->parsed()) return run();
  return 2;
}
