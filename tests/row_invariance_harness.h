// Row invariance of shared steps, on any model::Executor (issue 20): one decode session's logits
// and DSpark tap rows alone vs beside other sessions' decode / verify rows and a prompt chunk
// (steps of 4 to 149 rows), and draft_many's blocks vs each session's draft() alone. Used by
// cuda_row_invariance_test (gpu) and row_invariance_cpu_test (the CPU executor, which is
// row-invariant by construction: the harness's own check).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/executor.h"

namespace fb::row_invariance {

struct Case {
  const char* name;
  int others;            // sessions beside the subject
  int64_t other_rows;    // decode rows of each of them per step (> 1: a verify block)
  int64_t chunk;         // prompt rows of a prefilling session per step (0: none)
  int64_t subject_rows;  // the subject's decode rows per step
};

// (7 x 9 + 16 + 1 = 80 rows, 7 x 12 + 1 = 85 and 100 + 45 + 4 = 149 run as parts in the fast class.)
inline const Case kCases[] = {
    {"three_beside", 3, 1, 0, 1},        {"seven_and_a_chunk", 7, 1, 16, 1}, {"seven_verify_blocks_and_a_chunk", 7, 9, 16, 1},
    {"eighty_five_decode_rows", 7, 12, 0, 1}, {"verify_block_beside_a_big_chunk", 5, 9, 100, 4},
};
inline constexpr int kSteps = 6;

// Token ids above the special ones, inside any of the models' vocabularies (tiny-s0 has 512).
inline int32_t token_id(int64_t x, int64_t vocab) { return int32_t(16 + x % (vocab - 16)); }

inline std::vector<int32_t> prompt_of(int64_t n, int salt, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(token_id(7919 * (i + 1) + 104729 * salt, vocab));
  return p;
}

// Prompt rows [s0, s1) of `prompt` for session `session`.
inline void add_prompt_rows(model::Step* st, int session, const std::vector<int32_t>& prompt, int64_t s0, int64_t s1) {
  for (int64_t p = s0; p < s1; ++p) {
    model::Row r = model::prefill_row(p, prompt[size_t(p)], int64_t(prompt.size()));
    r.session = session;
    st->rows.push_back(r);
  }
}
inline void add_decode_rows(model::Step* st, int session, int64_t pos, int64_t n, int salt, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    model::Row r;
    r.session = session;
    r.pos = pos + i;
    r.token = token_id(1009 * (pos + i) + 31 * salt, vocab);
    r.want_logits = true;
    st->rows.push_back(r);
  }
}

inline Status prefill(model::Executor& ex, model::SessionState& s, const std::vector<int32_t>& prompt) {
  model::Step st;
  add_prompt_rows(&st, 0, prompt, 0, int64_t(prompt.size()));
  std::vector<model::SessionState*> ss{&s};
  return ex.forward(st, ss).status();
}

// The subject's logits and tap rows of each step: rows [first, first + n) of the step's output.
struct Seen {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<uint16_t>> taps;
};
inline void keep(const model::StepOutput& o, int64_t first, int64_t n, int64_t vocab, int64_t tap_w, Seen* seen) {
  std::vector<float> l;
  for (size_t i = 0; i < o.logit_rows.size(); ++i)
    if (o.logit_rows[i] >= first && o.logit_rows[i] < first + n)
      l.insert(l.end(), o.logits.begin() + int64_t(i) * vocab, o.logits.begin() + int64_t(i + 1) * vocab);
  seen->logits.push_back(std::move(l));
  std::vector<uint16_t> t;
  if (tap_w > 0) {
    EXPECT_EQ(o.taps_first_row, 0);
    t.assign(o.taps.begin() + first * tap_w, o.taps.begin() + (first + n) * tap_w);
  }
  seen->taps.push_back(std::move(t));
}

// `label` names the executor in the printed line.
inline void check_case(model::Executor& ex, const Case& c, const std::string& label, int steps = kSteps) {
  const model::Config& cfg = ex.config();
  const int64_t V = cfg.vocab_size, tap_w = int64_t(cfg.dspark_target_layer_ids.size()) * cfg.dim;
  const std::vector<int32_t> subject_prompt = prompt_of(40, 1, V);
  // Positions the case reaches (the newcomer's prompt is the longest): within the model's context.
  const int64_t reach = std::max<int64_t>({40 + steps * c.subject_rows, 24 + 5 * c.others + steps * c.other_rows, c.chunk * steps + 5});
  if (cfg.max_position_embeddings > 0 && reach > cfg.max_position_embeddings) {
    std::printf("%s: skipped, reaches position %lld of a %lld-position model\n", c.name, (long long)reach, (long long)cfg.max_position_embeddings);
    return;
  }
  // Alone.
  Seen alone;
  {
    auto s = ex.new_session();
    ASSERT_TRUE(prefill(ex, *s, subject_prompt).ok());
    std::vector<model::SessionState*> ss{s.get()};
    for (int k = 0; k < steps; ++k) {
      model::Step st;
      add_decode_rows(&st, 0, s->n_pos(), c.subject_rows, 0, V);
      auto o = ex.forward(st, ss);
      ASSERT_TRUE(o.ok()) << o.status().to_string();
      keep(*o, 0, c.subject_rows, V, tap_w, &alone);
    }
  }
  // Beside the others: [the prefilling session,] others before the subject, the subject, the rest.
  Seen beside;
  std::vector<std::unique_ptr<model::SessionState>> own;
  std::vector<model::SessionState*> ss;
  std::vector<int32_t> newcomer_prompt;
  int newcomer = -1;
  if (c.chunk > 0) {
    newcomer_prompt = prompt_of(c.chunk * steps + 5, 99, V);
    own.push_back(ex.new_session());
    newcomer = int(ss.size());
    ss.push_back(own.back().get());
  }
  std::vector<int> others;
  int subject = -1;
  for (int j = 0; j <= c.others; ++j) {
    own.push_back(ex.new_session());
    if (j == c.others / 2) {
      subject = int(ss.size());
      ASSERT_TRUE(prefill(ex, *own.back(), subject_prompt).ok());
    } else {
      others.push_back(int(ss.size()));
      ASSERT_TRUE(prefill(ex, *own.back(), prompt_of(24 + 5 * j, 2 + j, V)).ok());
    }
    ss.push_back(own.back().get());
  }
  int64_t max_rows = 0;
  for (int k = 0; k < steps; ++k) {
    model::Step st;
    if (newcomer >= 0) add_prompt_rows(&st, newcomer, newcomer_prompt, k * c.chunk, (k + 1) * c.chunk);
    int64_t subject_first = -1;
    for (int s = 0; s < int(ss.size()); ++s) {
      if (s == newcomer) continue;
      if (s == subject) {
        subject_first = int64_t(st.rows.size());
        add_decode_rows(&st, s, ss[size_t(s)]->n_pos(), c.subject_rows, 0, V);
      } else {
        add_decode_rows(&st, s, ss[size_t(s)]->n_pos(), c.other_rows, 7 * s + k, V);
      }
    }
    max_rows = std::max(max_rows, int64_t(st.rows.size()));
    auto o = ex.forward(st, ss);
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    keep(*o, subject_first, c.subject_rows, V, tap_w, &beside);
  }
  std::printf("%s (%s): steps of %lld rows\n", c.name, label.c_str(), (long long)max_rows);
  ASSERT_EQ(alone.logits.size(), beside.logits.size());
  for (int k = 0; k < steps; ++k) {
    ASSERT_EQ(alone.logits[size_t(k)].size(), size_t(c.subject_rows * V));
    ASSERT_EQ(beside.logits[size_t(k)].size(), alone.logits[size_t(k)].size());
    EXPECT_EQ(std::memcmp(alone.logits[size_t(k)].data(), beside.logits[size_t(k)].data(), alone.logits[size_t(k)].size() * sizeof(float)), 0)
        << c.name << ": the subject's logits of step " << k << " changed beside the others (" << max_rows << " rows)";
    EXPECT_EQ(alone.taps[size_t(k)], beside.taps[size_t(k)]) << c.name << ": tap rows of step " << k;
  }
}

// draft_many (several sessions' DSpark blocks in shared steps of up to 64 rows) gives each session
// the bits of its draft() alone: 3 sessions (one step) and 14 (more than 64 / B: two steps), one
// of them with a sampled picker that leaves the greedy chain at k = 2 (draft_sampled's rule).
// refuses_repeated_session: the executor checks draft_many's precondition (distinct sessions).
inline void check_draft_many(model::Executor& ex, bool refuses_repeated_session) {
  const model::Config& cfg = ex.config();
  const int64_t V = cfg.vocab_size, tap_w = int64_t(cfg.dspark_target_layer_ids.size()) * cfg.dim;
  ASSERT_GT(cfg.n_mtp_layers, 0);
  for (int n : {3, 14}) {
    std::vector<std::unique_ptr<model::SessionState>> own;
    std::vector<model::DraftJob> jobs;
    std::vector<std::vector<uint16_t>> taps;
    for (int i = 0; i < n; ++i) {
      own.push_back(ex.new_session());
      const std::vector<int32_t> prompt = prompt_of(20 + 3 * i, 40 + i, V);
      model::Step st;
      add_prompt_rows(&st, 0, prompt, 0, int64_t(prompt.size()));
      std::vector<model::SessionState*> ss{own.back().get()};
      auto o = ex.forward(st, ss);
      ASSERT_TRUE(o.ok()) << o.status().to_string();
      const int64_t rows = int64_t(prompt.size());
      ASSERT_EQ(int64_t(o->taps.size()), rows * tap_w);
      ASSERT_TRUE(ex.draft_commit(*own.back(), 0, o->taps.data(), rows).ok());
      taps.emplace_back(o->taps.end() - tap_w, o->taps.end());  // g(p) of the last prompt position
    }
    const model::DraftPicker off_chain = [V](int64_t k, const float* row) {
      const int32_t best = int32_t(std::max_element(row, row + V) - row);
      return k == 2 ? int32_t((best + 1) % V) : best;
    };
    for (int i = 0; i < n; ++i) {
      model::DraftJob j;
      j.session = own[size_t(i)].get();
      j.anchor = token_id(7 * i + 3, V);
      j.tap_row = taps[size_t(i)].data();
      j.p = own[size_t(i)]->n_pos() - 1;
      if (i == 1) j.pick = &off_chain;
      jobs.push_back(j);
    }
    std::vector<model::DraftOutput> alone;
    for (const model::DraftJob& j : jobs) {
      auto d = j.pick ? ex.draft_sampled(*j.session, j.anchor, j.tap_row, j.p, *j.pick) : ex.draft(*j.session, j.anchor, j.tap_row, j.p);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      alone.push_back(std::move(d).value());
    }
    std::vector<Result<model::DraftOutput>> many = ex.draft_many(jobs);
    ASSERT_EQ(many.size(), jobs.size());
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(many[size_t(i)].ok()) << many[size_t(i)].status().to_string();
      const model::DraftOutput& a = alone[size_t(i)];
      const model::DraftOutput& b = *many[size_t(i)];
      EXPECT_EQ(a.ids, b.ids) << n << " sessions, job " << i;
      EXPECT_EQ(a.confidence.size(), b.confidence.size());
      EXPECT_EQ(std::memcmp(a.confidence.data(), b.confidence.data(), std::min(a.confidence.size(), b.confidence.size()) * sizeof(float)), 0)
          << n << " sessions, job " << i << ": confidences";
      ASSERT_EQ(a.logits.size(), b.logits.size());
      EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0) << n << " sessions, job " << i << ": logits";
    }
    // The sampled job really left the greedy chain (its k = 2 pick is not the greedy draft's).
    auto greedy = ex.draft(*jobs[1].session, jobs[1].anchor, jobs[1].tap_row, jobs[1].p);
    ASSERT_TRUE(greedy.ok()) << greedy.status().to_string();
    ASSERT_GE(alone[1].ids.size(), 3u);
    EXPECT_NE(alone[1].ids[2], greedy->ids[2]) << "the picker left the greedy chain at k = 2";
    if (refuses_repeated_session) {
      std::vector<model::DraftJob> twice{jobs[0], jobs[0]};
      std::vector<Result<model::DraftOutput>> bad = ex.draft_many(twice);
      EXPECT_FALSE(bad[1].ok()) << "one session in two jobs";
    }
  }
}

}  // namespace fb::row_invariance
