// Executor: the backend interface the engine, check-fixture and benchmarks drive. The CPU
// reference and the CUDA executor implement it; callers never know which one runs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/step.h"

namespace fb::model {

// A session's caches, owned by the executor that made it (host or device memory).
class SessionState {
 public:
  virtual ~SessionState() = default;
  virtual int64_t n_pos() const = 0;
  // Forget positions >= p (DSpark rejections, edited conversations); see implementations for
  // how far back this can go.
  virtual Status rollback(int64_t p) = 0;
};

// Named taps: where two paths part. after_block is the contract used by check-fixture; `named`
// holds finer stages ("L3.attn_norm", "L3.q", "L3.sel", ...) as f32 when `detailed` is set.
struct Taps {
  bool enabled = false;
  bool detailed = false;
  std::vector<std::vector<uint16_t>> after_block;  // [layer] bf16 [rows, hc, dim]
  std::map<std::string, std::vector<float>> named;
  // Debugging: replace block l's input (bf16 X [rows, hc, dim] and f32 pre [rows, hc]) before it
  // runs, to measure one layer's error in isolation from the layers before it.
  std::map<int, std::vector<float>> inject_x, inject_pre;
};

struct DraftOutput {
  std::vector<int32_t> ids;       // [anchor, d1..dB]
  std::vector<float> logits;      // f32 [B, vocab], Markov-corrected
  std::vector<float> confidence;  // f32 [B], raw confidence logits
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const Config& config() const = 0;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<SessionState> new_session() const = 0;
  // Runs the backbone over the rows; sessions[i] serves rows with session == i.
  virtual Result<StepOutput> forward(const Step& step, const std::vector<SessionState*>& sessions, Taps* taps = nullptr) = 0;
  // DSpark: write committed positions' tap rows (bf16 [n, n_taps*dim]) into the draft rings.
  virtual Status draft_commit(SessionState& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) = 0;
  // forward_spec(anchor, g(p), p): ring write of p, then one draft block.
  virtual Result<DraftOutput> draft(SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) = 0;
};

}  // namespace fb::model
