#include "engine/scripted_executor.h"

namespace fb::engine {

namespace {
class ScriptedSession final : public model::SessionState {
 public:
  int64_t n_pos() const override { return n; }
  Status rollback(int64_t p) override {
    if (p < 0 || p > n) return FB_ERROR(kInvalidArgument) << "rollback to " << p << " outside [0, " << n << "]";
    n = p;
    return Status();
  }
  int64_t n = 0;
  int64_t prompt_end = 0;
  size_t script = 0;
};
}  // namespace

ScriptedExecutor::ScriptedExecutor(int64_t vocab, std::vector<std::vector<int32_t>> scripts, int64_t max_context)
    : scripts_(std::move(scripts)) {
  cfg_.vocab_size = vocab;
  cfg_.max_position_embeddings = max_context;
  cfg_.window_size = 128;
  if (scripts_.empty()) scripts_.push_back({});
}

std::unique_ptr<model::SessionState> ScriptedExecutor::new_session() const { return std::make_unique<ScriptedSession>(); }

Result<model::StepOutput> ScriptedExecutor::forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                                    model::Taps*) {
  model::StepOutput out;
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const model::Row& r = step.rows[i];
    if (r.session < 0 || size_t(r.session) >= sessions.size()) return FB_ERROR(kInvalidArgument) << "row session out of range";
    auto* s = static_cast<ScriptedSession*>(sessions[size_t(r.session)]);
    if (r.pos != s->n) return FB_ERROR(kInvalidArgument) << "row position " << r.pos << ", session expects " << s->n;
    ++s->n;
    if (!r.want_logits) continue;
    if (r.kind == model::RowKind::kPrefill) {
      s->prompt_end = r.pos + 1;
      s->script = next_script_++ % scripts_.size();
    }
    const auto& sc = scripts_[s->script];
    const int64_t k = r.pos + 1 - s->prompt_end;
    const int32_t id = k >= 0 && k < int64_t(sc.size()) ? sc[size_t(k)] : int32_t(cfg_.eos_token_id);
    out.logit_rows.push_back(int(i));
    const size_t at = out.logits.size();
    out.logits.resize(at + size_t(cfg_.vocab_size), 0.0f);
    out.logits[at + size_t(id)] = 30.0f;
  }
  return out;
}

Status ScriptedExecutor::draft_commit(model::SessionState&, int64_t, const uint16_t*, int64_t) {
  return FB_ERROR(kUnsupported) << "the scripted executor has no DSpark stages";
}

Result<model::DraftOutput> ScriptedExecutor::draft(model::SessionState&, int32_t, const uint16_t*, int64_t) {
  return FB_ERROR(kUnsupported) << "the scripted executor has no DSpark stages";
}

}  // namespace fb::engine
