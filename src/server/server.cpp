#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/mapped_file.h"
#include "server/dashboard.h"
#include "server/http_status.h"
#include "server/metrics_text.h"
#include "server/peer_socket.h"
#include "server/phrase_bias.h"
#include "server/request_parse.h"
#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif
#include "server/responder.h"

namespace fb::server {

namespace {

using Clock = std::chrono::steady_clock;
int64_t ms_since(Clock::time_point t) { return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count(); }
constexpr int kDisconnectPollMs = 200;  // how often a waiting request checks its client

Api api_of(Endpoint ep) { return ep == Endpoint::kMessages ? Api::kAnthropic : Api::kOpenAi; }

void send_error(httplib::Response& res, Api api, const HttpError& e, const std::string& msg) {
  res.status = e.http;
  // A full queue clears as sessions finish (seconds at most on a warm server); the SDKs honour
  // Retry-After in their retry backoff.
  if (e.http == 429) res.set_header("Retry-After", "1");
  res.set_content(error_body(api, e, msg), "application/json");
}

bool authorized(const httplib::Request& req, const ServerOptions& opt) {
  return api_key_ok(opt.api_key, req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
}

void handle_generate(engine::Engine& eng, const ServerOptions& opt, const grammar::Compiler* gram,
                     const std::vector<engine::PhraseBias>* phrase_bias, Endpoint ep, const httplib::Request& req, httplib::Response& res) {
  const Api api = api_of(ep);
  if (!authorized(req, opt)) return send_error(res, api, http_error_for_http(401), "invalid or missing API key");
  ojson body = ojson::parse(req.body, nullptr, false);
  if (body.is_discarded()) return send_error(res, api, http_error_for_http(400), "the request body is not valid JSON");
  ParseContext ctx;
  ctx.tok = &eng.tokenizer();
  ctx.max_context = eng.max_context();
  ctx.tools_template = opt.tools_template;
  ctx.grammar = gram;
  ctx.phrase_bias = phrase_bias;
  // Images: decoded and preprocessed here; the tower runs on the engine's executor. A model
  // without one answers image parts with 400 "model has no vision tower".
  ctx.images.vision = eng.config().has_vision() ? &eng.config() : nullptr;
  ctx.images.allow_local = opt.allow_local_images;
  ctx.images.max_images = opt.max_images;
  ctx.image_token_id = int32_t(eng.config().image_token_id);
  auto parsed = parse_request(ep, body, ctx);
  if (!parsed.ok()) return send_error(res, api, http_error_for(parsed.status().code()), parsed.status().message());
  auto responder = std::make_shared<Responder>(parsed.value(), opt.model_name);
  engine::EventQueue q;
  auto id = eng.submit(parsed->req, q.sink());
  if (!id.ok()) return send_error(res, api, http_error_for(id.status().code()), id.status().message());
  const uint64_t rid = *id;
  // The client's socket, polled while the request waits: a disconnect cancels it (streaming
  // or not), freeing the engine for the next request.
  const PeerSocket peer(req.remote_addr, req.remote_port);
  if (!parsed->stream) {
    engine::Event e;
    auto checked = Clock::now();
    for (;;) {
      const bool got = q.pop(&e, kDisconnectPollMs);
      if (!got || ms_since(checked) >= kDisconnectPollMs) {
        checked = Clock::now();
        if (peer.closed()) {
          eng.cancel(rid);
          FB_LOG(kInfo) << "request " << rid << ": client disconnected, cancelled";
          return;  // nobody reads the response; the engine ends the request with Done(kCancelled)
        }
      }
      if (!got) continue;
      if (e.kind == engine::Event::Kind::kError) return send_error(res, api, http_error_for(e.status.code()), e.status.message());
      if (e.kind == engine::Event::Kind::kDone) break;
      responder->on_event(e);
    }
    res.set_content(responder->body(e), "application/json");
    return;
  }
  const int keepalive = std::max(1, opt.keepalive_ms);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [&eng, q, responder, rid, keepalive, api, peer](size_t, httplib::DataSink& sink) mutable {
    auto last_write = Clock::now();
    auto write = [&](const std::string& s) {
      if (s.empty()) return true;
      last_write = Clock::now();
      return sink.write(s.data(), s.size());
    };
    if (!write(responder->stream_start())) {
      eng.cancel(rid);
      return false;
    }
    engine::Event e;
    for (;;) {
      const bool got = q.pop(&e, std::min(keepalive, kDisconnectPollMs));
      if (!got || e.kind == engine::Event::Kind::kPrefill) {
        // Nothing to send (waiting in the queue, or prefilling, spec/16 §7): a comment line /
        // Anthropic ping every keepalive_ms keeps proxies and clients from timing out; the
        // socket poll finds a client that left without waiting for a failed write.
        if (peer.closed()) {
          eng.cancel(rid);
          return false;
        }
        if (ms_since(last_write) >= keepalive &&
            !write(api == Api::kAnthropic ? "event: ping\ndata: {\"type\": \"ping\"}\n\n" : ": keep-alive\n\n")) {
          eng.cancel(rid);
          return false;
        }
        continue;
      }
      std::string out;
      if (e.kind == engine::Event::Kind::kError) {
        const HttpError he = http_error_for(e.status.code());
        out = (api == Api::kAnthropic ? "event: error\n" : "") + std::string("data: ") + error_body(api, he, e.status.message()) + "\n\n";
        write(out);
        sink.done();
        return true;
      }
      if (e.kind == engine::Event::Kind::kDone) {
        write(responder->stream_end(e));
        sink.done();
        return true;
      }
      if (!write(responder->on_event(e))) {
        eng.cancel(rid);
        return false;
      }
    }
  });
}

}  // namespace

Status serve(engine::Engine& eng, const ServerOptions& opt) {
  httplib::Server svr;
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_read_timeout(30, 0);
  // The grammar engine's view of the vocabulary, built once (tens of ms) for every response_format.
#if FB_SERVER_HAS_GRAMMAR
  auto gc = grammar::Compiler::create(eng.tokenizer(), eng.config().vocab_size, int32_t(eng.config().eos_token_id));
  if (!gc.ok()) return gc.status();
  const std::unique_ptr<grammar::Compiler> gram_owner = std::move(gc).value();
  const grammar::Compiler* gram = gram_owner.get();
#else
  const grammar::Compiler* gram = nullptr;
#endif
  // The server's phrase bias list (issue 27), tokenized once; a bad file stops the server here.
  std::vector<engine::PhraseBias> phrase_bias;
  if (!opt.phrase_bias_file.empty()) {
    auto text = read_file_bytes(opt.phrase_bias_file);
    if (!text.ok()) return text.status();
    const ojson j = ojson::parse(*text, nullptr, false);
    if (j.is_discarded()) return FB_ERROR(kInvalidArgument) << "--phrase-bias " << opt.phrase_bias_file << ": not valid JSON";
    phrase_bias = FB_TRY(parse_phrase_bias(j, eng.tokenizer(), "--phrase-bias " + opt.phrase_bias_file, 4 * kMaxPhraseBiasEntries));
    FB_LOG(kInfo) << "phrase bias: " << phrase_bias.size() << " entries from " << opt.phrase_bias_file;
  }
  const std::vector<engine::PhraseBias>* pb = phrase_bias.empty() ? nullptr : &phrase_bias;
  auto guard = [&eng, &opt, gram, pb](Endpoint ep) {
    return [&eng, &opt, gram, pb, ep](const httplib::Request& req, httplib::Response& res) {
      try {
        handle_generate(eng, opt, gram, pb, ep, req, res);
      } catch (const std::exception& ex) {  // the JSON library's boundary (STYLE.md "Errors")
        send_error(res, api_of(ep), http_error_for_http(400), std::string("bad request: ") + ex.what());
      }
    };
  };
  svr.Post("/v1/chat/completions", guard(Endpoint::kChat));
  svr.Post("/v1/completions", guard(Endpoint::kCompletions));
  svr.Post("/v1/responses", guard(Endpoint::kResponses));
  svr.Post("/v1/messages", guard(Endpoint::kMessages));
  auto models = [&opt](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, opt)) return send_error(res, Api::kOpenAi, http_error_for_http(401), "invalid or missing API key");
    nlohmann::json m = {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "flashbox"}};
    res.set_content(nlohmann::json{{"object", "list"}, {"data", nlohmann::json::array({m})}}.dump(), "application/json");
  };
  svr.Get("/v1/models", models);
  svr.Get("/health", [&eng](const httplib::Request&, httplib::Response& res) {
    nlohmann::json h = {{"status", "ok"}, {"backend", eng.backend_name()}, {"max_context", eng.max_context()}};
    res.set_content(h.dump(), "application/json");
  });
  // Prometheus text format (metrics_text.h); no key, as before (counters only, no request content).
  svr.Get("/metrics", [&eng, &opt, t0 = Clock::now()](const httplib::Request&, httplib::Response& res) {
    StatsSource src;
    src.backend = eng.backend_name();
    src.model = opt.model_name;
    src.uptime_s = std::chrono::duration<double>(Clock::now() - t0).count();
    src.has_dspark = eng.config().dspark_block_size > 0;
    res.set_content(metrics_text(eng.stats(), src), "text/plain; version=0.0.4; charset=utf-8");
  });
  add_dashboard(svr, eng, opt);  // GET / (the live dashboard) and /v1/stats (its JSON)
  // A known path with the wrong method is 405 with an Allow header (not 404 "no such endpoint").
  auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      const Api api = req.path.rfind("/v1/messages", 0) == 0 ? Api::kAnthropic : Api::kOpenAi;
      res.set_header("Allow", allow);
      send_error(res, api, http_error_for_http(405), std::string("method ") + req.method + " not allowed on " + req.path + " (use " + allow + ")");
    };
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}) {
    svr.Get(path, wrong_method("POST"));
    svr.Put(path, wrong_method("POST"));
    svr.Delete(path, wrong_method("POST"));
    svr.Patch(path, wrong_method("POST"));
  }
  for (const char* path : {"/v1/models", "/health", "/metrics"}) {
    svr.Post(path, wrong_method("GET"));
    svr.Put(path, wrong_method("GET"));
    svr.Delete(path, wrong_method("GET"));
  }
  // Errors raised by httplib itself (413 oversized, 404 unknown path, 400 unparsable HTTP) get a
  // JSON body too; the Anthropic path gets its own format.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const Api api = req.path.rfind("/v1/messages", 0) == 0 ? Api::kAnthropic : Api::kOpenAi;
    const int code = res.status == 404 ? 404 : res.status;
    std::string msg = code == 404 ? "no such endpoint: " + req.path : code == 413 ? "request body too large" : "bad request";
    res.set_content(error_body(api, http_error_for_http(code), msg), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    const Api api = req.path.rfind("/v1/messages", 0) == 0 ? Api::kAnthropic : Api::kOpenAi;
    send_error(res, api, http_error_for_http(400), "bad request");
  });
  if (!svr.bind_to_port(opt.host, opt.port)) return FB_ERROR(kIo) << "cannot listen on " << opt.host << ":" << opt.port;
  FB_LOG(kInfo) << "flashbox serving on http://" << opt.host << ":" << opt.port << " (backend " << eng.backend_name() << ")";
  std::fprintf(stderr, "listening on http://%s:%d\n", opt.host.c_str(), opt.port);
  if (!svr.listen_after_bind()) return FB_ERROR(kIo) << "the HTTP server stopped";
  return Status();
}

}  // namespace fb::server
