// PrefillPolicy: how many prompt rows the engine puts into a step that also carries other
// sessions' decode rows (issue 20). [policy] Those sessions' next tokens wait for the whole step,
// so the chunk is sized from measured step times: a step with a prompt chunk should take at most
// `step_factor` times a step of the same decode rows alone. The policy keeps
//   D: the time of a decode-only step (moving average of the ones it saw), and
//   c: the time one prompt row adds to a step ((T - D) / rows of a mixed step: a dearer sample at
//      once, a cheaper one averaged in),
// and asks for (step_factor - 1) * D / c rows, at least min_rows (prompts always progress), at
// most the prefill chunk, and at most 1.5x the previous mixed chunk (the estimate of c comes from
// smaller chunks, and a GPU step costs little more until its rows stop being free). While D is
// unknown, or no decode-only step has been seen for refresh_rounds mixed steps (sessions came and
// went, contexts grew), it answers 0: run this step without prompt rows and measure D again.
// Chunk sizes never change outputs (the executors are row-invariant; engine_batch_test), only
// when a prompt's rows run. The engine thread owns it; no locking.
#pragma once

#include <cstdint>

namespace fb::engine {

struct PrefillPolicyOptions {
  int64_t chunk = 256;        // rows of a prefill step without decode rows (GeneratorOptions::prefill_chunk)
  int64_t fixed_rows = 0;     // > 0: every mixed step takes this many rows (no measuring)
  double step_factor = 2.0;   // [policy] bound on (mixed step time) / (decode-only step time)
  int64_t min_rows = 4;       // [policy] floor of a mixed chunk
  int refresh_rounds = 16;    // [policy] mixed steps between two decode-only reference steps
};

class PrefillPolicy {
 public:
  explicit PrefillPolicy(PrefillPolicyOptions o);

  // Prompt rows for the next step. decoding: the step will carry decode rows of other sessions.
  // Without them: the whole chunk. With them: the bounded chunk, or 0 for a reference step.
  int64_t rows(bool decoding);
  // After every step: its decode rows, prompt rows and forward time.
  void observe(int64_t decode_rows, int64_t prefill_rows, double step_s);

  // What it currently believes (stats, tests): D, c (0 while unknown) and the last mixed chunk.
  double decode_step_s() const { return d_; }
  double row_s() const { return c_; }
  int64_t last_mixed_rows() const { return last_; }
  int64_t reference_steps() const { return refs_; }  // decode-only steps it asked for (rows() == 0)

 private:
  PrefillPolicyOptions o_;
  double d_ = 0;          // decode-only step time (0: none seen)
  double c_ = 0;          // time per prompt row in a mixed step (0: none seen)
  int64_t last_ = 0;      // the last mixed chunk asked for
  int since_ref_ = 0;     // mixed steps since the last decode-only one
  int64_t refs_ = 0;
};

}  // namespace fb::engine
