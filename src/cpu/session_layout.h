// Moved to model/session_layout.h (the session-state format both executors share).
// bench/kv_restore_bench.cpp still names these as cpu::; remove this header once it includes
// model/session_layout.h.
#pragma once

#include "model/session_layout.h"

namespace fb::cpu {

using model::parse_session_layout;
using model::session_layout;

}  // namespace fb::cpu
