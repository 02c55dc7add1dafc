#include "loader/synthetic.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <unordered_map>

#include "base/dtype.h"
#include "base/progress.h"
#include "loader/released_stats.h"
#include "loader/tiny_model.h"
#include "model/schema.h"

namespace fb::loader {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately normal from the sum of four uniforms (variance matched), fast and deterministic.
float gauss(uint64_t key) {
  uint64_t r = mix(key);
  float s = 0;
  for (int i = 0; i < 4; ++i) s += float((r >> (16 * i)) & 0xFFFF) * (1.0f / 65535.0f);
  return (s - 2.0f) * 1.7320508f;  // var(sum of 4 U(0,1)) = 1/3
}

void parallel_fill(std::vector<uint8_t>& buf, const std::function<void(size_t, size_t)>& fill) {
  const unsigned n = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  const size_t chunk = (buf.size() + n - 1) / n;
  for (unsigned i = 0; i < n; ++i) th.emplace_back([&, i] { fill(i * chunk, std::min(buf.size(), (i + 1) * chunk)); });
  for (auto& t : th) t.join();
}

}  // namespace

Result<std::unique_ptr<Snapshot>> synthetic_snapshot(const std::string& config_json, uint64_t seed, int distinct_experts,
                                                     const ProgressOptions& progress) {
  model::Config c = FB_TRY(model::Config::from_hf_json(config_json));
  const auto specs = model::expected_tensors(c);
  int64_t max_code_bytes = 0;
  std::unordered_map<std::string, size_t> index;  // name -> spec (a scale finds its weight's fan-in)
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (s.dtype == DType::kF8E4M3 || s.dtype == DType::kI8) max_code_bytes = std::max(max_code_bytes, s.nbytes());
    index[s.name] = i;
  }
  // Progress (on a terminal only): the bytes this function generates (the code pool, then every
  // tensor that does not share the pool's or an earlier expert's bytes) and every tensor.
  auto generated = [&](const model::TensorSpec& s) {
    return !(s.dtype == DType::kF8E4M3 || s.dtype == DType::kI8) && !(distinct_experts > 0 && s.expert >= distinct_experts);
  };
  int64_t total_bytes = max_code_bytes, done_bytes = 0, done_tensors = 0;
  for (const auto& s : specs)
    if (generated(s)) total_bytes += s.nbytes();
  Progress prog("synthetic model", total_bytes, ProgressUnit::kBytes, progress);
  prog.set_items_total(int64_t(specs.size()), "tensors");
  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(specs.size() + 2);
  // Shared pool of FP8 codes / packed FP4 nibbles. e4m3 codes avoid NaN (0x7F/0xFF) and keep
  // |v| <= 8 (biased exponent <= 10); the resulting code RMS is ~2.2 (FP4 nibbles ~3.2).
  storage.emplace_back(size_t(max_code_bytes));
  parallel_fill(storage.back(), [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) {
      uint8_t v = uint8_t(mix(seed * 0x9E37ull + i));
      const uint8_t e = (v >> 3) & 0xF;
      if (e > 10) v = uint8_t((v & 0x87) | (uint8_t(e - 5) << 3));
      storage.back()[i] = v;
    }
  });
  done_bytes = max_code_bytes;
  prog.update(done_bytes, 0);
  const uint8_t* pool = storage.back().data();
  // Every generated e8m0 scale in one block (16-byte aligned pieces): the bench page-locks the
  // snapshot's large blocks, and a scale in a block of its own (< 1 MB) stayed pageable, so each
  // expert's three scale copies were pageable copies, which hold the issuing thread until the copy
  // engine has done everything queued before them (issue 26's 32K trace: the prefetch's issue
  // took the whole layer's copy time). The same bytes as before.
  auto is_scale_name = [](const std::string& n) { return n.size() > 6 && n.compare(n.size() - 6, 6, ".scale") == 0; };
  auto pooled_scale = [&](const model::TensorSpec& s) {
    return s.dtype == DType::kF8E8M0 && is_scale_name(s.name) && !(distinct_experts > 0 && s.expert >= distinct_experts);
  };
  size_t scale_bytes = 0;
  for (const auto& s : specs)
    if (pooled_scale(s)) scale_bytes += (size_t(s.nbytes()) + 15) / 16 * 16;
  storage.emplace_back(std::max<size_t>(scale_bytes, 1));
  uint8_t* scale_pool = storage.back().data();
  size_t scale_used = 0;
  std::map<std::string, TensorView> views;
  uint64_t key = seed << 40;
  for (const auto& s : specs) {
    TensorView v{s.dtype, s.shape, nullptr};
    const std::string& n = s.name;
    const bool is_scale = is_scale_name(n);
    if (s.dtype == DType::kF8E4M3 || s.dtype == DType::kI8) {
      v.data = pool;
    } else if (distinct_experts > 0 && s.expert >= distinct_experts) {
      // ".experts.<e>." -> ".experts.<e % distinct>.", generated earlier in this layer
      const std::string tag = ".experts." + std::to_string(s.expert) + ".";
      std::string src = n;
      src.replace(src.find(tag), tag.size(), ".experts." + std::to_string(s.expert % distinct_experts) + ".");
      v.data = views.at(src).data;
    } else if (s.dtype == DType::kF8E8M0 && is_scale) {
      // Power-of-two scales bring code RMS (~2.2 e4m3, ~3.2 e2m1) to gain / sqrt(fan_in).
      const std::string weight = n.substr(0, n.size() - 5) + "weight";
      int64_t fan_in = 0;
      bool fp4 = false;
      if (auto it = index.find(weight); it != index.end()) {
        const auto& t = specs[it->second];
        fp4 = t.dtype == DType::kI8;
        fan_in = fp4 ? t.shape[1] * 2 : t.shape[1];
      }
      const bool table = n.find("engram.embed") != std::string::npos;
      const double target = table ? 1.0 : released_gain(n) / std::sqrt(double(fan_in));
      const int e = int(std::lround(std::log2(target / (fp4 ? 3.2 : 2.2))));
      uint8_t* buf = scale_pool + scale_used;
      scale_used += (size_t(s.nbytes()) + 15) / 16 * 16;
      for (int64_t i = 0; i < s.nbytes(); ++i) buf[i] = uint8_t(127 + e + int(mix(key++) % 3) - 1);
      v.data = buf;
    } else {
      storage.emplace_back(size_t(s.nbytes()));
      auto& buf = storage.back();
      const int64_t count = s.nbytes() / int64_t(dtype_size(s.dtype));
      const bool is_norm = n.find("norm") != std::string::npos && n.find(".weight") != std::string::npos;
      float mean = 0, sd;
      if (n == "embed.weight" || n.find("markov_head.embed") != std::string::npos) {
        sd = 0.12f;
      } else if (is_norm) {
        mean = released_norm_mean(n);
        sd = 0.1f * mean;
      } else if (s.shape.size() >= 2) {
        sd = released_gain(n) / std::sqrt(float(s.shape.back()));
      } else {
        sd = 0.5f;
      }
      const uint64_t base = key;
      key += uint64_t(count);
      parallel_fill(buf, [&](size_t a, size_t b) {
        const size_t es = dtype_size(s.dtype);
        for (size_t i = a / es; i < b / es; ++i) {
          const float x = mean + sd * gauss(base + i);
          if (s.dtype == DType::kBF16) {
            const uint16_t h = bf16_bits_from_f32(x);
            std::memcpy(&buf[i * 2], &h, 2);
          } else {
            std::memcpy(&buf[i * 4], &x, 4);
          }
        }
      });
      v.data = buf.data();
    }
    views[n] = v;
    if (generated(s)) done_bytes += s.nbytes();
    prog.update(done_bytes, ++done_tensors);
  }
  prog.finish();
  // Engram token map: every class used (vocab >= classes).
  std::vector<int32_t> map = modular_engram_map(c.vocab_size, c.engram_compressed_vocab);
  return Snapshot::in_memory(std::move(c), std::move(views), std::move(storage), std::move(map));
}

}  // namespace fb::loader
