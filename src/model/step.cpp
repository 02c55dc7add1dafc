#include "model/step.h"

namespace fb::model {

Status check_row(const Config& c, const Step& st, const Row& r, const std::vector<int64_t>& next) {
  if (r.session < 0 || size_t(r.session) >= next.size()) return FB_ERROR(kInvalidArgument) << "row names session " << r.session;
  if (r.pos != next[size_t(r.session)])
    return FB_ERROR(kInvalidArgument) << "row position " << r.pos << " but session " << r.session << " expects " << next[size_t(r.session)];
  if (r.token < 0 || r.token >= c.vocab_size) return FB_ERROR(kInvalidArgument) << "token id " << r.token << " outside the vocabulary";
  if (r.embed_row >= 0 && size_t(r.embed_row + 1) * size_t(c.dim) > st.embeddings.size())
    return FB_ERROR(kInvalidArgument) << "row embedding " << r.embed_row << " missing";
  if (r.kind == RowKind::kPrefill && r.prefill_end <= r.pos) return FB_ERROR(kInvalidArgument) << "prefill row beyond its prefill_end";
  return Status();
}

Status check_replay_row(const Config& c, const Row& r) {
  if (r.kind != RowKind::kPrefill || r.replay_start < 0) return FB_ERROR(kInvalidArgument) << "replay_start on a row that is not a prefill row";
  if (c.decoder_start < 0) return FB_ERROR(kUnsupported) << "bounded replay: the config has no decoder KV source to split at";
  if (r.replay_start >= r.prefill_end) return FB_ERROR(kInvalidArgument) << "replay_start " << r.replay_start << " leaves no prompt row to replay";
  if (r.want_logits && r.pos < r.replay_start) return FB_ERROR(kInvalidArgument) << "row " << r.pos << " wants logits but ends at the encoder";
  return Status();
}

}  // namespace fb::model
