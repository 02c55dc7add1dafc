// TokenConstraint: the seam between sampling and a grammar (constrained decoding, issue 27). The
// generator asks it which next tokens are allowed and tells it which tokens were emitted; the
// grammar itself (JSON schema -> token masks) lives in src/grammar, which the device build lacks.
// Invariant: the state only moves through accept/rollback, so the mask of a DSpark verify row is
// the mask plain decoding would have used at that position (its drafts accepted, then undone).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fb::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Allowed next tokens after the accepted tokens and then `extra` (tokens not yet emitted: the
  // drafts before a verify row), as bits: token t is allowed when bits[t / 32] >> (t % 32) & 1.
  // Sized for the model's vocabulary. Every prefix of `extra` must have been allowed.
  virtual void allowed(std::span<const int32_t> extra, std::vector<uint32_t>* bits) = 0;
  // One emitted token; false when the grammar does not allow it (the state is then unchanged).
  virtual bool accept(int32_t token) = 0;
  // Undoes the last n accepted tokens.
  virtual void rollback(int n) = 0;
};

}  // namespace fb::engine
