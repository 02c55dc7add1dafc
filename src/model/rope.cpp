#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace fb::model {

RopeTable make_rope_table(int rope_dim, double theta, bool yarn, double factor, int64_t original_seq_len, double beta_fast,
                          double beta_slow) {
  RopeTable t;
  t.rope_dim = rope_dim;
  const int half = rope_dim / 2;
  t.freqs.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rope_dim);
    t.freqs[size_t(i)] = 1.0f / std::pow(float(theta), e);
  }
  if (yarn && original_seq_len > 0) {
    auto cd = [&](double rot) { return rope_dim * std::log(double(original_seq_len) / (rot * 2.0 * M_PI)) / (2.0 * std::log(theta)); };
    double lo = std::max(std::floor(cd(beta_fast)), 0.0);
    double hi = std::min(std::ceil(cd(beta_slow)), double(rope_dim - 1));
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; ++i) {
      float ramp = (float(i) - float(lo)) / float(hi - lo);
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = t.freqs[size_t(i)];
      t.freqs[size_t(i)] = f / float(factor) * (1.0f - smooth) + f * smooth;
    }
  }
  return t;
}

void RopeTable::at(int64_t pos, float* c, float* s) const {
  for (size_t i = 0; i < freqs.size(); ++i) {
    const float ang = float(pos) * freqs[i];
    c[i] = std::cos(ang);
    s[i] = std::sin(ang);
  }
}

}  // namespace fb::model
