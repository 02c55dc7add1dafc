// A forward step is a batch of ROWS, not sequences (DESIGN-AHEAD item 1): prefill chunks,
// decode rows of several sessions and DSpark verify rows are all the same call. Rows of one
// session are contiguous, in increasing position, starting at that session's next position.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace fb::model {

// The key-list layout of spec/11 §4.10 is a property of the row kind, so one step can carry
// both and each row still matches the reference path it belongs to.
enum class RowKind : uint8_t {
  kPrefill,  // window keys by position, -1 padding at the END up to `prefill_end`'s width
  kDecode,   // ring order, -1 padding at the FRONT (decode and DSpark verify rows)
};

struct Row {
  int session = 0;         // index into the step's session list
  int64_t pos = 0;         // absolute position
  int32_t token = 0;       // token id (image rows carry image_token_id)
  RowKind kind = RowKind::kDecode;
  // Prefill rows: exclusive end position of the whole prompt being prefilled. It fixes the
  // window width min(prefill_end, window) and the indexer's scored slice prefill_end // ratio,
  // so any chunking of a prompt reproduces the one-shot reference exactly (spec/11 §8.2-8.3).
  int64_t prefill_end = 0;
  // Prefill rows, SWA bounded replay (spec/11 §8.4; an approximation, off when 0): a row at a
  // position below replay_start runs only the encoder (layers before Config::decoder_start) and
  // the decoder's compressor (collapse, attn_norm, compressed KV, index keys), then leaves the
  // step: no decoder window KV, no DSpark taps of decoder layers, no logits. Rows at or after it
  // run every layer, and their decoder window keys start at replay_start. Like prefill_end it
  // belongs to the whole prompt, so any chunking gives the same bits. 0 = exact prefill.
  int64_t replay_start = 0;
  bool want_logits = false;
  bool image = false;      // image-span position: routing uses bias_vl, Engram history is DEAD
  int32_t embed_row = -1;  // >= 0: input embedding comes from Step::embeddings (image rows)
};

// A prompt row at position p of a prompt that ends (exclusive) at `end`: prefill kind, the
// prompt's scored width, an optional bounded-replay start, logits for the last prompt row.
inline Row prefill_row(int64_t p, int32_t token, int64_t end, int64_t replay_start = 0) {
  Row r;
  r.pos = p;
  r.token = token;
  r.kind = RowKind::kPrefill;
  r.prefill_end = end;
  r.replay_start = replay_start;
  r.want_logits = p == end - 1;
  return r;
}

// A decode row at position p (the session's next position) with its logits.
inline Row decode_row(int64_t p, int32_t token) {
  Row r;
  r.pos = p;
  r.token = token;
  r.kind = RowKind::kDecode;
  r.want_logits = true;
  return r;
}

struct Step {
  std::vector<Row> rows;
  std::vector<uint16_t> embeddings;  // bf16 [n, dim] for rows with embed_row >= 0
  // [policy] The caller reads DSpark tap rows only from this row on: the executor returns the
  // rows from here (StepOutput::taps_first_row). A 2,048-row prefill step then neither copies nor
  // allocates ~60 MB of taps the draft never reads (it keeps the last window of them).
  int64_t taps_from_row = 0;
  // [policy] false: the caller reads only StepOutput::argmax (greedy rows that neither process,
  // constrain nor report their logits), so the executor may return no logits rows: a released-size
  // row is 517 KB the GPU would copy to the host and the host scan.
  bool logits_to_host = true;
};

// The greedy token of a logits row: the first index of its largest non-NaN value, 0 when every
// value is NaN (the sampler's greedy pick; executors compute it for StepOutput::argmax).
inline int32_t logits_argmax(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != x[i]) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return int32_t(best < 0 ? 0 : best);
}

// Outputs of a step for the rows that asked for them.
struct StepOutput {
  std::vector<int> logit_rows;   // row index of each logits row
  std::vector<float> logits;     // f32 [logit_rows.size(), vocab]; empty when !Step::logits_to_host
  std::vector<int32_t> argmax;   // per logits row: logits_argmax of it (always)
  std::vector<uint16_t> taps;    // bf16 [rows - taps_first_row, n_taps * dim]: DSpark tap rows
  int64_t taps_first_row = 0;    // = the step's taps_from_row (clamped to the row count)
};

// A row's checks against its step before any work, the same for every executor: it names one of
// the step's sessions (next.size() of them), sits at that session's next position (`next`, which
// the caller advances per row), has a token of the vocabulary, its embedding row if it names one,
// and a prefill row ends before its prefill_end. kInvalidArgument names the first failure.
Status check_row(const Config& c, const Step& st, const Row& r, const std::vector<int64_t>& next);
// The bounded-replay fields of a row with replay_start != 0 (spec/11 §8.4): a prefill row, a config
// with a decoder KV source to split at (kUnsupported), a prompt row left to replay, and no logits
// asked of a row that leaves at the encoder.
Status check_replay_row(const Config& c, const Row& r);

}  // namespace fb::model
