#include "engine/fixture_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "engine/sampler.h"
#include "model/selection.h"
#include "vision/fixture_image.h"

namespace fb::engine {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

template <typename T>
Result<std::vector<T>> load_raw(const std::string& path) {
  std::string b = FB_TRY(read_file_bytes(path));
  if (b.size() % sizeof(T)) return FB_ERROR(kCorrupt) << path << ": size " << b.size() << " is not a multiple of " << sizeof(T);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Top-1 minus top-2 of a logits row.
double margin(const float* x, int64_t n) {
  double a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return a - b;
}

struct RowCompare {
  double max_abs = 0, sum_abs = 0, max_rel = 0;
  int64_t n = 0;
  void add(const float* got, const float* want, int64_t V) {
    double scale = 0;
    for (int64_t i = 0; i < V; ++i) scale = std::max(scale, std::fabs(double(want[i])));
    for (int64_t i = 0; i < V; ++i) {
      double d = std::fabs(double(got[i]) - double(want[i]));
      if (std::isnan(got[i]) != std::isnan(want[i])) d = INFINITY;
      max_abs = std::max(max_abs, d);
      sum_abs += d;
      max_rel = std::max(max_rel, scale > 0 ? d / scale : d);
    }
    n += V;
  }
};

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) m = INFINITY;
      continue;
    }
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  }
  return m;
}

// One tensor of one block against the reference: rows of `width` values; margin[row] is the
// row's selection margin for this tensor (model::selection_margin, +inf = nothing partial).
struct TensorGate {
  double nmse = 0, worst_row = 0;
  std::vector<int64_t> failed;  // rows over kLayerRowRel x RMS
};
// Rows at a near-tie of a selection they use (margin) are judged apart: they may exceed the row
// tolerance (counted, reported) and stay out of the NMSE and the worst passing row, since a
// flipped selection moves them by a discrete amount that says nothing about the arithmetic.
TensorGate gate_tensor(const float* got, const float* want, int64_t rows, int64_t width, const std::vector<float>& margin) {
  TensorGate g;
  double sw = 0;
  for (int64_t i = 0; i < rows * width; ++i) sw += double(want[i]) * double(want[i]);
  const double rms = rows * width > 0 ? std::sqrt(sw / double(rows * width)) : 0.0;
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double md = 0, se = 0, sa = 0;
    for (int64_t i = r * width; i < (r + 1) * width; ++i) {
      const double a = got[i], b = want[i];
      const double d = std::isnan(a) || std::isnan(b) ? (std::isnan(a) == std::isnan(b) ? 0.0 : INFINITY) : std::fabs(a - b);
      md = std::max(md, d);
      se += d * d;
      sa += std::isnan(b) ? 0.0 : b * b;
    }
    const double rel = rms > 0 ? md / rms : (md > 0 ? INFINITY : 0.0);
    const bool tie = !margin.empty() && model::near_tie(margin[size_t(r)]);
    if (tie) {
      if (rel > kLayerRowRel) g.failed.push_back(r);
    } else if (rel <= kLayerRowRel) {
      g.worst_row = std::max(g.worst_row, rel);
      num += se;
      den += sa;
    } else {
      g.failed.push_back(r);
    }
  }
  g.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
  return g;
}

std::string fmt_margin(float m) {
  std::ostringstream o;
  if (std::isinf(m)) o << "none";
  else o << m;
  return o.str();
}

}  // namespace

std::string LayerGateReport::figures() const {
  std::ostringstream o;
  o << (pass ? "PASS" : "FAIL") << "(blocks=" << blocks << " tensors=" << tensors << " worst_nmse=" << worst_nmse << " worst_row=" << worst_row
    << " tie_rows=" << tie_rows;
  if (tie_rows > 0) o << " max_tie_margin=" << max_tie_margin;
  if (bad_rows > 0) o << " bad_rows=" << bad_rows << " first_bad=" << first_bad;
  o << ")";
  return o.str();
}

namespace {

// The layer gate: a fresh session, the prompt prefilled (one shot or in the same chunks as the
// end-to-end pass) with every block's input replaced by the reference's, and each block's
// outputs compared with the reference's on every prompt row.
Result<LayerGateReport> layer_gate(const std::string& dir, model::Executor& ex, const std::vector<int32_t>& prompt,
                                   const std::vector<uint8_t>& image_rows, const FixtureCheckOptions& opt, const std::string& case_name) {
  const model::Config& c = ex.config();
  const int64_t N = int64_t(prompt.size()), D = c.dim, hc = c.hc_mult;
  const fs::path inj = fs::path(dir) / "inject";
  auto need = [&](const fs::path& p, int64_t n) -> Result<std::vector<float>> {
    if (!fs::exists(p)) return FB_ERROR(kNotFound) << "the layer gate needs " << p.string() << " (missing)";
    auto v = FB_TRY(load_raw<float>(p.string()));
    if (int64_t(v.size()) != n) return FB_ERROR(kCorrupt) << p.string() << " holds " << v.size() << " floats, want " << n;
    return v;
  };
  std::vector<std::vector<float>> x_in(size_t(c.n_layers)), pre_in(size_t(c.n_layers)), attn(size_t(c.n_layers)),
      ffn(size_t(c.n_layers)), eng_in(size_t(c.n_layers)), block_out(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string L = "L" + std::to_string(l);
    x_in[size_t(l)] = FB_TRY(need(inj / (L + ".x_in.f32"), N * hc * D));
    pre_in[size_t(l)] = FB_TRY(need(inj / (L + ".pre_in.f32"), N * hc));
    attn[size_t(l)] = FB_TRY(need(inj / (L + ".attn_out.f32"), N * D));
    ffn[size_t(l)] = FB_TRY(need(inj / (L + ".ffn_out.f32"), N * D));
    if (c.roles[size_t(l)].engram_table >= 0 && fs::exists(inj / (L + ".engram_in.f32")))
      eng_in[size_t(l)] = FB_TRY(need(inj / (L + ".engram_in.f32"), N * hc * D));
    char name[32];
    std::snprintf(name, sizeof name, "layer%02d.bf16", l);
    const fs::path tp = fs::path(dir) / "taps" / name;
    if (!fs::exists(tp)) return FB_ERROR(kNotFound) << "the layer gate needs " << tp.string() << " (block " << l << "'s output; missing)";
    auto t = FB_TRY(load_raw<uint16_t>(tp.string()));
    if (int64_t(t.size()) != N * hc * D) return FB_ERROR(kCorrupt) << tp.string() << " holds " << t.size() << " values, want " << N * hc * D;
    block_out[size_t(l)].resize(t.size());
    for (size_t i = 0; i < t.size(); ++i) block_out[size_t(l)][i] = bf16_to_f32(t[i]);
  }

  // The prefill with injection, chunk by chunk (each chunk injects its own rows).
  auto session = ex.new_session();
  std::vector<model::SessionState*> sess{session.get()};
  std::vector<model::Taps::BlockProbe> got(size_t(c.n_layers));
  std::vector<std::vector<float>> got_block(size_t(c.n_layers));
  const int64_t chunk = opt.chunk > 0 ? opt.chunk : N;
  auto slice = [](const std::vector<float>& v, int64_t r0, int64_t r1, int64_t w) {
    return std::vector<float>(v.begin() + r0 * w, v.begin() + r1 * w);
  };
  auto append = [](std::vector<float>& to, const std::vector<float>& v) { to.insert(to.end(), v.begin(), v.end()); };
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    const int64_t s1 = std::min(N, s0 + chunk);
    model::Step st;
    for (int64_t p = s0; p < s1; ++p) {
      model::Row r = model::prefill_row(p, prompt[size_t(p)], N);
      r.image = image_rows[size_t(p)] != 0;  // routing bias and Engram gate of span rows (inputs are injected)
      st.rows.push_back(r);
    }
    model::Taps taps;
    taps.enabled = true;
    taps.probe = true;
    for (int l = 0; l < c.n_layers; ++l) {
      taps.inject_x[l] = slice(x_in[size_t(l)], s0, s1, hc * D);
      taps.inject_pre[l] = slice(pre_in[size_t(l)], s0, s1, hc);
      if (!eng_in[size_t(l)].empty()) taps.inject_engram_in[l] = slice(eng_in[size_t(l)], s0, s1, hc * D);
    }
    FB_TRY(ex.forward(st, sess, &taps));
    for (int l = 0; l < c.n_layers; ++l) {
      auto it = taps.blocks.find(l);
      if (it == taps.blocks.end() || int64_t(it->second.attn_out.size()) != (s1 - s0) * D || int64_t(it->second.ffn_out.size()) != (s1 - s0) * D ||
          int64_t(it->second.attn_margin.size()) != s1 - s0 || int64_t(it->second.ffn_margin.size()) != s1 - s0)
        return FB_ERROR(kUnsupported) << "the " << ex.name() << " executor does not report block " << l << "'s sublayer outputs (Taps::probe)";
      if (!eng_in[size_t(l)].empty() && int64_t(it->second.engram_out.size()) != (s1 - s0) * hc * D)
        return FB_ERROR(kUnsupported) << "the " << ex.name() << " executor does not report block " << l << "'s Engram output (Taps::probe)";
      model::Taps::BlockProbe& g = got[size_t(l)];
      append(g.attn_out, it->second.attn_out);
      append(g.ffn_out, it->second.ffn_out);
      append(g.engram_out, it->second.engram_out);
      append(g.attn_margin, it->second.attn_margin);
      append(g.ffn_margin, it->second.ffn_margin);
      if (taps.after_block.size() <= size_t(l) || int64_t(taps.after_block[size_t(l)].size()) != (s1 - s0) * hc * D)
        return FB_ERROR(kUnsupported) << "the " << ex.name() << " executor returned no block output taps";
      for (uint16_t v : taps.after_block[size_t(l)]) got_block[size_t(l)].push_back(bf16_to_f32(v));
    }
  }

  LayerGateReport rep;
  rep.ran = true;
  rep.blocks = c.n_layers;
  std::map<std::pair<int, int64_t>, int> tie_pairs, bad_pairs;
  auto judge = [&](int l, const char* what, const std::vector<float>& a, const std::vector<float>& b, int64_t width,
                   const std::vector<float>& margin) {
    ++rep.tensors;
    const TensorGate g = gate_tensor(a.data(), b.data(), N, width, margin);
    rep.worst_nmse = std::max(rep.worst_nmse, g.nmse);
    rep.worst_row = std::max(rep.worst_row, g.worst_row);
    if (!(g.nmse <= kLayerNmse)) {
      ++bad_pairs[{l, -1}];
      if (rep.first_bad.empty()) {
        std::ostringstream o;
        o << "L" << l << "." << what << "(nmse=" << g.nmse << ")";
        rep.first_bad = o.str();
      }
    }
    for (int64_t r : g.failed) {
      const float m = margin.empty() ? INFINITY : margin[size_t(r)];
      if (model::near_tie(m)) {
        tie_pairs[{l, r}] = 1;
        rep.max_tie_margin = std::max(rep.max_tie_margin, m);
        FB_LOG(kInfo) << case_name << ": layer gate L" << l << "." << what << " row " << r << " over the tolerance at a near-tie (margin "
                      << m << ")";
      } else {
        bad_pairs[{l, r}] = 1;
        double md = 0, sw = 0;
        for (int64_t i = 0; i < N * width; ++i) sw += double(b[size_t(i)]) * double(b[size_t(i)]);
        for (int64_t i = r * width; i < (r + 1) * width; ++i) md = std::max(md, double(std::fabs(a[size_t(i)] - b[size_t(i)])));
        std::ostringstream o;
        o << "L" << l << "." << what << ":row" << r << "(" << md / std::sqrt(sw / double(N * width)) << "xrms,margin=" << fmt_margin(m) << ")";
        if (rep.first_bad.empty()) rep.first_bad = o.str();
        FB_LOG(kWarn) << case_name << ": layer gate " << o.str();
      }
    }
    if (opt.verbose)
      FB_LOG(kInfo) << case_name << ": layer gate L" << l << "." << what << " nmse " << g.nmse << " worst passing row " << g.worst_row
                    << " x rms, rows over " << g.failed.size();
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& g = got[size_t(l)];
    if (!eng_in[size_t(l)].empty()) judge(l, "engram_out", g.engram_out, x_in[size_t(l)], hc * D, {});
    judge(l, "attn_out", g.attn_out, attn[size_t(l)], D, g.attn_margin);
    judge(l, "ffn_out", g.ffn_out, ffn[size_t(l)], D, g.ffn_margin);
    judge(l, "block_out", got_block[size_t(l)], block_out[size_t(l)], hc * D, g.ffn_margin);
  }
  rep.tie_rows = int(tie_pairs.size());
  rep.bad_rows = int(bad_pairs.size());
  rep.pass = rep.bad_rows == 0;
  return rep;
}

}  // namespace

std::string ReferenceComparison::line() const {
  std::ostringstream o;
  o << "compare " << name << ": " << (identical() ? "IDENTICAL" : "DIFFERENT") << " ids=" << ids_same << "/" << rows
    << " bitwise_rows=" << rows_bitwise << "/" << rows << " max_dlogit=" << max_dlogit << " taps_bitwise=" << tap_layers_bitwise << "/"
    << tap_layers << " tap_max=" << tap_max << " draft_rows_bitwise=" << draft_rows_bitwise << "/" << draft_rows
    << " draft_ids=" << draft_ids_same << "/" << draft_ids_total << " draft_max_dlogit=" << draft_max_dlogit
    << " draft_max_dconf=" << draft_max_dconf;
  if (vision_images > 0) o << " vision_bitwise=" << vision_bitwise << "/" << vision_images;
  return o.str();
}

std::string FixtureReport::summary_line() const {
  std::ostringstream o;
  o << "check-fixture " << case_name << ": " << (pass ? "PASS" : "FAIL") << " ids=" << ids_match << "/" << ids_total
    << " max_dlogit=" << max_dlogit << " mean_dlogit=" << mean_dlogit << " taps=" << taps << " drafts=" << drafts;
  // The gates' figures (CLARIFICATIONS "Fixture gates"): end to end (gated on smooth fixtures,
  // reported on chaotic ones), layer by layer, vision.
  o << " e2e=" << (smooth ? (e2e_pass ? "PASS" : "FAIL") : "report") << "(near_ties=" << ids_near_tie << ")";
  o << " layer=" << (layer.ran ? layer.figures() : std::string("absent"));
  o << " vision=" << vision;
  return o.str();
}

Result<FixtureReport> check_fixture(const std::string& dir,
                                    const std::function<Result<std::unique_ptr<model::Executor>>(const std::string&)>& make_executor,
                                    const FixtureCheckOptions& opt) {
  FixtureReport rep;
  rep.case_name = fs::path(dir).filename().string();
  if (rep.case_name.empty()) rep.case_name = fs::path(dir).parent_path().filename().string();
  if (!fs::exists(fs::path(dir) / "steps.json") && fs::exists(fs::path(dir) / "manifest.json"))
    return FB_ERROR(kUnsupported) << dir << " holds op vectors (manifest.json), not a model fixture: the unit tests cpu_ops_test and "
                                         "cuda_ops_test check them";
  std::string steps_text = FB_TRY(read_file_bytes((fs::path(dir) / "steps.json").string()));
  json steps = json::parse(steps_text, nullptr, false);
  if (steps.is_discarded() || !steps.is_object()) return FB_ERROR(kCorrupt) << dir << "/steps.json is not a JSON object";
  auto prompt = FB_TRY(load_raw<int32_t>((fs::path(dir) / "prompt.i32").string()));
  auto logits = FB_TRY(load_raw<float>((fs::path(dir) / "logits.f32").string()));
  if (!steps.contains("greedy_ids") || !steps["greedy_ids"].is_array()) return FB_ERROR(kCorrupt) << "steps.json: no greedy_ids";
  std::vector<int32_t> greedy;
  for (auto& g : steps["greedy_ids"]) greedy.push_back(g.get<int32_t>());
  const int64_t n_steps = int64_t(greedy.size()) - 1;
  if (prompt.empty()) return FB_ERROR(kCorrupt) << "empty prompt";
  // Image fixtures: our preprocessing, ViT and aligner against the fixture's stage files; the span
  // rows then enter the prefill as rows with embeddings (spec/14 §6), decode steps are text.
  std::optional<vision::ImageFixtureResult> image;
  const bool has_image = fs::exists(fs::path(dir) / "token_types.i32");
  rep.smooth = steps.contains("smooth") && steps["smooth"].is_boolean() && steps["smooth"].get<bool>();
  // Every text fixture is judged by the layer gate (image fixtures by the vision gate until they
  // carry inject/ too): a folder without it cannot be judged, so it is reported, never skipped.
  const bool has_inject = fs::is_directory(fs::path(dir) / "inject");
  if (!has_inject && !has_image)
    return FB_ERROR(kNotFound) << (fs::path(dir) / "inject").string() << " is missing: the layer gate needs the per-layer block inputs and outputs";

  auto ex_or = make_executor((fs::path(dir) / "checkpoint").string());
  if (!ex_or.ok()) return ex_or.status();
  std::unique_ptr<model::Executor> ex = std::move(ex_or.value());
  const model::Config& c = ex->config();
  const int64_t V = c.vocab_size, N = int64_t(prompt.size());
  // Bounded replay: decoder layers over the last window only. The fixtures are exact-mode
  // references, so this reports how far the approximation moves them (it is not expected to pass).
  int64_t replay = 0;
  if (opt.bounded_replay) {
    if (!ex->supports_bounded_replay()) return FB_ERROR(kUnsupported) << "--bounded-replay: the " << ex->name() << " executor does not run it";
    replay = std::max<int64_t>(0, N - c.window_size);
    FB_LOG(kInfo) << "check-fixture " << rep.case_name << ": bounded replay, decoder layers " << c.decoder_start << ".." << c.n_layers - 1
                  << " over positions " << replay << ".." << N - 1;
  }
  if (int64_t(logits.size()) != (n_steps + 1) * V)
    return FB_ERROR(kCorrupt) << "logits.f32 holds " << logits.size() << " floats, want " << (n_steps + 1) * V;

  // Optional draft outputs.
  std::vector<std::vector<int32_t>> draft_ids;
  std::vector<float> draft_logits, draft_conf;
  const int B = c.dspark_block_size;
  const bool have_drafts = c.n_mtp_layers > 0 && steps.contains("dspark") && steps["dspark"].is_object() &&
                           steps["dspark"].contains("draft_ids") && fs::exists(fs::path(dir) / "draft_logits.f32");
  if (have_drafts) {
    for (auto& d : steps["dspark"]["draft_ids"]) {
      std::vector<int32_t> v;
      for (auto& x : d) v.push_back(x.get<int32_t>());
      draft_ids.push_back(v);
    }
    draft_logits = FB_TRY(load_raw<float>((fs::path(dir) / "draft_logits.f32").string()));
    if (fs::exists(fs::path(dir) / "draft_conf.f32")) draft_conf = FB_TRY(load_raw<float>((fs::path(dir) / "draft_conf.f32").string()));
    if (int64_t(draft_logits.size()) != n_steps * B * V) return FB_ERROR(kCorrupt) << "draft_logits.f32 has the wrong size";
  }

  auto session = ex->new_session();
  std::vector<model::SessionState*> sess{session.get()};
  // Optional lockstep reference (same steps, same teacher forcing).
  std::unique_ptr<model::Executor> ref;
  std::unique_ptr<model::SessionState> ref_session;
  std::vector<model::SessionState*> ref_sess;
  ReferenceComparison& cmp = rep.reference;
  if (opt.make_reference) {
    auto r = opt.make_reference((fs::path(dir) / "checkpoint").string());
    if (!r.ok()) return r.status();
    ref = std::move(r.value());
    ref_session = ref->new_session();
    ref_sess.push_back(ref_session.get());
    cmp.ran = true;
    cmp.name = std::string(ex->name()) + " vs " + ref->name();
  }
  auto compare_ref_logits = [&](const float* got, const float* want) {
    ++cmp.rows;
    cmp.rows_bitwise += same_bits(got, want, V);
    cmp.ids_same += argmax(got, V) == argmax(want, V);
    cmp.max_dlogit = std::max(cmp.max_dlogit, max_abs_diff(got, want, V));
  };
  // The image stages run on the checked executor's tower (encode_image); with a reference, its
  // tower runs on the same patches and both outputs are compared bit for bit.
  if (has_image) {
    vision::ImageEncoder enc = [&](const std::vector<uint16_t>& patches, int nvh, int nvw,
                                   std::vector<uint16_t>* vit) -> Result<std::vector<uint16_t>> {
      auto aligned = ex->encode_image(patches, nvh, nvw, vit);
      if (!aligned.ok() || !ref) return aligned;
      std::vector<uint16_t> rvit;
      auto raligned = ref->encode_image(patches, nvh, nvw, &rvit);
      if (!raligned.ok()) return raligned.status();
      ++cmp.vision_images;
      cmp.vision_bitwise += (!vit || *vit == rvit) && aligned.value() == raligned.value();
      return aligned;
    };
    image = FB_TRY(vision::check_image_fixture(dir, int64_t(prompt.size()), enc));
    FB_LOG(kInfo) << "check-fixture " << rep.case_name << " " << image->line();
  }
  const int n_taps = int(c.dspark_target_layer_ids.size());
  const int64_t tap_w = int64_t(n_taps) * c.dim;

  // ---- prefill (one shot or chunks), taps collected per block ----
  model::Taps taps;
  taps.enabled = fs::exists(fs::path(dir) / "taps") || !opt.dump_dir.empty();
  taps.detailed = !opt.dump_dir.empty();
  std::vector<std::vector<uint16_t>> tap_all(size_t(c.n_layers));
  std::vector<uint16_t> dspark_taps;  // [N, tap_w]
  std::vector<float> row_logits;
  const int64_t chunk = opt.chunk > 0 ? opt.chunk : N;
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    model::Step st;
    for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
      model::Row r = model::prefill_row(p, prompt[size_t(p)], N, replay);
      if (image && image->embed_row[size_t(p)] >= 0) {
        r.image = true;
        r.embed_row = int32_t(st.embeddings.size() / size_t(c.dim));
        const uint16_t* e = &image->embeddings[size_t(image->embed_row[size_t(p)]) * size_t(c.dim)];
        st.embeddings.insert(st.embeddings.end(), e, e + c.dim);
      }
      st.rows.push_back(r);
    }
    taps.after_block.clear();
    model::StepOutput out = FB_TRY(ex->forward(st, sess, &taps));
    if (ref) {
      model::Taps rt;
      rt.enabled = true;
      model::StepOutput ro = FB_TRY(ref->forward(st, ref_sess, &rt));
      if (!ro.logits.empty() && ro.logits.size() == out.logits.size()) compare_ref_logits(out.logits.data(), ro.logits.data());
      if (taps.enabled)
        for (int l = 0; l < c.n_layers; ++l) {
          const auto& a = taps.after_block[size_t(l)];
          const auto& b = rt.after_block[size_t(l)];
          ++cmp.tap_layers;
          cmp.tap_layers_bitwise += a.size() == b.size() && a == b;
          for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
            cmp.tap_max = std::max(cmp.tap_max, std::fabs(double(bf16_to_f32(a[i])) - double(bf16_to_f32(b[i]))));
        }
      ++cmp.tap_layers;  // the DSpark tap rows count as one more tap set
      cmp.tap_layers_bitwise += ro.taps == out.taps;
    }
    if (taps.enabled)
      for (int l = 0; l < c.n_layers; ++l) tap_all[size_t(l)].insert(tap_all[size_t(l)].end(), taps.after_block[size_t(l)].begin(), taps.after_block[size_t(l)].end());
    dspark_taps.insert(dspark_taps.end(), out.taps.begin(), out.taps.end());
    if (!out.logits.empty()) row_logits = out.logits;
  }
  if (!opt.dump_dir.empty()) {
    fs::create_directories(opt.dump_dir);
    for (const auto& [k, v] : taps.named)
      FB_RETURN_IF_ERROR(write_file_atomic((fs::path(opt.dump_dir) / (k + ".f32")).string(), v.data(), v.size() * sizeof(float)));
  }

  RowCompare all;
  std::vector<double> step_max;
  auto compare_row = [&](int64_t k, const float* got) {
    const float* want = &logits[size_t(k * V)];
    RowCompare rc;
    rc.add(got, want, V);
    all.max_abs = std::max(all.max_abs, rc.max_abs);
    all.sum_abs += rc.sum_abs;
    all.n += rc.n;
    all.max_rel = std::max(all.max_rel, rc.max_rel);
    const int ours = argmax(got, V);
    ++rep.ids_total;
    if (ours == greedy[size_t(k)]) {
      ++rep.ids_match;
    } else {
      const double m = margin(want, V);
      if (m <= 2 * rc.max_abs) {
        ++rep.ids_near_tie;
        FB_LOG(kWarn) << rep.case_name << ": row " << k << " argmax " << ours << " vs " << greedy[size_t(k)] << " near-tie (margin " << m
                      << " <= 2 x " << rc.max_abs << ")";
      } else if (rep.first_divergence < 0) {
        rep.first_divergence = int(k);
        FB_LOG(kWarn) << rep.case_name << ": row " << k << " argmax " << ours << " vs " << greedy[size_t(k)] << " with margin " << m;
      }
    }
    if (opt.verbose) FB_LOG(kInfo) << "row " << k << " max|dlogit| " << rc.max_abs;
  };
  compare_row(0, row_logits.data());

  // ---- taps ----
  rep.taps = "absent";
  if (taps.enabled) {
    double worst = 0;
    bool ok = true;
    for (int l = 0; l < c.n_layers; ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "layer%02d.bf16", l);
      auto want = load_raw<uint16_t>((fs::path(dir) / "taps" / name).string());
      if (!want.ok()) continue;
      const auto& got = tap_all[size_t(l)];
      if (got.size() != want->size()) {
        ok = false;
        FB_LOG(kWarn) << "tap " << name << " size " << got.size() << " vs " << want->size();
        continue;
      }
      double ss = 0, md = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        double w = bf16_to_f32((*want)[i]);
        ss += w * w;
        md = std::max(md, std::fabs(double(bf16_to_f32(got[i])) - w));
      }
      const double rms = std::sqrt(ss / double(std::max<size_t>(1, got.size())));
      const double rel = rms > 0 ? md / rms : md;
      worst = std::max(worst, rel);
      if (opt.verbose) FB_LOG(kInfo) << "tap layer " << l << " max|d|/rms " << rel;
    }
    // Reported, not gated: the layer gate judges layers (CLARIFICATIONS "Fixture gates").
    std::ostringstream o;
    if (ok && worst <= 0.01) o << "OK(max_rel=" << worst << ")";
    else o << "max_rel=" << worst;
    rep.taps = o.str();
  }

  // ---- DSpark seeding, then teacher-forced decode with a draft call after each step ----
  const int64_t W = c.window_size;
  if (have_drafts) {
    const int64_t first = std::max<int64_t>(0, N - W);
    FB_RETURN_IF_ERROR(ex->draft_commit(*session, first, &dspark_taps[size_t(first * tap_w)], N - first));
    if (ref) FB_RETURN_IF_ERROR(ref->draft_commit(*ref_session, first, &dspark_taps[size_t(first * tap_w)], N - first));
  }
  double draft_max = 0, draft_sum = 0, conf_max = 0, conf_sum = 0;
  int64_t draft_n = 0;
  int draft_rows = 0, draft_id_match = 0, draft_id_total = 0, draft_conf_rows = 0;
  for (int64_t k = 1; k <= n_steps; ++k) {
    model::Step st;
    const model::Row& r = st.rows.emplace_back(model::decode_row(N + k - 1, greedy[size_t(k - 1)]));
    model::StepOutput out = FB_TRY(ex->forward(st, sess, nullptr));
    compare_row(k, out.logits.data());
    if (ref) {
      model::StepOutput ro = FB_TRY(ref->forward(st, ref_sess, nullptr));
      compare_ref_logits(out.logits.data(), ro.logits.data());
      if (have_drafts && size_t(k - 1) < draft_ids.size()) {
        // Both drafts from the SAME tap row (ours), so the comparison isolates the draft pass.
        model::DraftOutput a = FB_TRY(ex->draft(*session, greedy[size_t(k)], out.taps.data(), r.pos));
        model::DraftOutput b = FB_TRY(ref->draft(*ref_session, greedy[size_t(k)], out.taps.data(), r.pos));
        for (int j = 0; j < B; ++j) {
          ++cmp.draft_rows;
          cmp.draft_rows_bitwise += same_bits(&a.logits[size_t(j * V)], &b.logits[size_t(j * V)], V) &&
                                    std::memcmp(&a.confidence[size_t(j)], &b.confidence[size_t(j)], sizeof(float)) == 0;
          cmp.draft_max_dlogit = std::max(cmp.draft_max_dlogit, max_abs_diff(&a.logits[size_t(j * V)], &b.logits[size_t(j * V)], V));
          cmp.draft_max_dconf = std::max(cmp.draft_max_dconf, double(std::fabs(a.confidence[size_t(j)] - b.confidence[size_t(j)])));
        }
        for (size_t j = 0; j < a.ids.size() && j < b.ids.size(); ++j) {
          ++cmp.draft_ids_total;
          cmp.draft_ids_same += a.ids[j] == b.ids[j];
        }
        // Re-run our draft for the fixture comparison below from the same state: draft() is
        // idempotent for a given (anchor, tap row, p) because the ring write of p is the same.
      }
    }
    if (have_drafts && size_t(k - 1) < draft_ids.size()) {
      model::DraftOutput d = FB_TRY(ex->draft(*session, greedy[size_t(k)], out.taps.data(), r.pos));
      const auto& want_ids = draft_ids[size_t(k - 1)];
      // Row j's inputs match while the chain's earlier ids match (the anchor is teacher-forced).
      for (int j = 0; j < B; ++j) {
        if (size_t(j) >= want_ids.size() || d.ids[size_t(j)] != want_ids[size_t(j)]) break;
        const float* got = &d.logits[size_t(j * V)];
        const float* want = &draft_logits[size_t(((k - 1) * B + j) * V)];
        RowCompare rc;
        rc.add(got, want, V);
        draft_max = std::max(draft_max, rc.max_abs);
        draft_sum += rc.sum_abs;
        draft_n += rc.n;
        ++draft_rows;
        if (!draft_conf.empty()) {
          const double dc = std::fabs(double(d.confidence[size_t(j)]) - draft_conf[size_t((k - 1) * B + j)]);
          conf_max = std::max(conf_max, std::isnan(dc) ? INFINITY : dc);
          conf_sum += dc;
          ++draft_conf_rows;
        }
        ++draft_id_total;
        if (size_t(j + 1) < want_ids.size() && d.ids[size_t(j + 1)] == want_ids[size_t(j + 1)]) {
          ++draft_id_match;
        } else if (size_t(j + 1) < want_ids.size()) {
          const double m = margin(want, V);
          if (m <= 2 * rc.max_abs) ++draft_id_match;  // explained near-tie
        }
      }
    }
  }
  rep.max_dlogit = all.max_abs;
  rep.mean_dlogit = all.n ? all.sum_abs / double(all.n) : 0;
  rep.max_rel = all.max_rel;
  // End-to-end gate (smooth fixtures; the figures are reported for every fixture): logits bounds,
  // every greedy id equal except at the fixture's near-ties (compare_row), drafts and raw
  // confidences at the positions whose earlier draft ids agree.
  bool drafts_ok = true;
  if (have_drafts) {
    rep.draft_rows = draft_rows;
    rep.draft_max_dlogit = draft_max;
    rep.draft_mean_dlogit = draft_n ? draft_sum / double(draft_n) : 0;
    rep.draft_max_dconf = conf_max;
    rep.draft_mean_dconf = draft_conf_rows ? conf_sum / draft_conf_rows : 0;
    drafts_ok = draft_rows > 0 && rep.draft_max_dlogit <= kDraftMax && rep.draft_mean_dlogit <= kDraftMean && rep.draft_max_dconf <= kDraftMax &&
                rep.draft_mean_dconf <= kDraftMean;
    std::ostringstream o;
    o << (drafts_ok ? "OK" : rep.smooth ? "FAIL" : "over") << "(rows=" << draft_rows << " ids=" << draft_id_match << "/" << draft_id_total
      << " max_dlogit=" << rep.draft_max_dlogit << " mean_dlogit=" << rep.draft_mean_dlogit << " max_dconf=" << rep.draft_max_dconf
      << " mean_dconf=" << rep.draft_mean_dconf << ")";
    rep.drafts = o.str();
  } else {
    rep.drafts = "absent";
  }
  rep.e2e_pass = rep.max_dlogit <= kE2eMaxDlogit && rep.mean_dlogit <= kE2eMeanDlogit && rep.first_divergence < 0 && drafts_ok;
  if (image) {
    std::ostringstream o;
    o << (image->ok() ? "OK" : "FAIL") << "(vit_nmse=" << image->vit_nmse << " vit_row=" << image->vit_row_rel << " aligned_nmse=" << image->aligned_nmse
      << " aligned_row=" << image->aligned_row_rel << " patches=" << (image->patches_exact ? "exact" : "DIFFER") << ")";
    rep.vision = o.str();
  }
  if (has_inject) {
    std::vector<uint8_t> image_rows(prompt.size(), 0);
    for (size_t p = 0; image && p < prompt.size(); ++p) image_rows[p] = image->embed_row[p] >= 0;
    rep.layer = FB_TRY(layer_gate(dir, *ex, prompt, image_rows, opt, rep.case_name));
  }
  rep.pass = (!rep.smooth || rep.e2e_pass) && (!has_inject || rep.layer.pass) && (!image || image->ok());
  return rep;
}

}  // namespace fb::engine
