// The image half of check-fixture (ORACLE.md tiny-vision): decode the fixture's image, run our
// preprocessing, ViT and aligner, compare each stage with patches.bf16 / vit_hidden.bf16 /
// aligned.bf16, and hand back the span rows for the prefill. Works for any vision config and
// image size: shapes come from the checkpoint's config and our own plan, checked against the
// fixture's token_types.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace fb::vision {

struct ImageFixtureResult {
  std::vector<int32_t> types;        // [prompt_len]: -1 text, 0..3 span roles
  std::vector<int32_t> embed_row;    // [prompt_len]: row of `embeddings` for span positions, -1 text
  std::vector<uint16_t> embeddings;  // bf16 [n span positions, dim] (our own chain, not the fixture files)
  bool patches_exact = true;
  int64_t patch_mismatches = 0, patch_values = 0;
  double vit_max_rel = 0, aligned_max_rel = 0, aligned_isolated_max_rel = 0;  // max|d| / max|want|
  double vit_exact_frac = 1, aligned_exact_frac = 1;
  double vit_nmse = 0, aligned_nmse = 0;        // sum d^2 / sum want^2
  double vit_row_rel = 0, aligned_row_rel = 0;  // worst row's max |d| over the tensor's RMS
  bool patches_from_fixture = false;  // no decoder in this build: patches.bf16 fed the tower
  bool ok() const;   // the vision gate: patches bit-exact, ViT and aligner NMSE and rows within bounds
  std::string line() const;
};

// The vision gate (CLARIFICATIONS "Fixture gates"): vit_hidden and aligned NMSE <= 1e-4 and every
// row's max |d| <= 5% of the tensor's RMS; preprocessing bit-identical. max |d| / max |want|
// (formerly gated at 0.02) is still reported.
constexpr double kVisionNmse = 1e-4;
constexpr double kVisionRowRel = 0.05;

// The tower that produces the span rows (model::Executor::encode_image): patches bf16 of one
// image -> aligner rows, ViT output into *vit. Empty: the CPU tower (vision::VisionTower).
using ImageEncoder = std::function<Result<std::vector<uint16_t>>(const std::vector<uint16_t>& patches, int nvh, int nvw,
                                                                 std::vector<uint16_t>* vit)>;

// `dir` is a fixture folder with token_types.i32 and the image(s) named in steps.json. When this
// build has no decoder for the image (the device image lacks the -dev packages), the grid comes
// from the PNG header and the fixture's patches file feeds the tower (patches_from_fixture).
Result<ImageFixtureResult> check_image_fixture(const std::string& dir, int64_t prompt_len, const ImageEncoder& encode = {});

}  // namespace fb::vision
