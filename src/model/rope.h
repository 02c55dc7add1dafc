// RoPE frequencies and their cos/sin (spec/11 §1.6), computed on the host once for both executors:
// the CPU reference rotates with them, the CUDA executor uploads tables of them. Host libm
// (std::pow, std::cos, std::sin) in f32 as the reference does; no backend code here.
#pragma once

#include <cstdint>
#include <vector>

namespace fb::model {

struct RopeTable {
  int rope_dim = 0;
  std::vector<float> freqs;  // [rope_dim / 2] (f'_i of spec/11 §1.6)
  // cos/sin of f32(p) * freq_i, computed in f32.
  void at(int64_t pos, float* cos_out, float* sin_out) const;
};
// Plain frequencies theta^(-2i/rope_dim), with the YaRN ramp between beta_fast and beta_slow when
// `yarn` (compressed layers).
RopeTable make_rope_table(int rope_dim, double theta, bool yarn, double factor, int64_t original_seq_len, double beta_fast,
                          double beta_slow);

}  // namespace fb::model
