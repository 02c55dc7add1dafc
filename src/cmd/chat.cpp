// flashbox chat (interactive, multi-turn, streaming) and flashbox run -p (one prompt). Both
// render with the V4.1 prompt encoder and stream engine events; prefill progress on stderr.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "cmd/commands.h"
#include "cmd/engine_setup.h"
#include "tokenizer/prompt_encoder.h"

namespace fb::cmd {

namespace {

struct ChatOptions {
  EngineSetup setup;
  bool no_think = false;
  float temperature = 1.0f, top_p = 0.95f;
  int64_t max_tokens = 512;
  std::optional<uint64_t> seed;
  std::string system;
  std::string prompt;
  void add(CLI::App& app) {
    setup.add_flags(app);
    app.add_flag("--no-think", no_think, "chat mode (no reasoning)");
    app.add_option("--temperature", temperature, "sampling temperature, 0 = greedy (default 1.0 with top-p 0.95: the recipe's defaults)")
        ->capture_default_str();
    app.add_option("--top-p", top_p, "nucleus sampling")->capture_default_str();
    app.add_option("--max-tokens", max_tokens, "generated tokens per answer");
    app.add_option("--seed", seed, "sampling seed");
    app.add_option("--system", system, "system prompt");
  }
};

// One assistant turn: returns the answer text (and reasoning) for the history.
Result<std::pair<std::string, std::string>> generate(LoadedEngine& le, const ChatOptions& o, const nlohmann::ordered_json& messages) {
  auto msgs = FB_TRY(tokenizer::messages_from_json(messages));
  tokenizer::PromptOptions po;
  po.mode = o.no_think ? tokenizer::ThinkingMode::kChat : tokenizer::ThinkingMode::kThinking;
  auto rendered = FB_TRY(tokenizer::render_prompt(std::move(msgs), po));
  engine::Request req;
  req.prompt = le.tok->encode(rendered.text);
  req.thinking = !o.no_think;
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.seed = o.seed;
  req.max_tokens = o.max_tokens;
  engine::EventQueue q;
  FB_TRY(le.engine->submit(req, q.sink()));
  std::string text, reasoning;
  bool in_reasoning = false;
  // Reasoning is shown dimmed on a terminal; piped output gets no escape codes.
  const bool tty = isatty(fileno(stdout)) != 0;
  const char* dim = tty ? "\033[2m" : "";
  const char* undim = tty ? "\033[0m" : "";
  // Prefill progress (tokens, tok/s, ETA) only on a terminal: a log or a pipe gets nothing.
  std::unique_ptr<Progress> prefill;
  engine::Event e;
  for (;;) {
    if (!q.pop(&e, 1000)) continue;
    using K = engine::Event::Kind;
    if (e.kind == K::kPrefill) {
      if (e.total > 64) {
        if (!prefill) prefill = std::make_unique<Progress>("prefill", e.total, "tokens");
        prefill->update(e.done);
      }
      continue;
    }
    if (prefill) {  // the answer starts: the line goes away
      prefill->clear();
      prefill.reset();
    }
    if (e.kind == K::kReasoning) {
      if (!in_reasoning) std::printf("%s", dim);
      in_reasoning = true;
      std::printf("%s", e.text.c_str());
      reasoning += e.text;
    } else if (e.kind == K::kText || e.kind == K::kToolCall) {
      if (in_reasoning) std::printf("%s\n", undim);
      in_reasoning = false;
      if (e.kind == K::kText) {
        std::printf("%s", e.text.c_str());
        text += e.text;
      } else {
        std::printf("\n[tool call] %s %s\n", e.call.name.c_str(), e.call.arguments.c_str());
      }
    } else if (e.kind == K::kError) {
      if (in_reasoning) std::printf("%s", undim);
      std::printf("\n");
      std::fflush(stdout);
      return e.status;
    } else if (e.kind == K::kDone) {
      if (in_reasoning) std::printf("%s", undim);
      std::printf("\n");
      std::fflush(stdout);  // the text and its newline before the stats line on stderr
      std::fprintf(stderr, "[%lld prompt tokens (%lld cached), %lld generated, finish %s]\n", (long long)e.usage.prompt_tokens,
                   (long long)e.usage.cached_tokens, (long long)e.usage.completion_tokens, engine::finish_reason_name(e.finish));
      break;
    }
    std::fflush(stdout);
  }
  return std::make_pair(text, reasoning);
}

nlohmann::ordered_json initial(const ChatOptions& o) {
  nlohmann::ordered_json m = nlohmann::ordered_json::array();
  if (!o.system.empty()) m.push_back({{"role", "system"}, {"content", o.system}});
  return m;
}

}  // namespace

Runner add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->add(app);
  return [o] {
    auto le = load_engine(o->setup);
    if (!le.ok()) {
      std::fprintf(stderr, "flashbox chat: %s\n", le.status().message().c_str());
      return 2;
    }
    std::fprintf(stderr, "flashbox chat (%s). Commands: /reset, /save FILE, /quit\n", le->model_name.c_str());
    auto messages = initial(*o);
    std::string line;
    for (;;) {
      std::printf("> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (line == "/quit" || line == "/exit") break;
      if (line == "/reset") {
        messages = initial(*o);
        std::printf("(conversation cleared)\n");
        continue;
      }
      if (line.rfind("/save", 0) == 0) {
        const std::string path = line.size() > 6 ? line.substr(6) : "chat.json";
        std::ofstream f(path);
        f << messages.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
        std::printf(f ? "(saved to %s)\n" : "(could not write %s)\n", path.c_str());
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", line}});
      auto r = generate(*le, *o, messages);
      if (!r.ok()) {
        std::fprintf(stderr, "error: %s\n", r.status().message().c_str());
        messages.erase(messages.end() - 1);
        continue;
      }
      nlohmann::ordered_json a = {{"role", "assistant"}, {"content", r->first}};
      if (!r->second.empty()) a["reasoning_content"] = r->second;
      messages.push_back(a);
    }
    return 0;
  };
}

Runner add_run(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->add(app);
  app.add_option("-p,--prompt", o->prompt, "the prompt")->required();
  return [o] {
    auto le = load_engine(o->setup);
    if (!le.ok()) {
      std::fprintf(stderr, "flashbox run: %s\n", le.status().message().c_str());
      return 2;
    }
    auto messages = initial(*o);
    messages.push_back({{"role", "user"}, {"content", o->prompt}});
    auto r = generate(*le, *o, messages);
    if (!r.ok()) {
      std::fprintf(stderr, "flashbox run: %s\n", r.status().message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace fb::cmd
