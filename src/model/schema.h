// The expected tensor set of a checkpoint, derived from its Config alone (spec/10 §3, spec/13 §2,
// spec/14 §2): every name, dtype and shape, with a byte class for the inventory. The loader
// validates a snapshot against it; make-tiny writes exactly it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/config.h"

namespace fb::model {

enum class ByteClass : uint8_t {
  kRoutedExperts,
  kEngramTables,
  kEngramOther,   // wkv + q/k weights
  kAttention,     // FP8 attention projections + norms + sinks
  kSharedExperts,
  kRouter,
  kMhc,
  kIndexer,
  kCompressor,
  kEmbed,
  kHead,          // head.weight + final norm
  kDraft,         // mtp.* (all of it)
  kVision,        // vision tower, aligner, image delimiters
  kCount
};
const char* byte_class_name(ByteClass c);

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  ByteClass klass;
  int layer = -1;    // backbone or draft layer index (draft: n_layers + stage), -1 global
  int expert = -1;   // routed expert id, -1 otherwise
  int64_t nbytes() const;
};

// Every tensor the checkpoint must hold, in a stable order (globals, layers, draft, vision).
std::vector<TensorSpec> expected_tensors(const Config& c);

struct ByteInventory {
  int64_t bytes[size_t(ByteClass::kCount)] = {};
  int64_t n_tensors = 0;
  int64_t total() const;
};
ByteInventory inventory(const std::vector<TensorSpec>& specs);

// Tensor name helpers shared by the loader, make-tiny and executors.
std::string layer_prefix(const Config& c, int layer);  // "layers.L." or "mtp.S."

}  // namespace fb::model
