// Binds a validated Snapshot's tensors to the backend-free weight structs of model/weights.h,
// and serves routed experts straight from the mapped shards (the CPU reference's ExpertSource).
#pragma once

#include <vector>

#include "loader/snapshot.h"
#include "model/weights.h"

namespace fb::loader {

// Binds every non-expert tensor; the snapshot must have passed validate().
model::ModelWeights bind_weights(const Snapshot& snap);

class SnapshotExperts final : public model::ExpertSource {
 public:
  explicit SnapshotExperts(const Snapshot& snap);
  model::ExpertWeights expert(int layer, int e) const override;

 private:
  std::vector<std::vector<model::ExpertWeights>> experts_;  // [layer][expert]
};

}  // namespace fb::loader
