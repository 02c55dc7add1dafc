// Subcommands of the flashbox CLI. Each registers its flags on the CLI11 app and returns the
// process exit code when run. main() only dispatches.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "base/status.h"

namespace fb::cmd {

using Runner = std::function<int()>;

Runner add_inspect(CLI::App& app);
Runner add_check_fixture(CLI::App& app);
Runner add_replay_quality(CLI::App& app);
Runner add_make_tiny(CLI::App& app);
Runner add_engram_sim(CLI::App& app);  // builds with the tokenizer (FB_HAVE_TOKENIZER)
// The built-in tiny model (make-tiny): checkpoint + tokenizer + Engram map in `out`.
Status make_tiny_model(const std::string& out, uint64_t seed, bool vision, const std::string& tokenizer_path = "", bool smooth = false);
Runner add_probe(CLI::App& app);
Runner add_convert(CLI::App& app);
Runner add_kv(CLI::App& app);  // flashbox kv ls|verify|rm DIR (the disk KV cache)
Runner add_bench(CLI::App& app);
Runner add_serve(CLI::App& app);  // serve, chat, run: builds with the server (FB_HAVE_SERVER)
Runner add_chat(CLI::App& app);
Runner add_run(CLI::App& app);

}  // namespace fb::cmd
