// /v1/stats: the engine's counters as one JSON document for the dashboard (the same counters
// /metrics prints, plus lifetime averages derived from them). Pure: no HTTP, no engine thread.
// Counters a backend or configuration does not have are JSON null (the page shows "n/a").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine.h"

namespace fb::server {

struct StatsSource {
  std::string backend;    // executor name ("cpu", "cuda")
  std::string model;      // served model name
  double uptime_s = 0;    // since the server started: the clock the page takes rates over
  bool has_dspark = false;  // the model has a DSpark head
};

nlohmann::json stats_json(const engine::EngineStats& s, const StatsSource& src);

}  // namespace fb::server
