#include "server/dashboard.h"

#include <httplib.h>

#include <chrono>

#include "server/dashboard_files.h"
#include "server/http_status.h"
#include "server/stats_json.h"

namespace fb::server {

void add_dashboard(httplib::Server& svr, const engine::Engine& eng, const ServerOptions& opt) {
  for (size_t i = 0; i < kDashboardFileCount; ++i) {
    const EmbeddedFile* f = &kDashboardFiles[i];
    svr.Get(f->url, [f](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char*>(f->data), f->size, f->content_type);
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  svr.Get("/v1/stats", [&eng, &opt, t0](const httplib::Request& req, httplib::Response& res) {
    if (!api_key_ok(opt.api_key, req.get_header_value("Authorization"), req.get_header_value("x-api-key"))) {
      res.status = 401;
      res.set_content(error_body(Api::kOpenAi, http_error_for_http(401), "invalid or missing API key"), "application/json");
      return;
    }
    StatsSource src;
    src.backend = eng.backend_name();
    src.model = opt.model_name;
    src.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    src.has_dspark = eng.config().dspark_block_size > 0;
    res.set_header("Cache-Control", "no-cache");
    res.set_content(stats_json(eng.stats(), src).dump(), "application/json");
  });
}

}  // namespace fb::server
