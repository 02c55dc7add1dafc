// flashbox serve: the HTTP server on one engine (issue 8).
#include "cmd/commands.h"
#include "cmd/engine_setup.h"
#include "server/server.h"

namespace fb::cmd {

Runner add_serve(CLI::App& app) {
  auto setup = std::make_shared<EngineSetup>();
  auto opt = std::make_shared<server::ServerOptions>();
  setup->add_flags(app);
  app.add_option("--host", opt->host, "address to listen on");
  app.add_option("--port", opt->port, "port");
  app.add_option("--api-key", opt->api_key, "require this key (Authorization: Bearer KEY or x-api-key)");
  app.add_option("--served-model-name", opt->model_name, "model id reported by /v1/models");
  app.add_option("--max-body-bytes", opt->max_body_bytes, "larger request bodies get 413");
  app.add_flag("--allow-local-images", opt->allow_local_images, "accept file:// paths in image parts (never network URLs)");
  app.add_option("--max-images", opt->max_images, "images per request");
  app.add_option("--phrase-bias", opt->phrase_bias_file,
                 "JSON file of phrase biases applied to every request ({\"phrase\": bias} or a list; a request's phrase_bias overrides)");
  app.add_option("--sse-keepalive-ms", opt->keepalive_ms, "SSE keep-alive comment / Anthropic ping interval while nothing is sent");
  return [setup, opt] {
    auto le = load_engine(*setup);
    if (!le.ok()) {
      std::fprintf(stderr, "flashbox serve: %s\n", le.status().message().c_str());
      return 2;
    }
    // Images (issue 10): the HTTP threads decode and preprocess them; the tower runs on the
    // engine's executor (the GPU one under --backend cuda). No second copy of its weights.
    Status s = server::serve(*le->engine, *opt);
    if (!s.ok()) {
      std::fprintf(stderr, "flashbox serve: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace fb::cmd
