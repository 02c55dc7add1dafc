// Released weight statistics (spec/10 §7.4) that the generated models (make-tiny, the synthetic
// model at the released dimensions) draw their random weights with: norm-weight means and
// projection gains keyed by the tensor's owner name. Data only; no weights are read here.
#pragma once

#include <string>
#include <utility>

namespace fb::loader {

// Mean of a norm weight by owner (first match in this order); 1 for any other tensor.
inline float released_norm_mean(const std::string& name) {
  static const std::pair<const char*, float> kMeans[] = {{"attn_norm", 0.025f}, {"ffn_norm", 0.2f}, {"q_norm", 0.97f},
                                                         {"kv_norm", 0.4f},     {"compressor.norm", 0.6f}, {"k_norm", 0.5f}};
  for (auto& [k, v] : kMeans)
    if (name.find(k) != std::string::npos) return v;
  return 1.0f;
}

// Gain of a projection by owner: its weights' standard deviation is gain / sqrt(fan-in).
inline float released_gain(const std::string& name) {
  static const std::pair<const char*, float> kGains[] = {{".wq_a.", 1.6f}, {".wq_b.", 0.95f}, {".wkv.", 1.8f}, {".wo_a.", 1.6f},
                                                         {".wo_b.", 1.9f}, {".gate.", 2.9f},  {".w1.", 1.5f},  {".w3.", 1.5f},
                                                         {".w2.", 1.05f}};
  for (auto& [k, v] : kGains)
    if (name.find(k) != std::string::npos) return v;
  return 1.0f;
}

}  // namespace fb::loader
