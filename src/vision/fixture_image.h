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
  bool patches_from_fixture = false;  // no decoder in this build: patches.bf16 fed the tower
  bool ok() const;   // the gate: patches bit-exact, ViT and aligner within kVisionTolerance
  std::string line() const;
};

// Relative tolerance of the ViT and aligner outputs (max |d| over max |want|): a few bf16 ulps
// for summation-order differences against torch's CPU kernels (docs/vision.md).
constexpr double kVisionTolerance = 0.02;

// The tower that produces the span rows (model::Executor::encode_image): patches bf16 of one
// image -> aligner rows, ViT output into *vit. Empty: the CPU tower (vision::VisionTower).
using ImageEncoder = std::function<Result<std::vector<uint16_t>>(const std::vector<uint16_t>& patches, int nvh, int nvw,
                                                                 std::vector<uint16_t>* vit)>;

// `dir` is a fixture folder with token_types.i32 and the image(s) named in steps.json. When this
// build has no decoder for the image (the device image lacks the -dev packages), the grid comes
// from the PNG header and the fixture's patches file feeds the tower (patches_from_fixture).
Result<ImageFixtureResult> check_image_fixture(const std::string& dir, int64_t prompt_len, const ImageEncoder& encode = {});

}  // namespace fb::vision
