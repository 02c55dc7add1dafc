#include "engine/executor_factory.h"

#include "cpu/executor.h"
#include "loader/snapshot.h"
#include "storage/tiered_experts.h"
#ifdef FB_HAVE_CUDA_EXECUTOR
#include "cuda/executor.h"
#endif

namespace fb::engine {

namespace {

// The host tiers of the routed experts: a host cache of records over the drives (the expert store
// replicas, or the snapshot's own shards read with O_DIRECT).
Result<std::shared_ptr<storage::TieredExperts>> host_tiers(const std::string& model_dir, const ExecutorOptions& opt, int first_tier_slots) {
  auto snap = FB_TRY(loader::Snapshot::open(model_dir));
  storage::TieredOptions to;
  to.slots_per_layer = first_tier_slots;
  to.host_experts = opt.host_experts > 0 ? opt.host_experts : opt.expert_slots;
  return storage::tiered_experts_for(*snap, opt.expert_store, to);
}

}  // namespace

Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir, const ExecutorOptions& opt) {
  if (opt.expert_slots < 0 || opt.expert_staging < 0 || opt.host_experts < 0)
    return FB_ERROR(kInvalidArgument) << "expert slots, staging slots and host experts must be >= 0";
  if (opt.expert_slots == 0 && (opt.host_experts > 0 || !opt.expert_store.empty() || opt.expert_staging > 0))
    return FB_ERROR(kInvalidArgument) << "--host-experts, --expert-store and --expert-staging need --expert-slots N (experts are all resident otherwise)";
  if (backend == "cpu") {
    auto m = cpu::CpuModel::load(model_dir);
    if (!m.ok()) return m.status();
    if (opt.expert_slots > 0) m.value()->set_expert_source(FB_TRY(host_tiers(model_dir, opt, opt.expert_slots)));
    return std::unique_ptr<model::Executor>(std::move(m).value());
  }
  if (backend == "cuda") {
#ifdef FB_HAVE_CUDA_EXECUTOR
    // The CUDA executor's loader (src/cuda/executor.h); same contract as CpuModel::load. With
    // expert slots the misses come from the host tiers (their first tier only stages a layer's picks).
    cuda::CudaLoadOptions lo;
    lo.expert_slots = opt.expert_slots;
    lo.expert_staging = opt.expert_staging;
    if (opt.expert_slots > 0) lo.experts = FB_TRY(host_tiers(model_dir, opt, 8));
    auto m = cuda::CudaModel::load(model_dir, {}, lo);
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kOutOfMemory)
        return m.status().with_context(opt.expert_slots > 0 ? "the model does not fit in HBM with --expert-slots " + std::to_string(opt.expert_slots) +
                                                                  ": lower it (flashbox probe --model DIR prints the plan)"
                                                            : "the model does not fit in HBM with every expert resident: pass --expert-slots N "
                                                              "(flashbox probe --model DIR prints the plan)");
      return m.status();
    }
    return std::unique_ptr<model::Executor>(std::move(m).value());
#else
    return FB_ERROR(kUnsupported) << "this build has no CUDA executor (configure with the cuda preset on a machine with the "
                                     "CUDA toolkit), use --backend cpu";
#endif
  }
  return FB_ERROR(kInvalidArgument) << "unknown backend '" << backend << "' (cpu or cuda)";
}

}  // namespace fb::engine
