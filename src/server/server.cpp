#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/log.h"
#include "base/mapped_file.h"
#include "server/dashboard.h"
#include "server/http_status.h"
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

std::string metrics_text(const engine::Engine& e) {
  const engine::EngineStats s = e.stats();
  std::ostringstream o;
  auto m = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
  };
  m("flashbox_requests_total", "counter", "requests accepted by the engine", double(s.requests_total));
  m("flashbox_requests_failed_total", "counter", "requests that ended in an error", double(s.requests_failed));
  m("flashbox_requests_cancelled_total", "counter", "requests cancelled (client disconnect)", double(s.requests_cancelled));
  m("flashbox_queue_depth", "gauge", "requests waiting for the engine", double(s.queue_depth));
  m("flashbox_requests_active", "gauge", "requests being generated", double(s.active));
  m("flashbox_prompt_tokens_total", "counter", "prompt tokens", double(s.prompt_tokens));
  m("flashbox_prompt_cached_tokens_total", "counter", "prompt tokens reused from a cached session", double(s.cached_tokens));
  m("flashbox_prefill_tokens_total", "counter", "prompt rows run through prefill (prompt minus cached)", double(s.prefill_tokens));
  m("flashbox_kv_cache_restored_tokens_total", "counter", "prompt positions restored from the disk KV cache", double(s.kv_restored_tokens));
  m("flashbox_kv_cache_hits_total", "counter", "disk KV cache lookups that restored a prefix", double(s.kv.hits));
  m("flashbox_kv_cache_misses_total", "counter", "disk KV cache lookups without a stored prefix", double(s.kv.misses));
  m("flashbox_kv_cache_rejected_total", "counter", "damaged or unreadable checkpoint files dropped", double(s.kv.rejected));
  m("flashbox_kv_cache_evicted_total", "counter", "checkpoints evicted to stay within --kv-cache-bytes", double(s.kv.evicted));
  m("flashbox_kv_cache_entries", "gauge", "checkpoints in the disk KV cache", double(s.kv.entries));
  m("flashbox_kv_cache_bytes", "gauge", "bytes of checkpoints on disk", double(s.kv.bytes));
  m("flashbox_kv_cache_delta_entries", "gauge", "checkpoints stored as deltas of a shorter one", double(s.kv.deltas));
  m("flashbox_kv_cache_written_bytes_total", "counter", "bytes of checkpoint files written", double(s.kv.written));
  m("flashbox_generated_tokens_total", "counter", "generated tokens", double(s.generated_tokens));
  m("flashbox_decode_tokens_total", "counter", "tokens emitted by decode steps (plain or DSpark)", double(s.generated_tokens));
  m("flashbox_emitted_tokens_total", "counter", "tokens delivered so far, counted as they come (generated: finished requests)", double(s.emitted_tokens));
  m("flashbox_images_total", "counter", "images in accepted requests", double(s.images));
  m("flashbox_images_encoded_total", "counter", "vision tower runs (an image whose KV is reused is not encoded again)", double(s.images_encoded));
  m("flashbox_image_rows_total", "counter", "image-span rows in accepted requests", double(s.image_rows));
  m("flashbox_image_encode_seconds_total", "counter", "time in the vision tower (engine thread)", s.image_encode_s);
  m("flashbox_prefill_seconds_total", "counter", "time in engine rounds whose step carried prompt rows", s.prefill_s);
  m("flashbox_decode_seconds_total", "counter", "time in engine rounds of decode rows only (drafting included)", s.decode_s);
  m("flashbox_dspark_rounds_total", "counter", "DSpark draft+verify rounds", double(s.dspark.steps));
  m("flashbox_dspark_proposals_total", "counter", "drafted tokens verified", double(s.dspark.proposals));
  m("flashbox_dspark_backoff_steps_total", "counter", "plain decode steps taken because drafting did not pay", double(s.dspark.backoff_steps));
  m("flashbox_dspark_accepted_total", "counter", "drafted tokens accepted", double(s.dspark.accepted));
  m("flashbox_dspark_verify_rows_total", "counter", "target rows run by verification", double(s.dspark.verify_rows));
  m("flashbox_dspark_draft_seconds_total", "counter", "time drafting", s.dspark.draft_s);
  m("flashbox_dspark_verify_seconds_total", "counter", "time verifying", s.dspark.verify_s);
  // Several sessions at once (issue 20): limits, how full the steps are, waiting and speed.
  m("flashbox_max_sessions", "gauge", "requests generated at once (--max-sessions)", double(s.max_sessions));
  m("flashbox_sessions_cached", "gauge", "sessions holding a KV cache (active or kept for prefix reuse)", double(s.sessions_cached));
  m("flashbox_kv_budget_bytes", "gauge", "KV admission budget (--kv-budget-bytes; 0: none)", double(s.kv_budget_bytes));
  m("flashbox_kv_admitted_bytes", "gauge", "KV estimate granted to active requests", double(s.kv_admitted_bytes));
  m("flashbox_queue_rejected_total", "counter", "requests refused with 429 because the queue was full", double(s.queue_rejected));
  m("flashbox_steps_total", "counter", "forward steps run by the engine", double(s.steps));
  m("flashbox_step_rows_total", "counter", "rows in those steps (rows per step = this / steps)", double(s.step_rows));
  m("flashbox_step_prefill_rows_total", "counter", "prompt rows in those steps", double(s.step_prefill_rows));
  m("flashbox_step_decode_rows_total", "counter", "decode and DSpark verify rows in those steps", double(s.step_decode_rows));
  m("flashbox_step_sessions_total", "counter", "sessions in those steps (sessions per step = this / steps)", double(s.step_sessions));
  m("flashbox_step_seconds_total", "counter", "time in forward steps", s.step_s);
  o << "# HELP flashbox_queue_wait_seconds time from submission to admission\n# TYPE flashbox_queue_wait_seconds summary\n"
    << "flashbox_queue_wait_seconds_sum " << s.queue_wait_s << "\nflashbox_queue_wait_seconds_count " << s.queue_waits << "\n";
  o << "# HELP flashbox_time_to_first_token_seconds time from submission to the first generated token\n"
    << "# TYPE flashbox_time_to_first_token_seconds summary\n"
    << "flashbox_time_to_first_token_seconds_sum " << s.ttft_s << "\nflashbox_time_to_first_token_seconds_count " << s.ttfts << "\n";
  o << "# HELP flashbox_request_tokens_per_second decode rate of finished requests (tokens after the first over the time since it)\n"
    << "# TYPE flashbox_request_tokens_per_second summary\n"
    << "flashbox_request_tokens_per_second_sum " << s.session_tok_s << "\nflashbox_request_tokens_per_second_count " << s.session_rates << "\n";
  o << "# HELP flashbox_session_tokens_per_second decode rate of each active request so far\n# TYPE flashbox_session_tokens_per_second gauge\n";
  for (const auto& r : s.active_rates)
    if (r.decoding()) o << "flashbox_session_tokens_per_second{request=\"" << r.id << "\"} " << r.tok_s << "\n";
  o << "# HELP flashbox_dspark_accepted_rounds rounds by number of accepted drafts\n# TYPE flashbox_dspark_accepted_rounds counter\n";
  for (size_t i = 0; i < s.dspark.accepted_hist.size(); ++i)
    o << "flashbox_dspark_accepted_rounds{accepted=\"" << i << "\"} " << s.dspark.accepted_hist[i] << "\n";
  return o.str();
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
  svr.Get("/metrics", [&eng](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(eng), "text/plain; version=0.0.4");
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
