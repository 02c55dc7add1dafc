// CudaExecutor: the whole forward pass on the GPU (backbone and DSpark draft), weights resident
// in HBM in their stored formats, per-session compact caches on the device. It mirrors
// cpu/executor.h class for class (CudaLayerOps in layer_ops.h, CudaStep in executor.cu,
// CudaDraftStep in draft.cu). The exact numerics class reproduces CpuModel's logits bit for bit;
// the fast class (the default) stays within the gates of docs/numerics.md.
// Never includes engine/server code; host bookkeeping (positions, ring slots, hashes) only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/expert_slots.h"
#include "cuda/ops.h"
#include "cuda/tc_gemm.h"
#include "cuda/vision.h"
#include "loader/snapshot.h"
#include "model/config.h"
#include "model/engram_constants.h"
#include "model/engram_staging.h"
#include "model/live_sessions.h"
#include "model/executor.h"
#include "model/rope.h"
#include "model/session_layout.h"
#include "model/weights.h"

namespace fb::cuda {

// A device ring of FP8 window rows (cpu::Ring): slot = pos % slots; positions kept on the host.
struct DevRing {
  int slots = 0;
  int row_bytes = 0;
  DeviceBuffer data;          // [slots, row_bytes]
  std::vector<int64_t> pos;   // position held by each slot, -1 = never written
  uint8_t* slot(int64_t p) const { return data.get<uint8_t>() + size_t(p % slots) * size_t(row_bytes); }
  const uint8_t* find(int64_t p) const { return p >= 0 && pos[size_t(p % slots)] == p ? slot(p) : nullptr; }
};

// Compressed KV + index keys of a KV-source layer (cpu::CompressedCache), grown on demand.
struct DevCompressed {
  int ratio = 0;
  int kv_bytes = 0, key_bytes = 0;
  int64_t n_entries = 0, capacity = 0;
  DeviceBuffer kv, keys;      // [capacity, kv_bytes], [capacity, key_bytes]
  DeviceBuffer tail;          // ratio 2: f32 [model::kTailSlots (pos % slots)][k, g][head_dim]
  std::vector<int64_t> tail_pos;  // ratio 2 (host): position held by each tail slot, -1 = none
};

class CudaSession;

// The live sessions of one CudaExecutor, for its memory ledger (stats()), as cpu::SessionRegistry:
// add/remove lock; totals() reads the sessions' buffer sizes, so call it where no step changes them
// (the thread that runs the steps).
class CudaSession;
// The CUDA executor's live sessions (model::LiveSessions) and their totals.
class CudaSessionRegistry : public model::LiveSessions<CudaSession> {
 public:
  struct Totals {
    int64_t sessions = 0;
    uint64_t device_bytes = 0, host_bytes = 0;
  };
  Totals totals() const;
};

class CudaSession final : public model::SessionState {
 public:
  explicit CudaSession(const model::Config& c) : config_(&c) {}
  // Counts this session in `registry` until it is destroyed (CudaExecutor::new_session). A moved-to
  // CudaSession is not counted; an assigned-to one keeps its own registration.
  void track(std::shared_ptr<CudaSessionRegistry> registry);
  // Device bytes its buffers hold (window rings, compressed KV, index keys, ratio-2 tails, draft
  // rings; 0 until the first step allocates them), and the host bookkeeping beside them (token
  // history, image flags, ring and tail positions; vector capacities).
  uint64_t device_bytes() const;
  uint64_t host_bytes() const;
  // Device buffers are made on first use so an allocation failure travels as a Status.
  Status ensure_allocated(cudaStream_t st);
  Status reserve_compressed(int layer, int64_t entries, cudaStream_t st);
  Status rollback(int64_t p) override;
  int64_t n_pos() const override { return next_pos; }
  bool allocated() const { return allocated_; }

  int64_t next_pos = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> image;
  std::vector<DevRing> rings;          // per backbone layer, window + model::kRingHeadroom slots
  std::vector<DevCompressed> comp;     // per backbone layer
  std::vector<DevRing> draft_rings;    // per draft stage, window slots

 private:
  const model::Config* config_;
  bool allocated_ = false;
  model::LiveTracker<CudaSession> tracker_;
};

// Device copies of one layer's weights (model::LayerWeights), stored formats kept.
struct DevLayer {
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  const uint16_t *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
  const float* attn_sink = nullptr;
  Fp8W wq_a, wq_b, wkv, wo_b;
  const uint16_t* wo_a = nullptr;  // bf16 [o_groups * o_lora_rank, o_group_in]: the reference holds BF16
  Fp8W wo_a8;                      // [fast] the same weight as stored in the checkpoint (CudaRunOptions::wo_a_fp8)
  const uint16_t *comp_wkv = nullptr, *comp_wgate = nullptr, *comp_norm = nullptr;
  const uint16_t *idx_wk = nullptr, *idx_k_norm = nullptr, *idx_weights_proj = nullptr;
  Fp8W idx_wq_b;
  const uint16_t* gate_w = nullptr;
  const float *gate_bias = nullptr, *gate_bias_vl = nullptr;
  Fp8W sh_w1, sh_w2, sh_w3;
  Fp4W w1, w2, w3;  // every routed expert of the layer, contiguous
  const uint8_t *engram_table = nullptr, *engram_table_scale = nullptr;
  Fp8W engram_wkv;
  const uint16_t *engram_q = nullptr, *engram_k = nullptr;
};

struct DevDraft {
  Fp8W main_proj;
  const uint16_t *main_norm = nullptr, *norm = nullptr, *markov_embed = nullptr, *markov_head = nullptr, *confidence = nullptr;
};

// cos/sin of model::RopeTable for positions [0, n_pos), grown on demand (host std::cos/sin).
struct DevRope {
  model::RopeTable table;
  int64_t n_pos = 0;
  DeviceBuffer cos, sin;  // f32 [capacity, rope_dim / 2]
  int64_t capacity = 0;
  Status ensure(int64_t n, cudaStream_t st);
};

// Per-step scratch reused from step to step: a device buffer and a pinned host staging buffer,
// bump-allocated by one step at a time (cuda/executor.cu Arena) and grown between steps to the
// high-water mark, so a warmed-up decode step makes no cudaMalloc/cudaFree and its small index
// uploads are truly asynchronous.
struct StepWorkspace {
  DeviceBuffer dev;
  size_t dev_high = 0;
  void* pinned = nullptr;
  size_t pin_cap = 0, pin_high = 0;
  bool busy = false;
  bool capturing = false;  // the stream is being captured into a CUDA graph: no syncs, no downloads
  bool sm_uploads = false;  // CudaRunOptions::sm_uploads: staged uploads copied by a kernel (copy_from_pinned)
  bool reuse_staging = true;  // CudaRunOptions::reuse_staging: Arena::drained restarts the page-locked staging
  bool pinned_ids = true;     // CudaRunOptions::pinned_ids: the routing's ids come back through `down`
  void* down = nullptr;       // page-locked landing of the downloads the host waits for (CudaLayerOps::download_synced)
  size_t down_cap = 0;
  StepWorkspace() = default;
  StepWorkspace(const StepWorkspace&) = delete;
  StepWorkspace& operator=(const StepWorkspace&) = delete;
  ~StepWorkspace() {
    if (pinned) cudaFreeHost(pinned);
    if (down) cudaFreeHost(down);
  }
};

// Per-op GPU time (CUDA events around each sublayer op of a step), for `flashbox bench --profile`.
struct OpProfile {
  double ms = 0;
  int64_t calls = 0;
};

// Where the Engram tables live (spec/12: 189 GiB in the release, more than any one GPU).
enum class EngramPlace {
  kAuto,  // HBM up to kEngramHbmMaxBytes of tables, the host (mapped snapshot) beyond
  kHbm,
  kHost,  // each step gathers its rows on the host (the hashes are host math) and uploads them
};
constexpr uint64_t kEngramHbmMaxBytes = uint64_t(16) << 30;

// The numerics class of the CUDA executor (CLARIFICATIONS "Numerics classes", docs/numerics.md).
enum class Numerics {
  kExact,  // bit-identical to the CPU reference executor: the validation mode
  kFast,   // [fast] the default: tensor-core prefill, fast GEMVs for decode/verify/draft rows (any
           // fixed order, FMA); deterministic and row-invariant, tolerance-gated against the CPU
};
const char* numerics_name(Numerics n);
Result<Numerics> parse_numerics(const std::string& s);

// Run-time choices of the CUDA executor, set from the command line (never the environment).
// Most are A/B switches of measured techniques; `numerics` decides the class and, for kExact,
// overrides every switch that would leave the CPU's bits (tensor-core prefill, mixes, GEMVs).
struct CudaRunOptions {
  Numerics numerics = Numerics::kFast;
  bool tc_prefill = true;             // tensor-core GEMMs for steps made only of prefill rows ...
  int64_t tc_prefill_min_rows = 64;   // ... of at least this many rows
  bool tc_hc_mixes = true;            // the mHC mix dots of those steps on tensor cores as well
  bool tc_route = true;               // ... and the router's dots (a bf16 matmul, f32 out; route_from_dots in ops.h)
  bool fast_gemv = true;              // kFast: decode/verify/draft GEMVs on the fast kernels (fast_gemv.h)
  bool fast_occupancy = true;         // ... compiled with a register cap for more warps per SM (same bits; A/B in docs/results.md)
  bool tc_gemv = true;                // ... FP8 / MXFP4 ones on the tensor-core kernels of tc_gemv.h (other bits, same guarantees; A/B in docs/results.md)
  bool tc_async_scales = true;        // ... their scales staged by cp.async beside the tile (same bits)
  bool tc_lean_smem = true;           // ... with shared memory sized by the launch's rows, raw MXFP4 scales (same bits; more CTAs per SM)
  bool tc_global_fold = true;        // ... split-K chunks folded by the last CTA through a per-stream workspace, not a cluster (same bits)
  int64_t tc_cluster_fold_ctas = 1000;  // ... except one-row launches of at most this many CTAs, folded through the cluster (same bits; 0: none)
  bool tc_lean_loop = true;          // ... MXFP4: tile loops without divisions, mma on pre-staged activations, scales by a shift (same bits)
  int64_t tc_stripes = 4;            // ... MXFP4 rows grouped by expert (verify, draft, sessions): a CTA runs up to this many 16-row stripes, the next one's tile copied while this one computes (same bits; 0/1: one)
  bool fast_index = true;            // kFast decode rows: the indexer's q.k dots on tensor cores (fast_attention.h fast_index_scores)
  bool group_expert_rows = true;      // ... steps of several tokens: rows sharing an expert share its MXFP4 reads (same bits)
  bool fast_small = true;             // kFast: fused small ops of decode rows (fast_small.h: mHC site, hc_post in place, norm/quant)
  bool pdl = true;                    // kFast: programmatic dependent launch of the fast kernels (pdl.cuh)
  bool overlap = true;                // kFast: a second stream for independent decode work (shared expert, window KV chain)
  bool fp8_fma = true;                // exact FP8 GEMV: product and add as one FMA (same bits either way)
  bool fast_attn = true;              // kFast: attention of steps of <= 64 rows on the tensor-core kernels of fast_attention.h
  int attn_heads_per_cta = 16;        // kFast: heads per tile CTA of fast_attention.h (1..16; fewer = more CTAs per row)
  bool attn_fuse_rope = true;         // kFast: those kernels rotate q on load and un-rotate o (no RoPE launches; same bits)
  bool wo_a_fp8 = true;               // kFast: decode rows' grouped wo_a from its FP8 copy (tc_fp8_bf16x_gemv; the copy is made at load when on)
  bool attn_split = true;             // attention: split a few rows' keys over several CTAs
  bool attn_predequant = true;        // ... and dequantise each key tile once per step
  bool bounded_replay = true;         // accept Row::replay_start (CUDA SWA bounded replay; IDENTICAL to the CPU's on the H200, 2026-12-01)
  // Launches off the decode step's critical path (issue 19; the same bits, tests in
  // cuda_fast_numerics_test and cuda_fast_small_test; A/B in docs/results.md):
  bool defer_hc_post = true;          // kFast: a site's hc_post runs inside the next site's partial kernel (fast_small.h FastHcPost)
  bool defer_combine = true;          // kFast, with defer_hc_post: the MoE combine of a deferred FFN-site hc_post runs inside it too
  bool fp4_early_tiles = true;        // kFast: the routed w2 GEMV copies its expert tiles before its PDL wait
  bool early_uploads = true;          // decode / verify steps: every layer's window and ring tables in one copy at the step's start
  bool markov_step = true;            // DSpark drafts: a chain token's Markov bias, argmax and confidence in one launch (same bits; both classes)
  int rs_gemv = 0;                    // kFast: the register-streamed GEMVs of rs_gemv.h: 0 off, 1 FP8 and resident MXFP4 experts, 2 FP8 only (off until an A/B wins at one row and at verify rows; packed weight copies made on first use)
  int rs_group_rows = 4;              // with rs_gemv: MXFP4 rows grouped by expert, up to 4 or 8 a CTA (the same bits)
  int rs_group_ctas = 8;              // with rs_gemv: CTAs per stripe of a grouped MXFP4 launch, 1..64 (the same bits)
  bool dequant_x32 = true;            // kFast prefill: MXFP4 experts expanded to bf16 by 32-blocks (tc_gemm.h set_tc_dequant_x32; the same bits)
  bool reuse_staging = true;          // a step's page-locked upload staging used again from its start after each host sync of the stream (the routing's): a prefill chunk's key tables then stay staged (asynchronous) instead of overflowing into pageable copies that block the host behind the expert prefetch; the same bytes
  bool pinned_ids = true;             // a tiered MoE's expert ids downloaded through page-locked memory (CudaLayerOps::download_synced; its own effect not yet measured apart); the same ids
  bool sm_uploads = true;             // in steps that stream experts a layer ahead (expert_prefetch), the step's staged host tables reach the GPU through a kernel reading page-locked memory instead of the copy engines, where they queued behind the layer's expert copies (32K cold prefill 2,262 -> 2,757 tok/s); the same bytes
  // Engram tables on the host (EngramPlace::kHost, the release's 189 GiB): threads that copy each
  // step's rows out of the mapped tables (page faults, i.e. drive reads, in flight together) from
  // the moment its ids are hashed, while the layers before the Engram layers are issued and run
  // (model::EngramStaging, as the CPU executor); 0: each Engram layer copies its rows on the
  // step's issue path. The same bytes reach the same kernels: the same bits.
  int engram_prefetch_tasks = 4;
  // Cold prefill with tiered experts (issue 26, docs/tiers.md "Streaming experts during prefill"):
  // steps of at least expert_prefetch_min_rows rows copy the next tiered layer's non-resident
  // experts into a staging buffer (two, alternating) on a second copy stream while this layer
  // computes. Only copy timing changes: the same bytes reach the same kernels (same bits, either
  // numerics class). Off until measured on the H200.
  bool expert_prefetch = false;
  int64_t expert_prefetch_min_rows = 1024;
  int expert_prefetch_entries = 0;    // experts per staging buffer; 0: a layer's experts minus its slots
  // Cold experts computed on the host CPU where their bytes are (issue 22, docs/tiers.md), in
  // decode / verify / draft steps of tiered layers, through the executor's HostExpertCompute
  // (set_host_experts): 0 off; 1 the misses split between copies and the host, coldest first,
  // while that shortens the longer queue (DevExpertSlots::take_host: a copy at 50 GB/s against
  // host_compute_us, or the host's time a pair as measured in the run's host batches, from its
  // rate measured once alone: DevExpertSlots::host_pair_ms); 2 every miss on the host (no copies: the
  // validation mode). [exact] in the exact class (the host runs the CPU reference, which that
  // class equals bit for bit). In the fast class a row's bits then depend on which of its experts
  // the host ran (the cache's state): [approx-approved] pending a quality measurement. Off until
  // measured on the H200.
  int host_compute = 0;
  int64_t host_compute_us = 0;        // the host's time for one (row, expert) pair the split assumes; 0: measured
  // Next-layer expert prediction (issue 22, docs/tiers.md "Copies ahead of a predicted use"): in
  // decode / verify / draft steps (GEMV path), a tiered layer's router launch is followed by the
  // next tiered layer's gate applied to this layer's expert input (same routing arithmetic, own
  // buffers), downloaded with the routing; once this layer's copies and kernels are issued, the
  // predicted experts that are not resident are copied into that layer's slots on the copy stream
  // (DevExpertSlots::predict, at most expert_predict_max a call, the most guessed first), beside this layer's compute and
  // the next layer's attention. Only which slot holds which bytes, and when, changes: the same
  // bits ([exact], cuda_fixture_parity_test ExpertPredictBitForBit). Off until measured on the H200.
  bool expert_predict = false;
  int expert_predict_max = 16;
};
// name=value for the bench's interleaved A/B (`--ab NAME=a,b`) and `--cuda-opt NAME=VALUE`; several
// options at once as NAME1+NAME2 = V1+V2 (all set or none):
// numerics=exact|fast, tc_prefill, tc_prefill_min_rows, tc_hc_mixes, tc_route, fast_gemv, fast_occupancy, tc_gemv, fast_small, pdl, overlap,
// fp8_fma, fast_attn, attn_heads_per_cta (1..16), attn_fuse_rope, wo_a_fp8, tc_async_scales, tc_lean_smem, tc_global_fold, tc_lean_loop, fast_index, group_expert_rows, attn_split, attn_predequant, bounded_replay,
// expert_prefetch, defer_hc_post, defer_combine, fp4_early_tiles, early_uploads, markov_step, dequant_x32, reuse_staging, pinned_ids, sm_uploads (booleans 0/1), tc_cluster_fold_ctas (>= 0), tc_stripes (0..64), expert_prefetch_min_rows (>= 1),
// expert_prefetch_entries (>= 0), engram_prefetch_tasks (0..64), rs_gemv (0, 1 or 2), rs_group_rows (4 or 8), rs_group_ctas (1..64),
// host_compute (0, 1 or 2), host_compute_us (>= 0), expert_predict (0/1), expert_predict_max (1..1024).
Status set_run_option(CudaRunOptions& o, const std::string& name, const std::string& value);

// Load-time choices of the CUDA executor.
struct CudaLoadOptions {
  CudaRunOptions run;
  EngramPlace engram = EngramPlace::kAuto;
  // Routed experts per layer held in HBM slots (cuda/expert_slots.h); 0: every expert resident.
  // A layer with no more experts than slots is filled once and never misses.
  int expert_slots = 0;
  storage::EvictionPolicy policy = storage::EvictionPolicy::kLfu;
  // Staging slots per tiered layer for LFU admission (DevExpertSlots::create); 0: admit every miss.
  int expert_staging = 0;
  // LFU aging of the slot caches: counts halve every lfu_aging x slots lookups of a layer. 64:
  // measured on the H200 sweep, hit rates within 2 points of the best static placement at 45-60%
  // skew (8: 4-5 points below), docs/tiers.md; a shorter window follows drifting routing faster.
  int lfu_aging = 64;
  // Where missing experts are read from; null: the snapshot's own (mapped) expert tensors.
  std::shared_ptr<const model::ExpertSource> experts;
  // Where CudaRunOptions::host_compute runs a tiered layer's chosen misses (the engine, the bench
  // and check-fixture hand in cpu::host_expert_compute(); null: host_compute does nothing).
  std::shared_ptr<const model::HostExpertCompute> host_compute;
  // Engram table rows from a drive-backed row cache (storage::EngramRowCache, issue 22) instead of
  // the mapped tables; set, the tables stay on the host whatever `engram` says (EngramPlace::kHost).
  std::shared_ptr<const model::EngramRowSource> engram_rows;
};

class CudaExecutor final : public model::Executor {
 public:
  // Same contract as cpu::CpuModel::load: validates the snapshot, then uploads every weight.
  static Result<std::unique_ptr<CudaExecutor>> load(const std::string& dir, std::vector<int32_t> token_map = {}, CudaLoadOptions opt = {});
  // The same from an opened (possibly in-memory, synthetic) snapshot.
  static Result<std::unique_ptr<CudaExecutor>> from_snapshot(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map = {},
                                                             CudaLoadOptions opt = {});
  ~CudaExecutor() override;

  const model::Config& config() const override { return cfg_; }
  const char* name() const override { return "cuda"; }
  // Counted in stats()' memory ledger while it lives.
  std::unique_ptr<model::SessionState> new_session() const override {
    auto s = std::make_unique<CudaSession>(cfg_);
    s->track(sessions_);
    return s;
  }
  Result<model::StepOutput> forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                    model::Taps* taps = nullptr) override;
  Status draft_commit(model::SessionState& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) override;
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) override;
  // Several sessions' draft blocks in shared steps of up to 64 rows (draft.cu): the draft stages'
  // weights read once per step instead of once per session; each block's bits as draft() alone.
  std::vector<Result<model::DraftOutput>> draft_many(const std::vector<model::DraftJob>& jobs) override;
  // The vision tower on the device (cuda/vision.cu), bit-identical to vision::VisionTower.
  Result<std::vector<uint16_t>> encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw,
                                             std::vector<uint16_t>* vit = nullptr) override;
  // From the host view of the weights (the span rows are assembled on the host).
  Result<std::vector<uint16_t>> image_span_markers() const override;
  // Session state as the CPU executor's bytes (docs/formats.md "Session state"; cuda/session_io.cu):
  // a state saved by either executor restores on the other at the same model.
  Result<std::string> save_session(const model::SessionState& s) const override;
  Status restore_session(model::SessionState& s, std::string_view bytes) const override;
  uint64_t identity() const override { return model_id_; }
  double last_enqueue_ms() const override { return last_enqueue_ms_; }

  // Tensor-core prefill: 2,048-row steps (the routed experts' weights are expanded once per
  // step, and the GEMMs reach ~80% of the BF16 rate from 2K rows, docs/history.md).
  int64_t preferred_prefill_chunk() const override { return tc_on_ ? 2048 : 256; }
  // SWA bounded replay (Row::replay_start): rows below it leave at Config::decoder_start. On by
  // default since the H200 run of 2026-12-01 showed it equal to the CPU's replay bit for bit
  // (cuda_fixture_parity_test BoundedReplayMatchesCpu); CudaRunOptions::bounded_replay = 0 refuses such rows.
  bool bounded_replay_enabled() const { return run_.bounded_replay; }
  bool supports_bounded_replay() const override { return bounded_replay_enabled() && cfg_.decoder_start >= 0; }
  // The run-time options (numerics class and switches); set_run_options applies from the next step.
  const CudaRunOptions& run_options() const { return run_; }
  void set_run_options(const CudaRunOptions& o);
  cudaStream_t stream() const { return stream_; }
  // Profiling: when on, every step records CUDA events around its ops (adds a little overhead);
  // entries "<op>" sum GPU ms over layers and steps, "step.gpu" / "step.wall" whole steps.
  void set_profile(bool on) { profile_ = on; }
  // Per-kernel times too ("k:<op>/<kernel>", launch gaps included; see kprof_begin).
  void set_kernel_profile(bool on) { kernel_profile_ = on; }
  // While on, a step issues no stream synchronisation and no downloads (its outputs come back
  // empty), so the caller can capture it into a CUDA graph (bench: launch-free step time).
  void set_graph_capture(bool on) { ws_.capturing = on; }
  const std::map<std::string, OpProfile>& profile() const { return prof_; }
  void clear_profile() { prof_.clear(); }
  // Tensor-core GEMMs (tc_gemm.h, [reference-defining]) for steps made only of prefill rows, at
  // least min_rows of them (CudaRunOptions::tc_prefill; never in the exact class).
  void set_tensor_core_prefill(bool on, int64_t min_rows = 64) {
    run_.tc_prefill = on;
    run_.tc_prefill_min_rows = std::max<int64_t>(1, min_rows);
    set_run_options(run_);
  }
  bool tensor_core_prefill() const { return tc_on_; }
  // The mHC mix dots of those steps on tensor cores as well (f32 weights split exactly into three
  // bf16 parts). Off: the exact CUDA-core mixes inside tensor-core prefill.
  void set_tc_hc_mixes(bool on) {
    run_.tc_hc_mixes = on;
    set_run_options(run_);
  }
  // The GEMM work of one prefill chunk of `rows` rows through layer `layer`'s weights on the
  // tensor-core path (operand expansion included), each GEMM timed alone (median of `reps`):
  // the bench's "share of the tensor-core roofline for the GEMM work" (issue 7).
  struct GemmTiming {
    std::string name;
    double flops = 0;  // 2 M N K summed over the GEMM's calls
    double ms = 0;
  };
  Result<std::vector<GemmTiming>> time_prefill_gemms(int64_t rows, int layer, int reps);

  // The HBM expert tier (null when every expert is resident): hit/miss and copy counters, and
  // pin_host() for a source whose bytes should copy at the pinned rate.
  // Shared so that counters can be read after the executor is gone (check-fixture).
  std::shared_ptr<DevExpertSlots> expert_slots() const { return slots_; }
  // CudaLoadOptions::host_compute, replaced (tests).
  void set_host_experts(std::shared_ptr<const model::HostExpertCompute> h) { host_experts_ = std::move(h); }
  // Expert traffic by tier (issue 24) from the host-side counters: HBM slot hits, then each miss
  // at the tier its copy came from (the host tiers' counters when the source keeps them, else
  // host memory). Op times by family only while profiling (set_profile: CUDA events around each
  // backbone op, summed on the device clock after each step; ops only enqueue, so a host clock
  // would time launches). Engram rows: gathered on the host and uploaded inside the step when the
  // tables stay on the host (exposed), read in place by the gather kernel when they are in HBM.
  // Memory by tier: memory_by_tier().
  model::ExecutorStats stats() const override {
    model::ExecutorStats st;
    st.has_op_times = profile_;
    if (profile_) st.ops = op_times_;
    st.has_engram = !engram_.empty();
    st.engram = engram_rows_;
    bool drives = false;
    if (slots_) {
      const ExpertSlotStats d = slots_->stats();
      st.has_expert_traffic = true;
      st.experts.hbm = {d.hits, d.hits * uint64_t(slots_->layout().total())};
      model::ExpertTraffic src;
      drives = slots_->source().traffic(&src);
      if (drives) {
        st.experts.host = src.host;
        st.experts.drive = src.drive;
      } else {
        st.experts.host = {d.misses, d.copied_bytes};
      }
    }
    st.memory = memory_by_tier(drives, st.experts.drive.bytes);
    return st;
  }
  // The memory ledger by tier (issue 24), summed from the buffers the executor holds as of the
  // call. HBM: `weights` the snapshot's tensors uploaded in their stored formats (routed experts
  // of tiered layers and Engram tables left on the host excepted; the FP8 wo_a too where the fast
  // class keeps it), `weight_copies` forms made at load (wo_a dequantised to BF16, the vision
  // tower's BF16 norm weights widened to f32), `sessions` the device caches of every live session
  // new_session() made (and their count), `scratch` what steps keep between them (the step
  // arena, RoPE cos/sin, the mHC site scratch, tensor-core GEMM scratch and cuBLASLt workspace,
  // the vision GELU table), `experts` the expert tier's slot arrays and prefetch staging buffers.
  // Host: `weights` the mapped tensors steps read (Engram tables left on the host; the tiered
  // layers' routed experts when misses are copied from the mapping; the image markers), the rest
  // of the mapping was read once by the upload; `sessions` their host bookkeeping; `scratch` the
  // page-locked upload staging and the RoPE and Engram hash tables; `experts` the host tiers'
  // buffers (model::ExpertSource::host_bytes). Drives (`drives`: the slots copy from host tiers
  // that read them): the expert bytes those tiers read. Not counted: tc_gemv's split-K fold
  // workspaces (process-wide, per stream, owned by tc_gemv.cu, not by an executor), a step's own
  // fallback buffers (freed when it returns), host ranges the bench page-locks in place.
  model::MemoryByTier memory_by_tier(bool drives, uint64_t drive_bytes_read) const;
  // Bench only (issue 9's skew sweep): rewrites a tiered layer's routing (ids [rows, top_k],
  // each row ascending and distinct, values < n_experts) before the slots are looked up. The
  // gate weights stay the router's, so outputs are noise; only traffic and timing are meaningful.
  using RouteOverride = std::function<void(int layer, std::vector<int32_t>& ids, int64_t rows, int top_k)>;
  void set_route_override(RouteOverride f) { route_override_ = std::move(f); }
  // Bench only, with CudaRunOptions::expert_predict: rewrites the prediction of `layer`'s routing
  // (ids [rows, top_k], as above) made during the tiered layer before it, so a sweep whose routing
  // the override draws can give the executor a guess of chosen accuracy (bench::TierSweepOptions).
  void set_predict_override(RouteOverride f) { predict_override_ = std::move(f); }
  const loader::Snapshot& snapshot() const { return *snap_; }
  // The step arena (StepWorkspace): bytes held now, and the largest step's high-water mark
  // (the bench sets the prefill chunk from free HBM and checks memory::prefill_step_bytes).
  uint64_t workspace_bytes() const { return ws_.dev.bytes(); }
  uint64_t workspace_high_bytes() const { return ws_.dev_high; }
  // Issue 26 (bench --cold-prefill): the arena made exactly `bytes` long before a step whose
  // buffers were counted (memory::prefill_step_bytes(...).arena()), with its high-water mark
  // restarted, so the step neither allocates per op nor grows the arena by 25% afterwards; a
  // failure is a Status (the CUDA error cleared), not an error of the next launch.
  Status reserve_workspace(uint64_t bytes);
  // Frees the arena and tc_gemm's scratch slots (both grow again on the next step).
  void release_step_memory();
  uint64_t tc_scratch_bytes() const;

 private:
  friend class CudaLayerOps;
  friend class CudaStep;
  friend class CudaDraftStep;
  CudaExecutor(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map);
  // What a buffer of owned_ holds, for the memory ledger (memory_by_tier).
  enum class Held : uint8_t {
    kWeights,     // a snapshot tensor in its stored format
    kWeightCopy,  // a form made at load from a stored tensor (dequantised, widened)
    kTable,       // a table computed at load (the vision GELU table)
  };
  struct Owned {
    DeviceBuffer buf;
    Held held = Held::kWeights;
  };
  Status upload_weights(const CudaLoadOptions& opt);
  template <typename T>
  Result<const T*> up(const TensorView& v, Held held = Held::kWeights);
  Result<Fp8W> up8(const model::Fp8Linear& l);
  Status up_experts(int layer, DevLayer& d);
  Status upload_vision();
  const DevRope& rope_for(int l) const { return cfg_.roles[size_t(l)].yarn() ? rope_yarn_ : rope_plain_; }

  std::unique_ptr<loader::Snapshot> snap_;
  model::Config cfg_;
  uint64_t model_id_ = 0;  // loader::model_identity, as the CPU executor's
  model::ModelWeights w_;
  std::vector<int32_t> token_map_;
  int32_t pad_class_ = 0;
  std::vector<model::EngramTableConstants> engram_;
  cudaStream_t stream_ = nullptr;
  std::vector<Owned> owned_;  // every weight buffer
  const uint16_t *embed_ = nullptr, *norm_ = nullptr, *head_ = nullptr;
  std::vector<DevLayer> layers_;
  DevDraft draft_;
  DevVision vision_;
  DevRope rope_plain_, rope_yarn_;
  mutable StepWorkspace ws_;
  // The tensor-core GEMM object (created on first use) and the policy of set_tensor_core_prefill.
  TcGemm* tc_for(const model::Step& step) const;
  // Whether `step` streams experts a layer ahead (CudaRunOptions::expert_prefetch: a prefill step
  // of enough rows with tiered layers); reserves the staging buffers on first use.
  bool prefetch_step(const model::Step& step) const;
  mutable bool prefetch_failed_ = false;
  mutable std::unique_ptr<TcGemm> tc_;
  // The options and what they resolve to (set_run_options): the exact class turns off every
  // technique that leaves the CPU's bits.
  CudaRunOptions run_;
  bool tc_on_ = true;
  // The fast class's GEMVs (fast_gemv.h) for decode / verify / draft rows.
  bool fast_gemv_ = true;
  // The fast class's fused small ops (fast_small.h) for steps of up to 64 rows, and the mHC site's
  // scratch (created on first use).
  bool fast_small_ = true;
  mutable double last_enqueue_ms_ = 0;  // CudaStep::take_output: host time of the last step before its sync
  bool fast_attn_ = true;
  bool attn_fuse_rope_ = true;
  bool wo_a_fp8_ = true;
  bool fast_index_ = true;
  bool group_rows_ = true;
  mutable DeviceBuffer fast_hc_scratch_;
  // Decode rows: independent work on side_ (forked and joined with events): the shared expert's
  // GEMVs beside the router and the routed experts, the window KV's norm/RoPE/QDQ beside the query
  // path (same kernels, same bits; the gaps of one chain filled by the other).
  bool overlap_ = true;
  bool defer_hc_post_ = true, defer_combine_ = true, fp4_early_tiles_ = true, early_uploads_ = true, markov_step_ = true;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  // The mHC mix dots of tensor-core prefill steps on tensor cores too (tc_hc_mixes,
  // [reference-defining]): +17-20% prefill tok/s on the H200, docs/history.md.
  bool tc_hc_mixes_ = true;
  bool tc_route_ = true;  // the router's dots of those steps on tensor cores (CudaRunOptions::tc_route)
  int64_t tc_min_rows_ = 64;
  bool profile_ = false, kernel_profile_ = false;
  mutable std::map<std::string, OpProfile> prof_;
  // Executor::stats: the backbone steps' op times by family (while profiling) and Engram rows.
  mutable model::OpTimes op_times_;
  mutable model::EngramRows engram_rows_;
  // Engram rows staged ahead from host tables by workers kept across steps (model/engram_staging.h;
  // forward() runs one step at a time).
  mutable model::EngramStaging engram_staging_;
  // Expert tier (CudaLoadOptions::expert_slots > 0): layers with fewer slots than experts read
  // their routed experts through it.
  std::shared_ptr<DevExpertSlots> slots_;
  std::shared_ptr<const model::HostExpertCompute> host_experts_;
  RouteOverride route_override_;
  RouteOverride predict_override_;
  // Engram tables left on the host (CudaLoadOptions::engram): DevLayer::engram_table is null and
  // the rows are gathered from w_'s mapped views.
  bool engram_host_ = false;
  std::shared_ptr<const model::EngramRowSource> engram_source_;  // CudaLoadOptions::engram_rows
  // Memory ledger: the live sessions new_session() made (shared: a session may outlive the
  // executor), and the bytes of the mapped tensors steps read on the host (upload_weights).
  std::shared_ptr<CudaSessionRegistry> sessions_ = std::make_shared<CudaSessionRegistry>();
  uint64_t host_weight_bytes_ = 0;
  bool tiered(int layer) const { return slots_ && slots_->slots(layer) > 0; }
};

// The name the engine's executor factory uses.
using CudaModel = CudaExecutor;

}  // namespace fb::cuda
