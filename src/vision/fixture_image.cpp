#include "vision/fixture_image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/dtype.h"
#include "base/mapped_file.h"
#include "loader/bind.h"
#include "loader/snapshot.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::vision {

namespace fs = std::filesystem;

namespace {

template <typename T>
Result<std::vector<T>> load_raw(const fs::path& p) {
  std::string b = FB_TRY(read_file_bytes(p.string()));
  if (b.size() % sizeof(T)) return FB_ERROR(kCorrupt) << p.string() << ": size " << b.size() << " is not a multiple of " << sizeof(T);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

struct Cmp {
  double max_rel = 0, exact_frac = 1;
  double nmse = 0, row_rel = 0;  // the vision gate's figures (CLARIFICATIONS "Fixture gates")
};
// got vs want, rows of `width` values: max |d| over max |want|, the share of identical values,
// NMSE = sum d^2 / sum want^2 and the worst row's max |d| over the tensor's RMS.
Cmp compare(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int64_t width) {
  double md = 0, mw = 0, se = 0, sw = 0;
  int64_t same = 0;
  const int64_t n = int64_t(want.size()), rows = width > 0 ? n / width : 0;
  std::vector<double> row_max(size_t(std::max<int64_t>(rows, 1)), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float g = bf16_to_f32(got[size_t(i)]), w = bf16_to_f32(want[size_t(i)]);
    const double d = std::isnan(g) != std::isnan(w) ? INFINITY : std::isnan(w) ? 0.0 : std::fabs(double(g) - double(w));
    md = std::max(md, d);
    mw = std::max(mw, std::fabs(double(w)));
    se += d * d;
    sw += double(w) * double(w);
    same += got[size_t(i)] == want[size_t(i)];
    if (rows > 0) row_max[size_t(std::min(rows - 1, i / width))] = std::max(row_max[size_t(std::min(rows - 1, i / width))], d);
  }
  Cmp c;
  c.max_rel = mw > 0 ? md / mw : md;
  c.exact_frac = want.empty() ? 1.0 : double(same) / double(want.size());
  c.nmse = sw > 0 ? se / sw : (se > 0 ? INFINITY : 0.0);
  const double rms = n > 0 ? std::sqrt(sw / double(n)) : 0.0;
  for (double r : row_max) c.row_rel = std::max(c.row_rel, rms > 0 ? r / rms : (r > 0 ? INFINITY : 0.0));
  return c;
}

}  // namespace

bool ImageFixtureResult::ok() const {
  return patches_exact && vit_nmse <= kVisionNmse && aligned_nmse <= kVisionNmse && vit_row_rel <= kVisionRowRel &&
         aligned_row_rel <= kVisionRowRel;
}

std::string ImageFixtureResult::line() const {
  std::ostringstream o;
  o << "vision " << (ok() ? "OK" : "FAIL") << ": patches=" << (patches_exact ? "bit-exact" : "DIFFER") << "(" << patch_mismatches << "/"
    << patch_values << " differ" << (patches_from_fixture ? ", no decoder: fixture patches" : "") << ") vit nmse=" << vit_nmse << " row_rel=" << vit_row_rel << " max_rel=" << vit_max_rel << " bitwise=" << vit_exact_frac << " aligned nmse=" << aligned_nmse << " row_rel=" << aligned_row_rel << " max_rel=" << aligned_max_rel
    << " bitwise=" << aligned_exact_frac << " aligned(from ref vit) max_rel=" << aligned_isolated_max_rel;
  return o.str();
}

// Width and height from a PNG's IHDR (no decoder needed).
Result<std::pair<int, int>> png_size(const std::string& b) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() < 24 || std::memcmp(b.data(), sig, 8) != 0 || b.compare(12, 4, "IHDR") != 0)
    return FB_ERROR(kUnsupported) << "not a PNG (no decoder in this build)";
  auto be32 = [&](size_t o) {
    return int((uint32_t(uint8_t(b[o])) << 24) | (uint32_t(uint8_t(b[o + 1])) << 16) | (uint32_t(uint8_t(b[o + 2])) << 8) | uint32_t(uint8_t(b[o + 3])));
  };
  return std::make_pair(be32(16), be32(20));
}

Result<ImageFixtureResult> check_image_fixture(const std::string& dir_s, int64_t prompt_len, const ImageEncoder& encode) {
  const fs::path dir(dir_s);
  ImageFixtureResult res;
  res.types = FB_TRY(load_raw<int32_t>(dir / "token_types.i32"));
  if (int64_t(res.types.size()) != prompt_len)
    return FB_ERROR(kCorrupt) << "token_types.i32 has " << res.types.size() << " entries, prompt has " << prompt_len;
  auto snap = FB_TRY(loader::Snapshot::open((dir / "checkpoint").string()));
  const model::Config& cfg = snap->config();
  if (!cfg.has_vision()) return FB_ERROR(kUnsupported) << dir_s << ": the prompt has an image span but the checkpoint has no vision tower";
  const model::ModelWeights w = loader::bind_weights(*snap);
  const VisionTower tower(cfg, w.vision);

  // Image files in span order: steps.json "image" (one object) or a list of them.
  std::string steps_text = FB_TRY(read_file_bytes((dir / "steps.json").string()));
  nlohmann::json steps = nlohmann::json::parse(steps_text, nullptr, false);
  std::vector<nlohmann::json> images;
  if (steps.is_object() && steps.contains("image")) {
    if (steps["image"].is_array())
      for (auto& x : steps["image"]) images.push_back(x);
    else
      images.push_back(steps["image"]);
  }
  auto file_of = [&](size_t i, const char* key, const char* def) -> std::string {
    if (i < images.size() && images[i].is_object() && images[i].contains(key) && images[i][key].is_string()) {
      std::string s = images[i][key];
      return s.substr(0, s.find(' '));  // "patches.bf16 bfloat16 [...]" -> "patches.bf16"
    }
    return def;
  };

  res.embed_row.assign(size_t(prompt_len), -1);
  size_t n_img = 0;
  for (int64_t p = 0; p < prompt_len;) {
    if (res.types[size_t(p)] < 0) {
      ++p;
      continue;
    }
    if (res.types[size_t(p)] != kStart) return FB_ERROR(kCorrupt) << "token_types: span at position " << p << " does not open with START";
    const size_t i = n_img++;
    std::string img_file = file_of(i, "file", "image.png");
    if (i > 0 && img_file == "image.png") img_file = "image" + std::to_string(i) + ".png";
    std::string bytes = FB_TRY(read_file_bytes((dir / img_file).string()));
    auto decoded = decode_image(bytes);
    PreparedImage pre;
    RgbImage img;
    bool from_fixture = false;
    if (decoded.ok()) {
      img = std::move(decoded.value());
      pre = FB_TRY(preprocess(img, cfg.vision));
    } else if (decoded.status().code() == StatusCode::kUnsupported) {
      // No decoder in this build: plan from the PNG header, patches from the fixture file.
      const auto wh = FB_TRY(png_size(bytes));
      img.width = wh.first;
      img.height = wh.second;
      pre.plan = FB_TRY(plan_image(wh.first, wh.second, cfg.vision));
      const std::string pf = file_of(i, "patches", i == 0 ? "patches.bf16" : "");
      if (pf.empty() || !fs::exists(dir / pf)) return decoded.status();
      pre.patches = FB_TRY(load_raw<uint16_t>(dir / pf));
      from_fixture = true;
      res.patches_from_fixture = true;
    } else {
      return decoded.status();
    }
    const ImagePlan& pl = pre.plan;
    const std::vector<int32_t> want_types = span_types(pl.nlh, pl.nlw);
    if (p + int64_t(want_types.size()) > prompt_len ||
        !std::equal(want_types.begin(), want_types.end(), res.types.begin() + p))
      return FB_ERROR(kCorrupt) << "token_types at " << p << " do not hold the span of a " << pl.nlh << "x" << pl.nlw << " token grid ("
                                << img_file << " " << img.width << "x" << img.height << ")";
    // Stage 1: patches, bit for bit.
    const std::string patches_file = file_of(i, "patches", i == 0 ? "patches.bf16" : "");
    if (!from_fixture && !patches_file.empty() && fs::exists(dir / patches_file)) {
      auto want = FB_TRY(load_raw<uint16_t>(dir / patches_file));
      if (want.size() != pre.patches.size()) return FB_ERROR(kCorrupt) << patches_file << " has " << want.size() << " values, want " << pre.patches.size();
      for (size_t k = 0; k < want.size(); ++k) res.patch_mismatches += want[k] != pre.patches[k];
      res.patch_values += int64_t(want.size());
    }
    // Stage 2: ViT on our patches. Stage 3: aligner on our ViT output (what the prefill uses)
    // and, to isolate it, on the reference's ViT output.
    std::vector<uint16_t> vit, aligned;
    if (encode) {
      aligned = FB_TRY(encode(pre.patches, pl.nvh, pl.nvw, &vit));
    } else {
      vit = tower.vit(pre.patches, pl.nvh, pl.nvw);
      aligned = tower.align(vit, pl.nvh, pl.nvw);
    }
    const std::string vit_file = file_of(i, "vit_hidden", i == 0 ? "vit_hidden.bf16" : "");
    if (!vit_file.empty() && fs::exists(dir / vit_file)) {
      auto want = FB_TRY(load_raw<uint16_t>(dir / vit_file));
      if (want.size() != vit.size()) return FB_ERROR(kCorrupt) << vit_file << " has " << want.size() << " values, want " << vit.size();
      const Cmp c = compare(vit, want, cfg.vision.dim);
      res.vit_max_rel = std::max(res.vit_max_rel, c.max_rel);
      res.vit_nmse = std::max(res.vit_nmse, c.nmse);
      res.vit_row_rel = std::max(res.vit_row_rel, c.row_rel);
      res.vit_exact_frac = std::min(res.vit_exact_frac, c.exact_frac);
      const Cmp ci = compare(tower.align(want, pl.nvh, pl.nvw), FB_TRY(load_raw<uint16_t>(dir / file_of(i, "aligned", "aligned.bf16"))), cfg.dim);
      res.aligned_isolated_max_rel = std::max(res.aligned_isolated_max_rel, ci.max_rel);
    }
    const std::string al_file = file_of(i, "aligned", i == 0 ? "aligned.bf16" : "");
    if (!al_file.empty() && fs::exists(dir / al_file)) {
      auto want = FB_TRY(load_raw<uint16_t>(dir / al_file));
      if (want.size() != aligned.size()) return FB_ERROR(kCorrupt) << al_file << " has " << want.size() << " values, want " << aligned.size();
      const Cmp c = compare(aligned, want, cfg.dim);
      res.aligned_max_rel = std::max(res.aligned_max_rel, c.max_rel);
      res.aligned_nmse = std::max(res.aligned_nmse, c.nmse);
      res.aligned_row_rel = std::max(res.aligned_row_rel, c.row_rel);
      res.aligned_exact_frac = std::min(res.aligned_exact_frac, c.exact_frac);
    }
    const auto emb = span_embeddings(want_types, aligned, w.vision, cfg.dim);
    const int32_t first = int32_t(res.embeddings.size() / size_t(cfg.dim));
    res.embeddings.insert(res.embeddings.end(), emb.begin(), emb.end());
    for (size_t k = 0; k < want_types.size(); ++k) res.embed_row[size_t(p) + k] = first + int32_t(k);
    p += int64_t(want_types.size());
  }
  res.patches_exact = res.patch_mismatches == 0;
  return res;
}

}  // namespace fb::vision
