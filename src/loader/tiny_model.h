// The built-in tiny model: a random checkpoint in exactly the released storage format (HF config
// with text_config, index, FP8/MXFP4/E8M0 shards) with every structural feature on: window-only
// layers, ratio-2 and ratio-1 KV sources, Reuse and Reindex layers, a candidate pool, Engram with
// prime-derived tables, three DSpark stages, optionally a ViT. Deterministic for a seed; weight
// statistics follow the released model's (norm means far from 1, fan-in-scaled projections with
// gains, embedding RMS 0.12; spec/10 §7.4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"

namespace fb::loader {

struct TinyModelOptions {
  std::string out_dir;
  uint64_t seed = 0;
  bool vision = false;
  int64_t vocab_size = 129280;           // the real V4.1 vocabulary
  int64_t engram_compressed_vocab = 99092;  // class count of the tokenizer-derived map
  // Smooth model (CLARIFICATIONS "Numerics classes", gate 3): hidden 1024 and every selection
  // other than the final argmax complete (all routed experts active in the backbone and the
  // draft, index top-k and candidate blocks larger than any context up to 4,096 positions), so
  // its logits are a continuous function of arithmetic error and two numerics classes compare.
  bool smooth = false;
  // Optional: its total becomes the checkpoint's bytes and its second counter the tensors,
  // updated per tensor and finished when the files are written
  // (make-tiny's progress on a terminal, issue 24).
  Progress* progress = nullptr;
};

// The tiny model's config.json text (HF layout).
std::string tiny_config_json(const TinyModelOptions& o);

// The synthetic model at the RELEASED dimensions for benchmarks (issue 6): 40 layers, hidden 5120,
// 64 x 512 heads, the released CSA2/CED schedule, Engram at 1 and 14 with smaller tables, three
// DSpark stages, vocab 129,280; only the routed-expert count per layer is reduced so that every
// active weight fits in HBM. Batch-1 decode then reads what the real model reads per token.
std::string released_synthetic_config_json(int n_routed_experts, int draft_experts, int64_t engram_vocab_size);

// Writes config.json, model.safetensors.index.json and the shards into o.out_dir (created).
Status write_tiny_model(const TinyModelOptions& o);

// A stand-in Engram token map for a model run without its tokenizer-derived map (the synthetic
// model, tests): token id mod the class count, so every class is used when vocab >= classes.
std::vector<int32_t> modular_engram_map(int64_t vocab_size, int64_t n_classes);

}  // namespace fb::loader
