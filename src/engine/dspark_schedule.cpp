#include "engine/dspark_schedule.h"

#include <algorithm>
#include <cmath>

namespace fb::engine {

std::vector<double> dspark_survival(std::span<const float> z, std::span<const double> temps) {
  std::vector<double> S(z.size());
  double s = 1.0;
  for (size_t k = 0; k < z.size(); ++k) {
    const double T = k < temps.size() && temps[k] > 0 ? temps[k] : 1.0;
    const double x = double(z[k]) / T;
    const double c = std::isfinite(x) ? 1.0 / (1.0 + std::exp(-x)) : (std::isnan(x) || x > 0 ? 1.0 : 0.0);
    S[k] = s *= c;
  }
  return S;
}

double VerifyCostTable::sps(int64_t rows) const {
  if (steps_per_s.empty()) return 1.0;
  const int64_t n = int64_t(steps_per_s.size());
  if (rows <= n) return steps_per_s[size_t(std::max<int64_t>(rows, 1) - 1)];
  return steps_per_s.back() * double(n) / double(rows);
}

VerifyCostTable VerifyCostTable::flat(int64_t max_rows) { return VerifyCostTable{std::vector<double>(size_t(max_rows), 1.0)}; }

int choose_verify_len(std::span<const double> survival, const VerifyCostTable& cost, int max_len, ScheduleRule rule) {
  const int B = std::min<int>(max_len, int(survival.size()));
  if (B <= 0) return 0;
  if (cost.empty()) return B;
  double tau = 1.0;
  double best = tau * cost.sps(1);
  int best_b = 0;
  for (int b = 1; b <= B; ++b) {
    tau += survival[size_t(b - 1)];
    const double theta = tau * cost.sps(1 + b);
    if (theta >= best) {  // ties go to the longer block: free rows (flat cost) are always used
      best = theta;
      best_b = b;
    } else if (rule == ScheduleRule::kEarlyStop) {
      break;
    }
  }
  return best_b;
}

bool drafting_pays(std::span<const double> survival, const VerifyCostTable& cost, int L) {
  if (L <= 0) return false;
  if (cost.empty() || cost.draft_s <= 0) return true;
  const double tokens = expected_tokens_per_round(survival, L);
  const double round_s = 1.0 / cost.sps(1 + L) + cost.draft_s;
  return tokens / round_s >= cost.sps(1);
}

double expected_tokens_per_round(std::span<const double> survival, int L) {
  double t = 1.0;
  for (int j = 0; j < L && j < int(survival.size()); ++j) t += survival[size_t(j)];
  return t;
}

}  // namespace fb::engine
