// check-fixture: runs the official-reference fixture protocol (ORACLE.md, CLARIFICATIONS.md)
// against any Executor and reports logits, ids, taps and draft agreement. Teacher-forced: decode
// step k feeds the fixture's greedy_ids[k-1] whatever our argmax was.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/executor.h"

namespace fb::engine {

struct FixtureCheckOptions {
  int64_t chunk = 0;          // prefill chunk rows (0 = whole prompt in one step)
  bool bounded_replay = false;  // [approx-approved] prefill with SWA bounded replay (spec/11 §8.4)
  bool verbose = false;
  std::string dump_dir;        // write detailed prefill taps here as <name>.f32 (debugging)
  // When set, a second executor (e.g. the CPU reference) runs the same teacher-forced protocol in
  // lockstep and the report compares the two directly (CUDA vs CPU parity, docs/numerics.md).
  std::function<Result<std::unique_ptr<model::Executor>>(const std::string&)> make_reference;
};

// Direct comparison of the checked executor against a reference executor (--compare-cpu).
struct ReferenceComparison {
  bool ran = false;
  std::string name;                  // reference executor's name
  int rows = 0, ids_same = 0;        // logits rows compared, argmax identical
  int rows_bitwise = 0;              // rows whose f32 logits are bit-identical
  double max_dlogit = 0;             // max |logit - reference logit|, NaN mismatch = inf
  int tap_layers = 0, tap_layers_bitwise = 0;
  double tap_max = 0;                // max |d| over after-block taps (bf16 values)
  int draft_rows = 0, draft_rows_bitwise = 0, draft_ids_same = 0, draft_ids_total = 0;
  double draft_max_dlogit = 0, draft_max_dconf = 0;
  int vision_images = 0, vision_bitwise = 0;  // images whose ViT and aligner outputs are bit-identical
  bool identical() const {
    return rows_bitwise == rows && tap_layers_bitwise == tap_layers && draft_rows_bitwise == draft_rows && draft_ids_same == draft_ids_total &&
           vision_bitwise == vision_images;
  }
  std::string line() const;
};

// The layer gate (CLARIFICATIONS "Fixture gates"): every backbone block run on the reference's
// own block input (inject/), its Engram output (Engram layers, when inject/ has engram_in),
// attention output, MoE output and block output compared row by row with the reference's.
struct LayerGateReport {
  bool ran = false;
  bool pass = false;
  int blocks = 0, tensors = 0;
  double worst_nmse = 0;     // over every block and tensor (passing rows)
  double worst_row = 0;      // worst passing row's max |d| / the tensor's RMS
  int tie_rows = 0;          // (block, row) pairs over the tolerance at a near-tie of our selections
  float max_tie_margin = 0;  // the largest margin among them (<= model::kNearTieMargin)
  int bad_rows = 0;          // (block, row) pairs over the tolerance without a near-tie: FAIL
  std::string first_bad;     // e.g. "L3.attn_out row 17 (0.41 x rms, margin 0.2)"
  std::string figures() const;
};

struct FixtureReport {
  std::string case_name;
  bool pass = false;
  bool smooth = false;             // steps.json "smooth": the end-to-end gate applies
  bool e2e_pass = false;           // the end-to-end gate's verdict (reported for chaotic cases too)
  LayerGateReport layer;
  std::string vision = "absent";   // the vision gate: "OK(...)", "FAIL(...)" or "absent"
  double draft_max_dlogit = 0, draft_mean_dlogit = 0, draft_max_dconf = 0, draft_mean_dconf = 0;
  int draft_rows = 0;
  int ids_match = 0, ids_total = 0;
  int ids_near_tie = 0;            // mismatches explained by a near-tie margin
  int first_divergence = -1;       // logits row of the first unexplained id mismatch
  double max_dlogit = 0, mean_dlogit = 0, max_rel = 0;
  std::string taps;                // "OK", "max_rel=..", "absent"
  std::string drafts;              // "OK", "...", "absent"
  ReferenceComparison reference;   // filled when FixtureCheckOptions::make_reference is set
  std::string summary_line() const;
};

// Loads the fixture folder (prompt, steps.json, logits, taps, drafts, inject/) and runs `ex` over
// it: the teacher-forced protocol (end-to-end figures; gated on smooth fixtures), then the layer
// gate on a fresh session when inject/ is present, and the vision gate on image fixtures.
// `make_executor` is called with DIR/checkpoint. kUnsupported/kNotFound mean "could not run"
// (a text fixture without inject/, or a file a gate needs, is kNotFound naming it).
// End-to-end gate of smooth fixtures (CLARIFICATIONS): logits and draft bounds.
constexpr double kE2eMaxDlogit = 0.25, kE2eMeanDlogit = 0.05, kDraftMax = 0.6, kDraftMean = 0.1;
// Layer gate: a row passes when its max |d| <= 20% of the tensor's RMS; NMSE over passing rows.
constexpr double kLayerRowRel = 0.2, kLayerNmse = 1e-4;
Result<FixtureReport> check_fixture(const std::string& dir,
                                    const std::function<Result<std::unique_ptr<model::Executor>>(const std::string&)>& make_executor,
                                    const FixtureCheckOptions& opt);

}  // namespace fb::engine
