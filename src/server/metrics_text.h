// /metrics: the engine's counters in the Prometheus text exposition format (version 0.0.4): one
// `# HELP` and one `# TYPE` line per family, then its samples. The same counters /v1/stats carries
// (stats_json.h), raw: no derived averages (Prometheus takes rates itself). Families a backend or
// configuration does not have (no expert tiers, no op times, no KV ledger) are left out, not zeroed.
// Pure: no HTTP, no engine thread.
#pragma once

#include <string>

#include "engine/engine.h"
#include "server/stats_json.h"

namespace fb::server {

std::string metrics_text(const engine::EngineStats& s, const StatsSource& src);

}  // namespace fb::server
