// The prefill chunk size from the HBM budget (issue 26): every byte one tensor-core prefill step of
// `rows` rows allocates on the GPU at a config's dimensions, and the largest chunk whose step fits
// a budget. The step arena is replayed buffer by buffer in the backbone's op order with the
// CUDA Arena's rules (cuda/layer_ops.h: 256-byte rounding, frames that hand an op's temporaries
// to the next op), so its peak is the count of what CudaLayerOps, CudaStep and the grouped MoE
// allocate, not an estimate per row. tc_gemm's scratch slots (cuda/tc_gemm.cu, grown by 1/8 past
// the largest request), the session caches and RoPE tables the prompt grows are counted beside it.
// Pure arithmetic; `flashbox bench --cold-prefill` reserves the arena at the counted size and
// fails with a message naming the difference when the measured step goes past it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace fb::memory {

// One buffer of the count. Arena buffers held for the whole step (`held`) are summed over the
// layers that allocate them; an op's temporaries (`held` false) are its largest call's.
struct PrefillBuffer {
  std::string name;  // "op.buffer", e.g. "moe.xp", "step.X", "tc.slot3", "session.rope"
  uint64_t bytes = 0;
  bool held = false;
};

struct PrefillStepBytes {
  uint64_t step = 0;       // arena bytes held until the step ends (activations, selections, compressor outputs, uploads)
  uint64_t moe = 0;        // the MoE op's temporaries (its largest call)
  uint64_t attention = 0;  // the indexer's and attention's temporaries (their largest call)
  uint64_t arena_peak = 0; // the arena's high-water mark: the replay's largest held + open frame
  uint64_t tc = 0;         // outside the arena: tc_gemm's 8 scratch slots (+1/8 growth each) and cuBLASLt's workspace
  uint64_t session = 0;    // outside the arena: compressed caches (with a reallocation's old copy), rings, RoPE tables for `context`
  std::vector<PrefillBuffer> buffers;  // every buffer above, by name
  uint64_t arena() const { return arena_peak; }
  uint64_t total() const { return arena_peak + tc + session; }
};

// `rows` prefill rows of one session ending at position `context` (the prompt's length: the
// indexers score up to it from the first chunk on), rows starting at an even position.
PrefillStepBytes prefill_step_bytes(const model::Config& c, int64_t rows, int64_t context);

// The largest multiple of `quantum` rows (at most max_rows) whose step's total() fits
// `budget_bytes`; 0 when not even `quantum` rows fit. The arena is reserved at arena() before the
// first step (no growth slack: CudaExecutor::reserve_workspace), so nothing else is added here;
// the caller's budget already leaves its margin.
int64_t prefill_chunk_rows(const model::Config& c, uint64_t budget_bytes, int64_t context, int64_t max_rows = 65536, int64_t quantum = 2048);

// A `prompt`-token prompt in chunks of at most `max_rows`: the fewest chunks, of equal size rounded
// up to `quantum` (the last one shorter), e.g. 32,768 tokens with 26,624 rows at most: 2 x 16,384
// rather than 26,624 + 6,144 (each chunk copies every non-resident expert once, whatever its rows).
// 0 when max_rows is 0; the prompt itself when it fits in one chunk.
int64_t prefill_balanced_chunk(int64_t max_rows, int64_t prompt, int64_t quantum = 2048);

// The budget the bench sizes a chunk from: free HBM once the model, slots and prefetch staging
// exist, minus a margin of `margin_bytes` + `margin_frac` of the device's total (allocator
// granularity, cuBLASLt's own buffers, what the count does not see); 0 when the margin takes it all.
uint64_t prefill_budget_from_free(uint64_t free_bytes, uint64_t total_bytes, uint64_t margin_bytes = 2ull << 30, double margin_frac = 0.02);

// Cold prefill of a `prompt`-token prompt in chunks of `chunk` rows (issue 26; `flashbox probe`
// prints it, `bench --cold-prefill` measures it): every chunk routes to every expert, so each of
// the n_layers layers copies its experts - slots non-resident experts (expert_bytes each) per
// chunk, at h2d_bytes_per_s x copy_efficiency (a prefetch copies each expert as a few separate
// pieces). A layer step of n rows whose middle sits at position p computes for
//   fixed_ms + row_us x n / 1000 + ctx_ns x n x p / 1e9 ms
// (fixed: the expansion of every expert a chunk reaches, the routing's download and the host's
// tables; per row: GEMMs and the small ops; the attention and the indexers grow with the
// position). Serial: per layer step its copies, then its compute. Streamed (the next layer's
// experts copied during this layer's compute): per layer step the longer of the compute and the
// copies + exposed_copy_ms (what of a copy-bound step is not hidden: the wait between the last
// copy and the kernels that read it). Replay (bounded replay, the CED schedule; decoder_start > 0):
// the layers before decoder_start as streamed, the decoder layers over the prompt's last `window`
// rows only, each step the longer of its compute and its copies. The decoder layers' copies: with
// `replay_stages_all` (what the CUDA executor does: a layer's prefetch runs before its routing is
// known and stages every non-resident expert) the same as a streamed layer's, else only the
// window's distinct experts under uniform routing, experts (1 - (1 - top_k / experts)^rows),
// (experts - slots) / experts of them not resident (what a prefetch that follows the routing
// could reach).
struct ColdPrefillCompute {
  double fixed_ms = 0;         // per layer step, whatever its rows
  double row_us = 0;           // per row and layer step
  double ctx_ns = 0;           // per row, layer step and token of position (attention, indexers)
  double exposed_copy_ms = 0;  // per streamed layer step that waits on its copies
  double copy_efficiency = 1;  // the prefetch's copy rate as a share of the measured pinned H2D rate
  double layer_ms(double rows, double mid_position) const {
    return fixed_ms + row_us * rows * 1e-3 + ctx_ns * rows * mid_position * 1e-6;
  }
};

// Measured on the H200 (session 25; docs/bench/h200-s25-cold-prefill-*): released dims, 384
// experts, 128 slots, uniform routing. At 6d4a185 (`tools/device_cold_prefill.sh 8192,32768,131072
// 0` with FB_TRACE=1 FB_REPLAY=1) the 32K and 128K prompts (16,384-row chunks) are compute-bound:
// 139.70 and 150.26 ms per layer step at mean positions 16,384 and 65,536, which gives ctx_ns; the
// traced 8K chunk's kernels + routing downloads (72.9 + 12.7 ms per layer step (medians),
// copy-bound at 97.9 ms against 93.5 ms of copies) give the 8,192-row compute, hence fixed_ms (and
// row_us 6.23); exposed_copy_ms is that run's step minus its copies; copy_efficiency the copies'
// 51.3-51.7 GB/s against the 55.1 GB/s pinned peak of the same runs. Checked out of sample on
// 16K / 64K / 96K prompts (one 16,384-row chunk, 3 x 22,528, 5 x 20,480): measured / plan 0.91 /
// 1.05 / 1.03 streamed, 0.94 / 1.08 / 1.07 with bounded replay. Then 881f21b took two per-row
// costs off the step (the router's dots on tensor cores, hc_post by 16-byte vectors): row_us
// refitted on its 32K run (127.55 ms per layer step), the rest unchanged.
// `flashbox probe --prefill-layer-ms / --prefill-row-us` override fixed_ms / row_us.
inline constexpr ColdPrefillCompute kColdPrefillH200{34.1, 5.49, 0.0131, 4.4, 0.933};

struct ColdPrefillEstimate {
  int64_t chunks = 0;
  double serial_s = 0, streamed_s = 0, replay_s = 0;  // replay_s 0 without a decoder
  double copy_s = 0;                                  // one chunk's copies (every layer)
};
ColdPrefillEstimate cold_prefill_estimate(int64_t prompt, int64_t chunk, int n_layers, int decoder_start, int64_t window, int experts, int slots,
                                          int top_k, double expert_bytes, double h2d_bytes_per_s, const ColdPrefillCompute& compute,
                                          bool replay_stages_all = false);

}  // namespace fb::memory
