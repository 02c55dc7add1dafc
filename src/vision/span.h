// Image spans in the token stream (spec/14 §6.1, reference image_token_types /
// merge_image_embeddings): [START] ([IMAGE] x nlw [NEWLINE]) x nlh [END], every id image_token_id,
// the role carried by a per-position type. Builds the span's BF16 input rows so image positions
// enter the forward pass as rows with embeddings (DESIGN-AHEAD item 8).
#pragma once

#include <cstdint>
#include <vector>

#include "model/step.h"
#include "model/weights.h"

namespace fb::vision {

enum SpanType : int32_t { kText = -1, kStart = 0, kImage = 1, kNewline = 2, kEnd = 3 };

// Types of one span, length nlh * (nlw + 1) + 2.
std::vector<int32_t> span_types(int nlh, int nlw);

// The learned START, NEWLINE and END vectors, in that order: bf16 [3, dim] (a host copy; what an
// executor hands out through model::Executor::image_span_markers).
std::vector<uint16_t> span_markers(const model::VisionWeights& w, int dim);

// bf16 [types.size(), dim]: START/NEWLINE/END take the learned vectors (`markers`, bf16 [3, dim]
// as span_markers returns them), the k-th IMAGE slot takes aligner row k (reading order).
// `aligned` is bf16 [n IMAGE slots, dim].
std::vector<uint16_t> span_embeddings(const std::vector<int32_t>& types, const std::vector<uint16_t>& aligned,
                                      const std::vector<uint16_t>& markers, int dim);
// The same with the markers read from the weights.
std::vector<uint16_t> span_embeddings(const std::vector<int32_t>& types, const std::vector<uint16_t>& aligned,
                                      const model::VisionWeights& w, int dim);

// Appends the span as rows of `step` at positions pos0.. (image = true, embed_row into
// step.embeddings, token = image_token_id). Rows are prefill rows ending at prefill_end.
void append_span_rows(model::Step& step, int session, int64_t pos0, const std::vector<int32_t>& types,
                      const std::vector<uint16_t>& embeddings, int dim, int32_t image_token_id, int64_t prefill_end);

}  // namespace fb::vision
