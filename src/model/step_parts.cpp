#include "model/step_parts.h"

#include <algorithm>

namespace fb::model {

std::vector<StepPart> split_step(const Step& st, int64_t max_rows) {
  const int64_t n = int64_t(st.rows.size());
  const bool any_decode =
      std::any_of(st.rows.begin(), st.rows.end(), [](const Row& r) { return r.kind != RowKind::kPrefill; });
  if (n <= max_rows || !any_decode) return {{0, n}};
  std::vector<StepPart> parts;
  int64_t t = 0;
  while (t < n && st.rows[size_t(t)].kind == RowKind::kPrefill) ++t;
  if (t > 0) parts.push_back({0, t});
  // Session runs from t on, packed greedily.
  StepPart cur{t, t};
  while (t < n) {
    int64_t e = t + 1;
    while (e < n && st.rows[size_t(e)].session == st.rows[size_t(t)].session) ++e;
    if (cur.end > cur.begin && e - cur.begin > max_rows) {
      parts.push_back(cur);
      cur = {t, t};
    }
    cur.end = e;
    t = e;
  }
  if (cur.end > cur.begin) parts.push_back(cur);
  return parts;
}

Step part_step(const Step& st, const StepPart& p) {
  Step s;
  s.rows.assign(st.rows.begin() + p.begin, st.rows.begin() + p.end);
  s.embeddings = st.embeddings;
  s.taps_from_row = std::clamp<int64_t>(st.taps_from_row - p.begin, 0, p.end - p.begin);
  s.logits_to_host = st.logits_to_host;
  return s;
}

void append_part_output(StepOutput* all, StepOutput&& part, const StepPart& p, int64_t step_rows, int64_t taps_from_row) {
  for (int r : part.logit_rows) all->logit_rows.push_back(int(p.begin) + r);
  all->logits.insert(all->logits.end(), part.logits.begin(), part.logits.end());
  all->argmax.insert(all->argmax.end(), part.argmax.begin(), part.argmax.end());
  all->taps.insert(all->taps.end(), part.taps.begin(), part.taps.end());
  all->taps_first_row = std::clamp<int64_t>(taps_from_row, 0, step_rows);
}

}  // namespace fb::model
