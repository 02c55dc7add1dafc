#include "bench/fake_context.h"

#include "cpu/session_cache.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace fb::bench {

namespace {

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return uint32_t(x ^ (x >> 33));
}

// Rows of `row_bytes`: the first `code_bytes` are codes (fp8 e4m3 with |v| <= 8, or packed fp4
// nibbles), the rest scale bytes set to `scale`.
__global__ void fill_rows_kernel(uint8_t* p, int64_t rows, int row_bytes, int code_bytes, bool fp4, uint8_t scale, uint64_t seed) {
  const int64_t n = rows * row_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int b = int(i % row_bytes);
    if (b >= code_bytes) {
      p[i] = scale;
      continue;
    }
    uint8_t v = uint8_t(hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)));
    if (!fp4) {
      const uint8_t e = (v >> 3) & 0xF;
      if (e > 10) v = uint8_t((v & 0x87) | ((e - 5) << 3));
    }
    p[i] = v;
  }
}

Status fill(uint8_t* p, int64_t rows, int row_bytes, int code_bytes, bool fp4, uint8_t scale, uint64_t seed, cudaStream_t st) {
  if (rows <= 0) return Status();
  fill_rows_kernel<<<1024, 256, 0, st>>>(p, rows, row_bytes, code_bytes, fp4, scale, seed);
  return cuda::cuda_status(cudaGetLastError(), "fill_rows_kernel");
}

}  // namespace

Status fill_fake_context(cuda::CudaExecutor& ex, cuda::CudaSession& s, int64_t L, uint64_t seed) {
  const model::Config& c = ex.config();
  cudaStream_t st = ex.stream();
  FB_RETURN_IF_ERROR(s.ensure_allocated(st));
  const int hd = c.head_dim, ihd = c.index_head_dim;
  for (size_t l = 0; l < s.rings.size(); ++l) {
    cuda::DevRing& r = s.rings[l];
    FB_RETURN_IF_ERROR(fill(r.data.get<uint8_t>(), r.slots, r.row_bytes, hd, false, 123, seed + l, st));
    for (int64_t q = std::max<int64_t>(0, L - r.slots); q < L; ++q) r.pos[size_t(q % r.slots)] = q;
  }
  for (size_t l = 0; l < s.comp.size(); ++l) {
    cuda::DevCompressed& cc = s.comp[l];
    if (!cc.ratio) continue;
    const int64_t n = L / cc.ratio;
    FB_RETURN_IF_ERROR(s.reserve_compressed(int(l), n, st));
    FB_RETURN_IF_ERROR(fill(cc.kv.get<uint8_t>(), n, cc.kv_bytes, hd / 2, true, 0x30, seed * 7 + l, st));
    FB_RETURN_IF_ERROR(fill(cc.keys.get<uint8_t>(), n, cc.key_bytes, ihd / 2, true, 124, seed * 11 + l, st));
    cc.n_entries = n;
    // The tails (zeros from allocation) count as the last positions' pending latents.
    if (cc.ratio == 2)
      for (int64_t q = std::max<int64_t>(0, L - cpu::kTailSlots); q < L; ++q) cc.tail_pos[size_t(q % cpu::kTailSlots)] = q;
  }
  for (cuda::DevRing& r : s.draft_rings) {
    FB_RETURN_IF_ERROR(fill(r.data.get<uint8_t>(), r.slots, r.row_bytes, hd, false, 123, seed + 99, st));
    for (int64_t q = std::max<int64_t>(0, L - r.slots); q < L; ++q) r.pos[size_t(q % r.slots)] = q;
  }
  s.tokens.resize(size_t(L));
  for (int64_t i = 0; i < L; ++i) s.tokens[size_t(i)] = int32_t((i * 2654435761ull + seed) % uint64_t(c.vocab_size));
  s.image.assign(size_t(L), 0);
  s.next_pos = L;
  return cuda::cuda_status(cudaStreamSynchronize(st), "fill_fake_context");
}

}  // namespace fb::bench

namespace fb::bench {

namespace {
double host_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Result<GraphStepTiming> time_graph_step(cuda::CudaExecutor& ex, model::SessionState& s, int reps) {
  const model::Config& c = ex.config();
  const int64_t L = s.n_pos();
  std::vector<model::SessionState*> ss{&s};
  model::Step step;
  model::Row row;
  row.pos = L;
  row.token = int32_t((L * 31) % c.vocab_size);
  row.kind = model::RowKind::kDecode;
  row.want_logits = true;
  step.rows.push_back(row);
  // Warm-up (grows the step workspace and the pinned staging to this step's size).
  for (int w = 0; w < 2; ++w) {
    FB_TRY(ex.forward(step, ss));
    FB_RETURN_IF_ERROR(s.rollback(L));
  }
  GraphStepTiming out;
  cudaStream_t st = ex.stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FB_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), "begin capture"));
  double t0 = host_ms();
  ex.set_graph_capture(true);
  auto r = ex.forward(step, ss);
  ex.set_graph_capture(false);
  const cudaError_t end = cudaStreamEndCapture(st, &graph);
  out.capture_ms = host_ms() - t0;
  if (!r.ok()) {
    if (graph) cudaGraphDestroy(graph);
    return r.status();
  }
  FB_RETURN_IF_ERROR(cuda::cuda_status(end, "end capture"));
  cudaGraphGetNodes(graph, nullptr, &out.nodes);
  t0 = host_ms();
  Status st_inst = cuda::cuda_status(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  out.instantiate_ms = host_ms() - t0;
  std::vector<double> times;
  cudaEvent_t a = nullptr, b = nullptr;
  if (st_inst.ok()) {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int k = 0; k < reps + 1 && st_inst.ok(); ++k) {
      cudaEventRecord(a, st);
      st_inst = cuda::cuda_status(cudaGraphLaunch(exec, st), "graph launch");
      cudaEventRecord(b, st);
      if (st_inst.ok()) st_inst = cuda::cuda_status(cudaStreamSynchronize(st), "graph replay");
      float ms = 0;
      if (st_inst.ok() && k > 0 && cudaEventElapsedTime(&ms, a, b) == cudaSuccess) times.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  if (exec) cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  FB_RETURN_IF_ERROR(st_inst);
  FB_RETURN_IF_ERROR(s.rollback(L));
  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    out.replay_ms = times[times.size() / 2];
  }
  return out;
}

}  // namespace fb::bench
