// fast_gemv_bench (fast_gemv.h): weight-streaming rates of the decode GEMVs at a few shapes and at
// the released decode shapes, CUDA-core against tensor-core kernels (split from fast_gemv.cu).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <vector>

#include "cuda/device.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_small.h"
#include "cuda/ops.h"
#include "cuda/rs_gemv.h"
#include "cuda/tc_gemv.h"

namespace fb::cuda {

// ---- micro-benchmark ------------------------------------------------------------------------------

namespace {

// Times `run(i)` (i = repeat index) with events; returns ms per call.
template <typename F>
Status time_ms(cudaStream_t st, int reps, F run, double* ms) {
  for (int i = 0; i < 3; ++i) FB_RETURN_IF_ERROR(run(i));
  cudaEvent_t a, b;
  FB_CUDA_TRY(cudaEventCreate(&a));
  FB_CUDA_TRY(cudaEventCreate(&b));
  FB_CUDA_TRY(cudaEventRecord(a, st));
  for (int i = 0; i < reps; ++i) FB_RETURN_IF_ERROR(run(i));
  FB_CUDA_TRY(cudaEventRecord(b, st));
  FB_CUDA_TRY(cudaEventSynchronize(b));
  float t = 0.0f;
  FB_CUDA_TRY(cudaEventElapsedTime(&t, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  *ms = double(t) / reps;
  return Status();
}

// ---- read probes (session 10's open question): what the H200 reads with no math at all ----------

// Every thread: 4 independent 16-byte non-coherent loads per step, grid-stride; the xor keeps the
// loads alive (stored only if it hits a value the fill cannot produce).
__global__ void read_stream_kernel(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += stride) acc ^= __ldg(p + i).x;
  if (acc == 0x12345678u) *sink = acc;
}

// The tc_gemv tile geometry without its math: CTA = (stripe of 16 rows, K chunk), 128 threads
// copy the [16][kc] tile with 16-byte cp.async and wait; one word read back.
__global__ void read_tile_kernel(const uint8_t* __restrict__ W, int64_t N, int K, int kc, int nk, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t tile[];
  const int64_t n0 = int64_t(blockIdx.x / nk) * 16;
  const int k0 = int(blockIdx.x % nk) * kc, len = min(kc, K - k0), upr = len / 16;
  for (int u = threadIdx.x; u < 16 * upr; u += blockDim.x) {
    const int r = u / upr, j = u % upr;
    const int64_t n = n0 + r < N ? n0 + r : N - 1;
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(tile + r * kc + j * 16));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(W + n * K + k0 + j * 16) : "memory");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  const uint32_t v = reinterpret_cast<const uint32_t*>(tile)[threadIdx.x];
  if (v == 0x12345678u) *sink = v;
}

Status read_probes(uint8_t* pool, size_t pool_bytes, cudaStream_t st) {
  DeviceBuffer sink;
  FB_RETURN_IF_ERROR(sink.alloc(64));
  int sms = 0;
  FB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // (1) the read-only roofline: the whole pool, 8 and 16 CTAs of 256 threads per SM
  for (int per_sm : {8, 16}) {
    double ms = 0.0;
    FB_RETURN_IF_ERROR(time_ms(st, 10,
                               [&](int) {
                                 read_stream_kernel<<<sms * per_sm, 256, 0, st>>>(reinterpret_cast<const uint4*>(pool), int64_t(pool_bytes / 16),
                                                                                  sink.get<uint32_t>());
                                 return cuda_status(cudaGetLastError(), "read_stream_kernel");
                               },
                               &ms));
    std::printf("read probe: stream %zu MB, %d CTAs/SM: %.1f us, %.0f GB/s\n", pool_bytes >> 20, per_sm, ms * 1e3, double(pool_bytes) / (ms * 1e-3) / 1e9);
  }
  // (1b) the same stream over one weight's bytes (rotating through the pool: never an L2 hit), 4
  // CTAs of 256 threads per SM: what one launch of that size can read at best
  for (int64_t mb : {6, 12, 42}) {
    const int64_t bytes = mb << 20, slices = int64_t(pool_bytes) / bytes;
    double ms = 0.0;
    FB_RETURN_IF_ERROR(time_ms(st, 50,
                               [&](int i) {
                                 read_stream_kernel<<<sms * 4, 256, 0, st>>>(reinterpret_cast<const uint4*>(pool + (i % slices) * bytes), bytes / 16,
                                                                             sink.get<uint32_t>());
                                 return cuda_status(cudaGetLastError(), "read_stream_kernel");
                               },
                               &ms));
    std::printf("read probe: stream %lld MB per launch: %.1f us, %.0f GB/s\n", (long long)mb, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9);
  }
  // (2) the tile geometry alone at the released decode shapes (chunks as tc_chunks), back to back
  struct Shape { const char* name; int64_t N, K; };
  for (Shape c : {Shape{"wq_b", 32768, 1280}, Shape{"wo_b", 5120, 8192}, Shape{"shared w2", 5120, 2304}, Shape{"wq_a", 1280, 5120}}) {
    const TcChunks ch = tc_chunks(c.K, false);
    const int64_t bytes = c.N * c.K, slices = int64_t(pool_bytes) / bytes, grid = (c.N + 15) / 16 * ch.nk;
    const size_t smem = size_t(16) * ch.kc;
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(&read_tile_kernel), smem));
    double ms = 0.0;
    FB_RETURN_IF_ERROR(time_ms(st, 50,
                               [&](int i) {
                                 read_tile_kernel<<<unsigned(grid), 128, smem, st>>>(pool + (i % slices) * bytes, c.N, int(c.K), ch.kc, ch.nk,
                                                                                     sink.get<uint32_t>());
                                 return cuda_status(cudaGetLastError(), "read_tile_kernel");
                               },
                               &ms));
    std::printf("read probe: tiles of %s (%lld MB, %lld CTAs of 16 x %d B): %.1f us, %.0f GB/s\n", c.name, (long long)(bytes >> 20), (long long)grid,
                ch.kc, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9);
  }
  std::fflush(stdout);
  return Status();
}

// The benches' buffers. Weights are slices of a pool larger than L2 (50 MB on the H200), a
// different slice per call, so every call streams from HBM. Values do not matter for speed: a byte
// pattern (finite e4m3 and e2m1 codes, e8m0 scales near 1); expert ids 0..7 twice.
struct BenchBuffers {
  static constexpr size_t kPoolBytes = size_t(1) << 30;
  static constexpr int64_t kMaxRows = 16, kMaxK = 8192, kMaxN = 32768;
  static constexpr int kExRows = 16 + 36;
  DeviceBuffer pool, scales, codes, qscales, out, ex;
  QuantBuf q;
  uint8_t *wp = nullptr, *sp = nullptr;  // pool and scales
  uint16_t* y = nullptr;                 // out
  Status init() {
    FB_RETURN_IF_ERROR(pool.alloc(kPoolBytes));
    FB_RETURN_IF_ERROR(scales.alloc(kPoolBytes / 16));
    FB_CUDA_TRY(cudaMemset(pool.get(), 0x3A, kPoolBytes));
    FB_CUDA_TRY(cudaMemset(scales.get(), 0x7F, kPoolBytes / 16));
    FB_RETURN_IF_ERROR(codes.alloc(kMaxRows * kMaxK));
    FB_RETURN_IF_ERROR(qscales.alloc(kMaxRows * kMaxK / 32 * 4));
    FB_CUDA_TRY(cudaMemset(codes.get(), 0x38, kMaxRows * kMaxK));
    FB_CUDA_TRY(cudaMemset(qscales.get(), 0x3C, kMaxRows * kMaxK / 32 * 4));  // 0x3C3C3C3C: a normal f32 (~0.0115)
    FB_RETURN_IF_ERROR(out.alloc(size_t(2) * kMaxRows * kMaxN * 2));             // two outputs of up to kMaxN columns
    // expert ids: 0..7 twice, then (rs bench) 36 rows of 6 tokens over the 8 experts
    int32_t experts[kExRows];
    for (int i = 0; i < kExRows; ++i) experts[i] = i < 16 ? i % 8 : ((i - 16) * 5 + (i - 16) / 6) % 8;
    FB_RETURN_IF_ERROR(ex.alloc(sizeof(experts)));
    FB_CUDA_TRY(cudaMemcpy(ex.get(), experts, sizeof(experts), cudaMemcpyHostToDevice));
    q = QuantBuf{codes.get<uint8_t>(), qscales.get<float>(), kMaxRows * kMaxK};
    wp = pool.get<uint8_t>();
    sp = scales.get<uint8_t>();
    y = out.get<uint16_t>();
    return Status();
  }
};

}  // namespace

Status fast_gemv_bench() {
  BenchBuffers bb;
  FB_RETURN_IF_ERROR(bb.init());
  const size_t pool_bytes = BenchBuffers::kPoolBytes;
  const int64_t kMaxRows = BenchBuffers::kMaxRows;
  const DeviceBuffer& ex = bb.ex;
  const QuantBuf q = bb.q;
  uint8_t *wp = bb.wp, *sp = bb.sp;
  uint16_t* y = bb.y;
  cudaStream_t st = nullptr;
  constexpr int kReps = 50;
  FB_RETURN_IF_ERROR(read_probes(wp, pool_bytes, st));

  // FP8 N = K = 4096 (16 MB of weight per call), and N = 16384 (64 MB: less launch overhead).
  for (int64_t N : {4096, 16384}) {
    const int64_t K = 4096, wbytes = N * K, sbytes = (N / 32) * (K / 32);
    const int64_t slices = int64_t(pool_bytes) / wbytes;
    for (int64_t M : {1, 2, 4, 6, 8}) {
      for (bool fast : {true, false}) {
        double ms = 0.0;
        FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                   [&](int i) {
                                     const Fp8W w{wp + (i % slices) * wbytes, sp + (i % slices) * sbytes, N, K};
                                     return fast ? fast_fp8_gemv_q(q, M, w, y, st) : fp8_gemm_q(q, M, w, y, st);
                                   },
                                   &ms));
        std::printf("fp8 N=%lld K=%lld M=%lld %s: %.2f us, %.0f GB/s\n", (long long)N, (long long)K, (long long)M, fast ? "fast " : "exact",
                    ms * 1e3, double(wbytes + sbytes) / (ms * 1e-3) / 1e9);
      }
    }
  }
  // MXFP4 experts, D = 4096, I = 2048: w1 + w3 (gemv2, N = I, K = D) and w2 (N = D, K = I) for
  // one token's M routed rows (distinct experts of 8).
  {
    const int64_t D = 4096, I = 2048, eb = I * D / 2, esb = I * D / 32;  // bytes per expert matrix
    const int64_t set = 2 * 8 * (eb + esb), slices = int64_t(pool_bytes) / set;
    for (int64_t M : {1, 6}) {
      for (bool fast : {true, false}) {
        double ms13 = 0.0, ms2 = 0.0;
        auto wset = [&](int i, int which, int64_t N, int64_t K) {
          const int64_t base = (i % slices) * set + which * 8 * (eb + esb);
          return Fp4W{wp + base, wp + base + 8 * eb, N, K, eb, esb};
        };
        FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                   [&](int i) {
                                     const Fp4W a = wset(i, 0, I, D), b = wset(i, 1, I, D);
                                     return fast ? fast_fp4_gemv2_q(q, M, M, a, b, ex.get<int32_t>(), y, y + kMaxRows * 16384, st)
                                                 : fp4_gemm2_q(q, M, M, a, b, ex.get<int32_t>(), y, y + kMaxRows * 16384, st);
                                   },
                                   &ms13));
        FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                   [&](int i) {
                                     const Fp4W w2 = wset(i, 0, D, I);
                                     return fast ? fast_fp4_gemv_q(q, M, 1, w2, ex.get<int32_t>(), y, st)
                                                 : fp4_gemm_q(q, M, 1, w2, ex.get<int32_t>(), y, st);
                                   },
                                   &ms2));
        const double b13 = double(M) * 2 * (eb + esb), b2 = double(M) * (eb + esb);
        std::printf("fp4 experts D=%lld I=%lld M=%lld %s: w1+w3 %.2f us %.0f GB/s, w2 %.2f us %.0f GB/s\n", (long long)D, (long long)I,
                    (long long)M, fast ? "fast " : "exact", ms13 * 1e3, b13 / (ms13 * 1e-3) / 1e9, ms2 * 1e3, b2 / (ms2 * 1e-3) / 1e9);
      }
    }
  }
  // The released decode shapes (D = 5120, q_lora 1280, kv 512, 64 x 512 heads, o 8 x 1024, I = 2304),
  // CUDA-core kernels against the tensor-core ones (set_fast_gemv_tc), one line per shape and M.
  const bool tc_was = fast_gemv_tc();
  {
    DeviceBuffer ex64;
    FB_RETURN_IF_ERROR(ex64.alloc(64 * 4));
    int32_t e64[64];
    for (int i = 0; i < 64; ++i) e64[i] = i % 16;
    FB_CUDA_TRY(cudaMemcpy(ex64.get(), e64, sizeof(e64), cudaMemcpyHostToDevice));
    struct Fp8Case { const char* name; int64_t Na, Nb, K; };
    for (Fp8Case c : {Fp8Case{"wq_a+wkv", 1280, 512, 5120}, Fp8Case{"wq_b", 32768, 0, 1280}, Fp8Case{"wo_b", 5120, 0, 8192},
                      Fp8Case{"shared w1+w3", 2304, 2304, 5120}, Fp8Case{"shared w2", 5120, 0, 2304}}) {
      const int64_t K = c.K, KB = K / 32, ba = c.Na * K, bb = c.Nb * K, sa = ((c.Na + 31) / 32) * KB, sb = ((c.Nb + 31) / 32) * KB;
      const int64_t set = ba + bb, slices = int64_t(pool_bytes) / set;
      for (int64_t M : {1, 6, 16}) {  // 16: two row groups (sessions), grid rows-first
        double ms[2] = {0.0, 0.0};
        for (int tc = 0; tc < 2; ++tc) {
          set_fast_gemv_tc(tc == 1);
          FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                     [&](int i) {
                                       const int64_t o = (i % slices) * set;
                                       const Fp8W a{wp + o, sp, c.Na, K}, b{wp + o + ba, sp + sa, c.Nb, K};
                                       return c.Nb ? fast_fp8_gemv2_q(q, M, a, y, b, y + kMaxRows * 16384, st) : fast_fp8_gemv_q(q, M, a, y, st);
                                     },
                                     &ms[tc]));
        }
        const double bytes = double(ba + bb + sa + sb);
        std::printf("decode fp8 %-13s M=%lld: cuda-core %.2f us %.0f GB/s | tc %.2f us %.0f GB/s\n", c.name, (long long)M, ms[0] * 1e3,
                    bytes / (ms[0] * 1e-3) / 1e9, ms[1] * 1e3, bytes / (ms[1] * 1e-3) / 1e9);
      }
    }
    const int64_t D = 5120, I = 2304, eb = I * D / 2, esb = I * D / 32, E = 16;
    const int64_t set = 3 * E * (eb + esb), slices = std::max<int64_t>(1, int64_t(pool_bytes) / set);
    auto wset = [&](int i, int which, int64_t N, int64_t K) {
      const int64_t base = (i % slices) * set + which * E * (eb + esb);
      return Fp4W{wp + base, wp + base + E * eb, N, K, eb, esb};
    };
    for (int64_t M : {6, 36}) {
      double ms13[3] = {0.0, 0.0, 0.0}, ms2[3] = {0.0, 0.0, 0.0};
      for (int tc = 0; tc < 3; ++tc) {  // 2: tensor cores with the rows grouped by expert
        set_fast_gemv_tc(tc >= 1);
        const bool grp = tc == 2;
        FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                   [&](int i) {
                                     return fast_fp4_gemv2_q(q, M, 6, wset(i, 0, I, D), wset(i, 1, I, D), ex64.get<int32_t>(), y,
                                                             y + kMaxRows * 16384, st, grp);
                                   },
                                   &ms13[tc]));
        FB_RETURN_IF_ERROR(time_ms(st, kReps, [&](int i) { return fast_fp4_gemv_q(q, M, 6, wset(i, 2, D, I), ex64.get<int32_t>(), y, st, grp); },
                                   &ms2[tc]));
      }
      const double b13 = double(M) * 2 * (eb + esb), b2 = double(M) * (eb + esb);
      std::printf("decode fp4 experts M=%lld: w1+w3 cuda-core %.2f us %.0f GB/s | tc %.2f us %.0f GB/s; w2 cuda-core %.2f us %.0f GB/s | tc %.2f us %.0f GB/s\n",
                  (long long)M, ms13[0] * 1e3, b13 / (ms13[0] * 1e-3) / 1e9, ms13[1] * 1e3, b13 / (ms13[1] * 1e-3) / 1e9, ms2[0] * 1e3,
                  b2 / (ms2[0] * 1e-3) / 1e9, ms2[1] * 1e3, b2 / (ms2[1] * 1e-3) / 1e9);
      std::printf("decode fp4 experts M=%lld, rows grouped by expert (16 experts): w1+w3 tc %.2f us, w2 tc %.2f us\n", (long long)M, ms13[2] * 1e3,
                  ms2[2] * 1e3);
    }
  }
  // The tensor-core kernels' chunk size and programmatic dependent launch (back-to-back calls
  // overlap their weight copies with the previous call's tail), M = 1.
  const bool pdl_was = fast_pdl();
  set_fast_gemv_tc(true);
  // Chunk sizes 512 .. 4096 (FP8) / 1024 .. 8192 (MXFP4) with PDL, the split K folded through a
  // cluster or through the global workspace (tc_global_fold), two interleaved passes; then the
  // default without PDL.
  const bool fold_was = tc_global_fold(), ll_was = tc_lean_loop();
  // One line: M = 1 at the released decode shapes (fp4: 6 expert rows of 8 experts).
  const auto line = [&]() -> Status {
    struct One { const char* name; int64_t N, K; bool fp4; };
    for (One c : {One{"wq_b", 32768, 1280, false}, One{"wo_b", 5120, 8192, false}, One{"w2s", 5120, 2304, false}, One{"wq_a", 1280, 5120, false},
                  One{"e.w13", 2304, 5120, true}, One{"e.w2", 5120, 2304, true}}) {
      const int64_t wbytes = c.fp4 ? 8 * c.N * c.K / 2 : c.N * c.K, slices = int64_t(pool_bytes) / wbytes;  // fp4: 8 experts
      double ms = 0.0;
      FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                 [&](int i) {
                                   uint8_t* base = wp + (i % slices) * wbytes;
                                   if (!c.fp4) return fast_fp8_gemv_q(q, 1, Fp8W{base, sp, c.N, c.K}, y, st);
                                   const int64_t eb1 = c.N * c.K / 2;
                                   return fast_fp4_gemv_q(q, 6, 6, Fp4W{base, sp, c.N, c.K, eb1, c.N * c.K / 32}, ex.get<int32_t>(), y, st);
                                 },
                                 &ms));
      const double moved = c.fp4 ? double(wbytes) * 6 / 8 : double(wbytes);  // fp4: the 6 experts read
      std::printf(" %s %.1f us %.0f GB/s;", c.name, ms * 1e3, moved / (ms * 1e-3) / 1e9);
    }
    std::printf("\n");
    return Status();
  };
  for (int pass = 0; pass < 3; ++pass)
    for (int fold = 0; fold < 2; ++fold)
      for (int sc : {1, 2, 4, 8}) {
        const int pdl = pass < 2 ? 1 : 0;
        if (pass == 2 && (fold == 1 || sc != 4)) continue;
        set_tc_global_fold(fold == 1);
        set_fast_pdl(pdl == 1);
        tc_gemv_set_chunk_max(512 * sc, 1024 * sc);
        std::printf("tc chunk max fp8 %d fp4 %d pdl %d fold %s:", 512 * sc, 1024 * sc, pdl, fold ? "global" : "cluster");
        FB_RETURN_IF_ERROR(line());
      }
  // The lean loop off / on (set_tc_lean_loop) at the defaults with PDL, three interleaved passes.
  set_tc_global_fold(fold_was);
  tc_gemv_set_chunk_max(0, 0);
  set_fast_pdl(true);
  for (int pass = 0; pass < 3; ++pass)
    for (int ll = 0; ll < 2; ++ll) {
      set_tc_lean_loop(ll == 1);
      std::printf("tc lean loop %d:", ll);
      FB_RETURN_IF_ERROR(line());
    }
  set_tc_lean_loop(ll_was);
  set_tc_global_fold(fold_was);
  tc_gemv_set_chunk_max(0, 0);
  set_fast_pdl(pdl_was);
  set_fast_gemv_tc(tc_was);
  std::fflush(stdout);
  return Status();
}

// The register-streamed GEMVs (rs_gemv.h) against the tensor-core tiles (the product's default) at
// the released decode shapes, M = 1 (MXFP4: 6 expert rows of 8 experts), interleaved passes; then
// the rs kernels' knobs (rs_set_tuning: warps aimed at, steps of loads in flight). Each call reads
// a different copy of the weight (copies together well past the 50 MB L2).
Status rs_gemv_bench() {
  BenchBuffers bb;
  FB_RETURN_IF_ERROR(bb.init());
  const QuantBuf q = bb.q;
  uint16_t* y2 = bb.y + BenchBuffers::kMaxRows * BenchBuffers::kMaxN;
  cudaStream_t st = nullptr;
  constexpr int kReps = 50;
  const bool tc_was = fast_gemv_tc();
  struct Shape {
    const char* name;
    int64_t N, K;
    bool fp4;
  };
  const Shape shapes[] = {{"wq_b", 32768, 1280, false}, {"wo_b", 5120, 8192, false}, {"w2s", 5120, 2304, false}, {"wq_a", 1280, 5120, false},
                          {"e.w13", 2304, 5120, true},  {"e.w2", 5120, 2304, true}};
  // Packed copies per shape (about 400 MB of each), from slices of the pool; the tiles read the
  // slices themselves.
  struct Copies {
    std::vector<RsWeight> a, b;  // b: MXFP4 w3 beside w1
    int64_t slice = 0, n = 0;    // bytes between the pool slices the copies came from, their count
  };
  std::vector<Copies> copies(std::size(shapes));
  for (size_t si = 0; si < std::size(shapes); ++si) {
    const Shape& c = shapes[si];
    Copies& cp = copies[si];
    const int64_t one = c.fp4 ? 8 * (c.N * c.K / 2 + c.N * c.K / 32) : c.N * c.K;  // fp4: 8 experts with their scales
    cp.slice = c.fp4 ? 2 * one : one;
    cp.n = std::max<int64_t>(2, std::min<int64_t>(int64_t(BenchBuffers::kPoolBytes) / cp.slice, (int64_t(400) << 20) / cp.slice));
    for (int64_t i = 0; i < cp.n; ++i) {
      uint8_t* base = bb.wp + i * cp.slice;
      RsWeight ra, rb;
      if (c.fp4) {
        const int64_t eb = c.N * c.K / 2, esb = c.N * c.K / 32;
        FB_RETURN_IF_ERROR(rs_pack_fp4(Fp4W{base, base + 8 * eb, c.N, c.K, eb, esb}, 8, &ra, st));
        FB_RETURN_IF_ERROR(rs_pack_fp4(Fp4W{base + one, base + one + 8 * eb, c.N, c.K, eb, esb}, 8, &rb, st));
        cp.b.push_back(std::move(rb));
      } else {
        FB_RETURN_IF_ERROR(rs_pack_fp8(Fp8W{base, bb.sp, c.N, c.K}, &ra, st));
      }
      cp.a.push_back(std::move(ra));
    }
  }
  FB_CUDA_TRY(cudaDeviceSynchronize());
  // One line: every shape with the rs kernels (rs = 1) or the tiles (rs = 0). FP8 at m8 activation
  // rows; MXFP4 one token's 6 expert rows, or (grouped) 36 rows of 6 tokens over 8 experts
  // (4-5 rows each) with the rows grouped by expert, as a verify step of 6 rows runs them.
  const auto line = [&](bool rs, int64_t m8, bool grouped) -> Status {
    set_fast_gemv_tc(true);
    for (size_t si = 0; si < std::size(shapes); ++si) {
      const Shape& c = shapes[si];
      const Copies& cp = copies[si];
      double ms = 0.0;
      const int64_t m4 = grouped ? 36 : 6;
      const int32_t* exp = bb.ex.get<int32_t>() + (grouped ? 16 : 0);
      FB_RETURN_IF_ERROR(time_ms(st, kReps,
                                 [&](int i) {
                                   const int64_t k = i % cp.n;
                                   uint8_t* base = bb.wp + k * cp.slice;
                                   if (!c.fp4) return rs ? rs_fp8_gemv(q, m8, cp.a[size_t(k)], bb.y, st) : fast_fp8_gemv_q(q, m8, Fp8W{base, bb.sp, c.N, c.K}, bb.y, st);
                                   if (rs)
                                     return rs_fp4_gemv(q, m4, 6, cp.a[size_t(k)], bb.y, c.N == 2304 ? &cp.b[size_t(k)] : nullptr, y2, exp, st, true,
                                                        grouped);
                                   const int64_t eb = c.N * c.K / 2, esb = c.N * c.K / 32, one = 8 * (eb + esb);
                                   const Fp4W a{base, base + 8 * eb, c.N, c.K, eb, esb}, b{base + one, base + one + 8 * eb, c.N, c.K, eb, esb};
                                   return c.N == 2304 ? fast_fp4_gemv2_q(q, m4, 6, a, b, exp, bb.y, y2, st, grouped)
                                                      : fast_fp4_gemv_q(q, m4, 6, a, exp, bb.y, st, grouped);
                                 },
                                 &ms));
      // bytes read: FP8 the weight; MXFP4 the experts' codes and scales (6, or grouped the 8 distinct; x 2 for w1 + w3)
      const double moved = c.fp4 ? double(grouped ? 8 : 6) * double(c.N * c.K / 2 + c.N * c.K / 32) * (c.N == 2304 ? 2 : 1) : double(c.N * c.K);
      std::printf(" %s %.1f us %.0f GB/s;", c.name, ms * 1e3, moved / (ms * 1e-3) / 1e9);
    }
    std::printf("\n");
    return Status();
  };
  for (int pass = 0; pass < 3; ++pass)
    for (int rs = 0; rs < 2; ++rs) {
      std::printf("%s (pass %d):", rs ? "rs (defaults)" : "tc tiles     ", pass);
      FB_RETURN_IF_ERROR(line(rs == 1, 1, false));
    }
  // rows: FP8 at 2, 4, 6 and 8 activation rows with MXFP4 grouped (16 rows, 8 experts)
  for (int64_t m8 : {2, 4, 6, 8})
    for (int rs = 0; rs < 2; ++rs) {
      std::printf("%s FP8 M=%lld, MXFP4 grouped 36:", rs ? "rs   " : "tiles", static_cast<long long>(m8));
      FB_RETURN_IF_ERROR(line(rs == 1, m8, true));
    }
  rs_set_token_staging(false);
  std::printf("rs rows staged per group FP8 M=6, MXFP4 grouped 36:");
  FB_RETURN_IF_ERROR(line(true, 6, true));
  rs_set_token_staging(true);
  rs_set_group_rows(8);
  std::printf("rs groups of 8 FP8 M=6, MXFP4 grouped 36:");
  FB_RETURN_IF_ERROR(line(true, 6, true));
  rs_set_group_rows(4);
  for (int y : {1, 2, 4, 16, 36}) {
    rs_set_group_ctas(y);
    std::printf("rs group ctas %d FP8 M=6, MXFP4 grouped 36:", y);
    FB_RETURN_IF_ERROR(line(true, 6, true));
  }
  rs_set_group_ctas(0);
  for (int depth : {2, 4, 8})
    for (int t8 : {2048, 4096, 8192})
      for (int t4 : {384, 768, 1536}) {
        if (t4 != 768 && t8 != 4096) continue;  // one knob at a time around the defaults
        rs_set_tuning(t8, t4, depth);
        std::printf("rs depth %d fp8 target %d fp4 target %d (warps/CTA: wq_b %d, wq_a %d, e.w13 %d, e.w2 %d):", depth, t8, t4,
                    rs_warps(32768, 1280, false), rs_warps(1280, 5120, false), rs_warps(2304, 5120, true), rs_warps(5120, 2304, true));
        FB_RETURN_IF_ERROR(line(true, 1, false));
      }
  rs_set_tuning(0, 0, 0);
  set_fast_gemv_tc(tc_was);
  std::fflush(stdout);
  return Status();
}

}  // namespace fb::cuda
