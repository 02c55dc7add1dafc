// ScriptedExecutor: a TEST DOUBLE model::Executor whose logits are one-hot on given token ids, so
// tests drive the real sampling, detokenization, DSML parsing and streaming path with output a
// random-weight model never produces (tool calls, thinking blocks; CLARIFICATIONS "tiny model").
// The i-th prefill that asks for logits starts script i (cycling); generated step k emits
// script[k], then EOS. No DSpark stages. Never used to serve a real model.
#pragma once

#include <memory>
#include <vector>

#include "model/executor.h"

namespace fb::engine {

class ScriptedExecutor final : public model::Executor {
 public:
  ScriptedExecutor(int64_t vocab, std::vector<std::vector<int32_t>> scripts, int64_t max_context = 65536);
  const model::Config& config() const override { return cfg_; }
  const char* name() const override { return "scripted"; }
  std::unique_ptr<model::SessionState> new_session() const override;
  Result<model::StepOutput> forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                    model::Taps* taps = nullptr) override;
  Status draft_commit(model::SessionState&, int64_t, const uint16_t*, int64_t) override;
  Result<model::DraftOutput> draft(model::SessionState&, int32_t, const uint16_t*, int64_t) override;

 private:
  model::Config cfg_;
  std::vector<std::vector<int32_t>> scripts_;
  size_t next_script_ = 0;
};

}  // namespace fb::engine
