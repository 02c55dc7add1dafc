// Test helper of the server's unit tests: engine counters that both views of them (the /v1/stats
// JSON, dashboard_test; the Prometheus text, metrics_test) are checked against.
#pragma once

#include "engine/engine.h"

namespace fb::server {

// Issue 20's counters: shared draft calls, packed prompts, the prefill policy's rows and six
// inter-token gaps (7.5 s in all, the longest 7 s); the policy's decode step is not measured yet.
inline engine::EngineStats sessions_and_gaps_stats() {
  engine::EngineStats s;
  s.draft_calls = 4;
  s.draft_blocks = 11;
  s.packed_prompt_steps = 5;
  s.mixed_prefill_rows = 23;
  s.gap_hist = {3, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1};  // three <= 5 ms, two in (25, 50] ms, one above 5 s
  s.gaps = 6;
  s.gap_s = 7.5;
  s.gap_max_s = 7.0;
  s.reference_steps = 2;
  return s;
}

}  // namespace fb::server
