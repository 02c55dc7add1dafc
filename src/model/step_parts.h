// Splitting one forward step into consecutive parts that run as steps of their own, and joining
// their outputs back into the step's (CUDA fast class, issue 20): an executor whose kernels
// depend on a step's row count keeps a decode row's bits independent of the rows beside it by
// running every step that carries decode rows as parts of at most `max_rows` rows. Rows of
// different sessions never read each other, and one session's rows stay together and in order,
// so the parts compute what the whole step computes. Backend-free bookkeeping only.
#pragma once

#include <cstdint>
#include <vector>

#include "model/step.h"

namespace fb::model {

// Rows [begin, end) of a step.
struct StepPart {
  int64_t begin = 0, end = 0;
};

// The parts of `st`: one part (the whole step) when it has at most max_rows rows or no decode
// rows. Otherwise its leading prefill rows form one part (a prefill chunk, taking the kernels a
// chunk of that size takes alone), and the rest are packed in row order into parts of at most
// max_rows rows that never split one session's run of rows (a run longer than max_rows is a part
// of its own). Prefill rows after a decode row belong to the decode parts.
std::vector<StepPart> split_step(const Step& st, int64_t max_rows);

// Part `p` of `st` as a step: its rows, every embedding (rows keep their embed_row), and the
// step's taps_from_row relative to the part's first row, its logits_to_host.
Step part_step(const Step& st, const StepPart& p);

// Appends a part's output to the step's: logit row indices shifted by the part's first row, logits,
// their argmax and tap rows concatenated. Parts must be appended in order, starting with `all` empty;
// `taps_from_row` is the whole step's (the joined output's taps_first_row).
void append_part_output(StepOutput* all, StepOutput&& part, const StepPart& p, int64_t step_rows, int64_t taps_from_row);

}  // namespace fb::model
