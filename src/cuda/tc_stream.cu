// The streaming form of the tensor-core decode GEMVs (tc_gemv.h, set_tc_stream) [fast].
//
// Why: the tile kernels (tc_gemv.cu) give every CTA one (stripe, K chunk): copy the whole tile,
// wait, compute, fold, exit. The CTAs of a wave run those phases together, so an SM has little in
// flight while it computes (ncu, session 14: DRAM 29-49% busy, 1.6-1.7 TB/s on the decode shapes).
//
// What: a persistent grid (SMs x CTAs per SM), each CTA owning a contiguous range of the launch's
// items (unit = (row, stripe of 16 output rows) for MXFP4 experts, the stripe for FP8; item = (unit,
// K chunk), the chunk fastest). One producer warp streams the items' weight tiles into a ring of
// shared-memory stages with cp.async.bulk (one bulk copy per tile row, completion on the stage's
// mbarrier; the raw scale bytes by 4-byte cp.async on the same barrier), as far ahead as the ring
// allows; four consumer warps compute each stage as it lands and hand it back (a second mbarrier
// per stage). Dense FP8 weights stream before griddepcontrol.wait; MXFP4 experts once the ids are
// known (ExpertPdl as in tc_gemv.h).
//
// Same bits as the tile kernels: a stage is the tile kernel's tile (16 rows x the tc_chunks chunk,
// rows padded by 16 bytes instead of swizzled: conflict-free ldmatrix either way), the consumer
// warps run the tile kernel's unit loop (units warp, warp + 4, ...; the lean MXFP4 loop for one
// row, the FP8 loop for <= 8 rows), their partials add in warp order, the chunks of a unit in rank
// order: in registers when one CTA holds all of a unit's chunks, else through the stream's fold
// workspace (the last CTA to arrive adds the published partials in rank order). Test
// FastGemv.TcStreamSameBits.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"
#include "cuda/tc_gemv.h"
#include "cuda/tc_gemv_dev.cuh"

namespace fb::cuda {

using namespace tcdev;
using dev::to_bf;

namespace {

constexpr int kRows = 16;        // output rows per stripe (the mma's m)
constexpr int kConsumers = 4;    // consumer warps: the tile kernel's 4 (the same units and warp fold)
constexpr int kStreamThreads = (kConsumers + 1) * 32;
constexpr int kMaxStages = 8;
constexpr int kMaxFp8Rows = 8;   // FP8: one row group (the mma's n)

struct SPart {
  const uint8_t* W = nullptr;
  const uint8_t* S = nullptr;
  int64_t N = 0, stripes = 0;
  uint16_t* y = nullptr;
};

struct StreamArgs {
  const uint8_t* xc = nullptr;
  const float* xs = nullptr;
  int64_t M = 0, x_div = 1;
  SPart pa, pb;
  int K = 0, nk = 1, kc = 0;  // tc_chunks
  int64_t w_stride = 0, s_stride = 0;
  const int32_t* expert = nullptr;  // MXFP4 (nullptr: expert 0)
  int64_t units = 0, items = 0;     // units x nk items over gridDim.x CTAs
  int stages = 2, trow = 0, stage_bytes = 0;
  int xrows = 1;                    // activation rows staged per CTA
  int pdl_mode = 0;                 // ExpertPdl (MXFP4)
  FoldWs fold;                      // split units (parts == nullptr: the host split none)
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
// One arrival on bar once this thread's earlier cp.async copies have landed (counted in the init).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!ok);
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory"); }

// Shared memory: [full[8], empty[8] mbarriers][red: 2 x 4 warps x 32 float4][activations][ring].
constexpr int kRedOff = 2 * kMaxStages * 8, kActOff = kRedOff + 2 * kConsumers * 32 * 16;
__host__ __device__ constexpr int64_t round128(int64_t v) { return (v + 127) / 128 * 128; }
// Activation bytes per staged row: MXFP4 the lean loop's f16 pairs (2 bytes per k) + f32 scales;
// FP8 the codes (+16: conflict-free B loads) + f32 scales.
__host__ __device__ constexpr int64_t act_row_bytes(bool fp4, int64_t K) { return fp4 ? 2 * K : K + 16; }

struct Unit {
  const SPart* p;
  int64_t m, stripe, e;  // e < 0: a skipped row
};

// The unit's row, weight, stripe and expert; *last caches the last row's expert id (one load per row,
// not one dependent round trip per item).
template <bool FP4>
__device__ __forceinline__ Unit unit_of(const StreamArgs& a, int64_t unit, bool early, int64_t (&last)[2]) {
  const int64_t st = a.pa.stripes + a.pb.stripes;
  const int64_t m = FP4 ? unit / st : 0, s = FP4 ? unit - m * st : unit;
  Unit u{s < a.pa.stripes ? &a.pa : &a.pb, m, s < a.pa.stripes ? s : s - a.pa.stripes, 0};
  if (FP4 && a.expert) {
    if (last[0] != m) {
      last[0] = m;
      last[1] = early ? __ldcg(a.expert + m) : a.expert[m];
    }
    u.e = last[1];
  }
  return u;
}

template <bool FP4>
__global__ void __launch_bounds__(kStreamThreads) tc_stream_kernel(const __grid_constant__ StreamArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const bool late_trigger = FP4 && a.pdl_mode == 1, early = FP4 && a.pdl_mode == 2;
  if (!late_trigger) pdl_trigger();
  const uint32_t bars = smem_u32(smem);
  const auto full = [&](int s) { return bars + 8 * s; };
  const auto empty = [&](int s) { return bars + 8 * (kMaxStages + s); };
  const int K = a.K, KB = K / 32, nk = a.nk, kb_max = a.kc / 32, S = a.stages;
  const int64_t I0 = int64_t(blockIdx.x) * a.items / gridDim.x, I1 = int64_t(blockIdx.x + 1) * a.items / gridDim.x;
  uint8_t* const xt = smem + kActOff;
  float* const xsc = reinterpret_cast<float*>(xt + a.xrows * act_row_bytes(FP4, K));
  uint8_t* const ring = smem + round128(kActOff + a.xrows * (act_row_bytes(FP4, K) + 4 * KB));
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1 + 32);         // the producer's expect_tx arrival + its 32 lanes' cp.async arrivals
      mbar_init(empty(s), kConsumers);    // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers) {  // ---- the producer warp ----
    if (FP4 && !early) pdl_wait();  // the expert ids come from the step
    if (late_trigger) pdl_trigger();
    uint32_t pos = 0;
    int64_t last[2] = {-1, 0};
    for (int64_t item = I0; item < I1; ++item) {
      const int64_t unit = item / nk;
      const int c = int(item - unit * nk);
      const Unit u = unit_of<FP4>(a, unit, early, last);
      if (u.e < 0) continue;
      const int s = int(pos % S);
      const uint32_t use = pos / S;
      ++pos;
      if (use > 0) mbar_wait(empty(s), (use - 1) & 1);
      uint8_t* const tile = ring + s * a.stage_bytes;
      uint8_t* const sc = tile + kRows * a.trow;
      const int k0 = c * a.kc, kcc = min(a.kc, K - k0), rowb = FP4 ? kcc / 2 : kcc, nb = kcc / 32;
      const int64_t n0 = u.stripe * kRows, N = u.p->N;
      const uint8_t* W = u.p->W + (FP4 ? u.e * a.w_stride : 0);
      const uint8_t* Sc = u.p->S + (FP4 ? u.e * a.s_stride : 0);
      if (lane == 0) mbar_arrive_expect_tx(full(s), uint32_t(kRows * rowb));
      __syncwarp();
      if (lane < kRows) {  // rows past N: the last row again (computed, never stored), as the tile kernel
        const int64_t n = n0 + lane < N ? n0 + lane : N - 1;
        bulk_g2s(smem_u32(tile + lane * a.trow), W + n * (FP4 ? K / 2 : K) + (FP4 ? k0 / 2 : k0), uint32_t(rowb), full(s));
      }
      if constexpr (FP4) {  // the 16 rows' raw scale bytes of the chunk, [16][kb_max]
        const int nw = nb / 4;
        for (int q = lane; q < kRows * nw; q += 32) {
          const int r = q / nw, w = q - r * nw;
          const int64_t n = n0 + r < N ? n0 + r : N - 1;
          cp_async4(smem_u32(sc + r * kb_max + 4 * w), Sc + n * KB + k0 / 32 + 4 * w, 4);
        }
      } else {  // the stripe's scale row (16 rows inside one 32-row block)
        for (int q = lane; q < nb / 4; q += 32) cp_async4(smem_u32(sc + 4 * q), Sc + (n0 / 32) * KB + k0 / 32 + 4 * q, 4);
      }
      cp_async_arrive_noinc(full(s));
    }
    cp_async_wait_all();
    return;
  }

  // ---- the consumer warps ----
  pdl_wait();  // the activations (and the expert ids) come from the step
  if (late_trigger) pdl_trigger();
  const int ctid = tid, g = lane >> 2, t = lane & 3;
  // the activation rows of this CTA's items: FP4 rows m / x_div of its first to last unit; FP8 the
  // launch's rows (<= 8)
  int64_t xm0 = 0, xn = a.M;
  if (I1 > I0) {
    if constexpr (FP4) {
      const int64_t st = a.pa.stripes + a.pb.stripes;
      xm0 = (I0 / nk / st) / a.x_div;
      xn = ((I1 - 1) / nk / st) / a.x_div - xm0 + 1;
    }
  } else {
    xn = 0;
  }
  if constexpr (FP4) {
    // row j's block B as the lean loop stages it: lane t's B words of unit B / 2 at ((B / 2) * 4 + t) * 32
    // + (B & 1) * 16, as the f16 pairs of mma_e4m3_f16b (tc_gemv.cu's stage(), over the whole K)
    for (int64_t i = ctid; i < xn * KB; i += kConsumers * 32) {
      const int j = int(i / KB), B = int(i - int64_t(j) * KB);
      const int64_t xm = xm0 + j;
      const uint4* src = reinterpret_cast<const uint4*>(a.xc + xm * K + B * 32);
      const uint4 lo = src[0], hi = src[1];
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t ev = __byte_perm(w[2 * q], w[2 * q + 1], 0x6420), od = __byte_perm(w[2 * q], w[2 * q + 1], 0x7531);
        *reinterpret_cast<uint4*>(xt + j * act_row_bytes(true, K) + ((B >> 1) * 4 + q) * 32 + (B & 1) * 16) =
            make_uint4(e4m3x2_f16x2(ev), e4m3x2_f16x2(od), e4m3x2_f16x2<true>(ev), e4m3x2_f16x2<true>(od));
      }
      xsc[j * KB + B] = a.xs[xm * KB + B];
    }
  } else {
    const int upr = K / 16;
    for (int64_t i = ctid; i < xn * upr; i += kConsumers * 32) {
      const int j = int(i / upr), q = int(i - int64_t(j) * upr);
      *reinterpret_cast<uint4*>(xt + j * act_row_bytes(false, K) + q * 16) = *reinterpret_cast<const uint4*>(a.xc + int64_t(j) * K + q * 16);
    }
    for (int64_t i = ctid; i < xn * KB; i += kConsumers * 32) xsc[i] = a.xs[i];
  }
  consumers_sync();

  const int xr = int(xn);  // FP8: rows past M are zeros in registers (the tile kernel's lean staging)
  const int li = lane >> 3, lr = (lane & 7) + 8 * (li & 1);  // ldmatrix: this lane addresses matrix li's row lr
  float4* const red = reinterpret_cast<float4*>(smem + kRedOff);  // [2][warps][32]
  float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);           // warp 0: the unit's chunks so far
  uint32_t pos = 0;
  int rb = 0;
  int64_t last[2] = {-1, 0};
  for (int64_t item = I0; item < I1; ++item) {
    const int64_t unit = item / nk;
    const int c = int(item - unit * nk);
    const Unit u = unit_of<FP4>(a, unit, false, last);
    if (u.e < 0) continue;
    const int s = int(pos % S);
    const uint32_t use = pos / S;
    ++pos;
    mbar_wait(full(s), use & 1);
    const uint8_t* const tile = ring + s * a.stage_bytes;
    const uint8_t* const sc = tile + kRows * a.trow;
    const int k0 = c * a.kc, kcc = min(a.kc, K - k0), nb = kcc / 32;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (FP4) {
      // does a scale byte of the stage need e8m0's special cases (0, 255)? (the same values either way)
      uint32_t any = 0;
      const int nw = nb / 4;
      for (int q = lane; q < kRows * nw; q += 32) {
        const int r = q / nw, w = q - r * nw;
        const uint32_t v = *reinterpret_cast<const uint32_t*>(sc + r * kb_max + 4 * w);
        any |= __vcmpeq4(v, 0u) | __vcmpeq4(v, ~0u);
      }
      const bool special = __any_sync(~0u, any != 0);
      const int64_t xj = u.m / a.x_div - xm0;
      const uint8_t* const xrow = xt + xj * act_row_bytes(true, K);
      const float* const xsr = xsc + xj * KB + k0 / 32;
      const int ub = k0 / 64, units = (nb + 1) / 2;
      const auto run = [&](auto sp) {
        for (int v = warp; v < units; v += kConsumers) {
          uint32_t r[4];
          ldsm_x4(smem_u32(tile + lr * a.trow + (2 * v + (li >> 1)) * 16), r);
          uint4 bx[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
          if (g == 0) {
            const uint4* src = reinterpret_cast<const uint4*>(xrow + ((ub + v) * 4 + t) * 32);
            bx[0] = src[0];
            bx[1] = src[1];
          }
          const uint32_t s0 = *reinterpret_cast<const uint16_t*>(sc + g * kb_max + 2 * v);
          const uint32_t s8 = *reinterpret_cast<const uint16_t*>(sc + (g + 8) * kb_max + 2 * v);
          float2 sx2 = t == 0 ? *reinterpret_cast<const float2*>(xsr + 2 * v) : make_float2(0.0f, 0.0f);
          sx2 = make_float2(__fmul_rn(sx2.x, 64.0f), __fmul_rn(sx2.y, 64.0f));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (2 * v + h >= nb) break;
            const uint32_t w0 = r[2 * h], w1 = r[2 * h + 1];
            const uint32_t aw[4] = {e2m1_lo_e4m3(w0), e2m1_lo_e4m3(w1), e2m1_hi_e4m3(w0), e2m1_hi_e4m3(w1)};
            float d[4];
            mma_e4m3_f16b(aw, bx[h], d);
            const uint32_t c0 = (s0 >> (8 * h)) & 0xFFu, c8 = (s8 >> (8 * h)) & 0xFFu;
            const float ws0 = decltype(sp)::value ? e8m0_lean(c0) : __uint_as_float(c0 << 23);
            const float ws8 = decltype(sp)::value ? e8m0_lean(c8) : __uint_as_float(c8 << 23);
            const float sx = h ? sx2.y : sx2.x;
            acc[0] = __fmaf_rn(d[0], __fmul_rn(ws0, sx), acc[0]);
            acc[2] = __fmaf_rn(d[2], __fmul_rn(ws8, sx), acc[2]);
          }
        }
      };
      if (special) {
        run(std::true_type{});
      } else {
        run(std::false_type{});
      }
    } else {
      for (int v = warp; v < nb; v += kConsumers) {
        uint32_t r[4];
        ldsm_x4(smem_u32(tile + lr * a.trow + (2 * v + (li >> 1)) * 16), r);
        const uint8_t* xb = xt + g * act_row_bytes(false, K) + k0 + v * 32 + 4 * t;
        const uint32_t b0 = g < xr ? *reinterpret_cast<const uint32_t*>(xb) : 0u, b1 = g < xr ? *reinterpret_cast<const uint32_t*>(xb + 16) : 0u;
        float d[4];
        mma_e4m3(r, b0, b1, d);
        const float ws = dev::e8m0_val(sc[v]);
        const float x0 = 2 * t < xr ? xsc[(2 * t) * KB + k0 / 32 + v] : 0.0f, x1 = 2 * t + 1 < xr ? xsc[(2 * t + 1) * KB + k0 / 32 + v] : 0.0f;
        const float s0 = __fmul_rn(ws, x0), s1 = __fmul_rn(ws, x1);
        acc[0] = __fmaf_rn(d[0], s0, acc[0]);
        acc[1] = __fmaf_rn(d[1], s1, acc[1]);
        acc[2] = __fmaf_rn(d[2], s0, acc[2]);
        acc[3] = __fmaf_rn(d[3], s1, acc[3]);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(s));  // the stage is free for the producer
    // the warps' partials in warp order (red is double-buffered: one barrier per item)
    red[(rb * kConsumers + warp) * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    consumers_sync();
    if (warp == 0) {
      float4 v = red[(rb * kConsumers) * 32 + lane];
      for (int w = 1; w < kConsumers; ++w) {
        const float4 o = red[(rb * kConsumers + w) * 32 + lane];
        v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
      }
      // the unit's chunks in rank order: in registers when this CTA holds them all, else published
      const int64_t first = unit * nk;
      const int cf = first < I0 ? int(I0 - first) : 0, cl = first + nk - 1 < I1 ? nk - 1 : int(I1 - 1 - first);
      bool store = false;
      if (cf == 0 && cl == nk - 1) {
        total = c == 0 ? v : make_float4(__fadd_rn(total.x, v.x), __fadd_rn(total.y, v.y), __fadd_rn(total.z, v.z), __fadd_rn(total.w, v.w));
        store = c == nk - 1;
      } else {
        __stcg(a.fold.parts + (unit * nk + c) * 32 + lane, v);
        if (c == cl) {
          __threadfence();
          __syncwarp();
          unsigned old = 0;
          if (lane == 0) old = atomicAdd(a.fold.counters + unit, unsigned(cl - cf + 1));
          old = __shfl_sync(~0u, old, 0);
          if (old + unsigned(cl - cf + 1) == unsigned(nk)) {
            __threadfence();
            const float4* pp = a.fold.parts + unit * nk * 32 + lane;
            total = __ldcg(pp);
            for (int rk = 1; rk < nk; ++rk) {
              const float4 o = __ldcg(pp + rk * 32);
              total = make_float4(__fadd_rn(total.x, o.x), __fadd_rn(total.y, o.y), __fadd_rn(total.z, o.z), __fadd_rn(total.w, o.w));
            }
            if (lane == 0) a.fold.counters[unit] = 0u;
            store = true;
          }
        }
      }
      if (store) {
        const int64_t N = u.p->N, na = u.stripe * kRows + g, n8 = na + 8;
        uint16_t* const y = u.p->y;
        if constexpr (FP4) {
          if (t == 0) {
            if (na < N) y[u.m * N + na] = to_bf(total.x);
            if (n8 < N) y[u.m * N + n8] = to_bf(total.z);
          }
        } else {
          const int64_t c0 = 2 * t, c1 = c0 + 1;
          if (na < N && c0 < a.M) y[c0 * N + na] = to_bf(total.x);
          if (na < N && c1 < a.M) y[c1 * N + na] = to_bf(total.y);
          if (n8 < N && c0 < a.M) y[c0 * N + n8] = to_bf(total.z);
          if (n8 < N && c1 < a.M) y[c1 * N + n8] = to_bf(total.w);
        }
      }
    }
    rb ^= 1;
  }
}

std::atomic<int> g_stream{0};  // kinds: 1 FP8, 2 MXFP4
std::atomic<int64_t> g_stream_ctas{0};
std::atomic<int64_t> g_stream_launches{0};

// CTAs per SM of kernel at smem bytes (cached: the occupancy query per launch costs host time).
int ctas_per_sm(const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::vector<std::pair<std::pair<const void*, size_t>, int>> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : cache)
    if (e.first.first == kernel && e.first.second == smem) return e.second;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kStreamThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  cache.push_back({{kernel, smem}, n});
  return n;
}

int sm_count() {
  static const int n = [] {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) v = 0;
    return v;
  }();
  return n;
}

bool a4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

// Launches the streaming kernel when the launch suits it (*taken); otherwise leaves it to the tile kernel.
template <bool FP4>
Status stream_launch(StreamArgs a, cudaStream_t st, bool* taken) {
  *taken = false;
  if (!(g_stream.load(std::memory_order_relaxed) & (FP4 ? 2 : 1))) return Status();
  const int64_t K = a.K;
  // raw scale bytes by 4-byte cp.async (as the tile kernel's async scales); bulk copies of 16-byte rows
  if (K % 128 != 0 || !a4(a.pa.S) || (a.pb.stripes > 0 && !a4(a.pb.S)) || (FP4 && a.s_stride % 4 != 0)) return Status();
  if (!FP4 && a.M > kMaxFp8Rows) return Status();
  const TcChunks ch = tc_chunks(K, FP4);
  a.nk = ch.nk;
  a.kc = ch.kc;
  const int64_t st_all = a.pa.stripes + a.pb.stripes;
  a.units = FP4 ? a.M * st_all : st_all;
  a.items = a.units * a.nk;
  if (a.items == 0) return Status();
  const int sms = sm_count();
  if (sms <= 0) return Status();
  a.trow = int(FP4 ? ch.kc / 2 : ch.kc) + 16;  // +16: the 8 rows of an ldmatrix in 8 distinct 16-byte bank groups
  a.stage_bytes = int(round128(int64_t(kRows) * a.trow + (FP4 ? kRows * (ch.kc / 32) : ch.kc / 32)));
  const auto kernel = &tc_stream_kernel<FP4>;
  const int64_t forced = g_stream_ctas.load(std::memory_order_relaxed);
  // two CTAs per SM (8 consumer warps) when a ring of >= 3 stages fits, else one with a deeper ring
  for (int per_sm : {2, 1}) {
    int64_t grid = std::min<int64_t>(a.items, forced > 0 ? forced : int64_t(sms) * per_sm);
    int64_t xrows = FP4 ? 1 : a.M;
    if (FP4) {
      for (int64_t i = 0; i < grid; ++i) {
        const int64_t I0 = i * a.items / grid, I1 = (i + 1) * a.items / grid;
        if (I1 > I0) xrows = std::max<int64_t>(xrows, ((I1 - 1) / a.nk / st_all) / a.x_div - (I0 / a.nk / st_all) / a.x_div + 1);
      }
    }
    const int64_t fixed = round128(kActOff + xrows * (act_row_bytes(FP4, K) + 4 * (K / 32)));
    const int64_t budget = per_sm == 2 ? 113 * 1024 : 227 * 1024;
    const int64_t stages = std::min<int64_t>(kMaxStages, (budget - fixed) / a.stage_bytes);
    if (stages < (per_sm == 2 ? 3 : 2)) continue;
    const size_t smem = size_t(fixed + stages * a.stage_bytes);
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
    const int occ = ctas_per_sm(reinterpret_cast<const void*>(kernel), smem);
    if (occ <= 0) return Status();
    if (forced <= 0) grid = std::min<int64_t>(a.items, int64_t(sms) * std::min(occ, per_sm));
    // a unit whose chunks two CTAs share folds through the stream's workspace
    bool split = false;
    for (int64_t i = 1; i < grid && !split; ++i) split = (i * a.items / grid) % a.nk != 0;
    a.fold = FoldWs{};
    if (split) {
      a.fold = fold_workspace(st, a.units, a.nk);
      if (!a.fold.parts) return Status();  // (graph capture with a small workspace) the tile kernel
    }
    a.xrows = int(xrows);
    a.stages = int(stages);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(grid));
    cfg.blockDim = dim3(kStreamThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = fast_pdl() ? attr : nullptr;
    cfg.numAttrs = fast_pdl() ? 1 : 0;
    FB_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a));
    FB_CUDA_LAUNCHED("tc_stream_kernel");
    g_stream_launches.fetch_add(1, std::memory_order_relaxed);
    *taken = true;
    return Status();
  }
  return Status();
}

}  // namespace

void set_tc_stream(int kinds) { g_stream.store(kinds & 3, std::memory_order_relaxed); }
int tc_stream() { return g_stream.load(std::memory_order_relaxed); }
void tc_stream_set_ctas(int64_t ctas) { g_stream_ctas.store(ctas, std::memory_order_relaxed); }
int64_t tc_stream_launches() { return g_stream_launches.load(std::memory_order_relaxed); }

Status tc_fp8_stream(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st, bool* taken) {
  StreamArgs a;
  a.xc = q.codes;
  a.xs = q.scales;
  a.M = M;
  a.K = int(wa.K);
  a.pa = SPart{wa.w, wa.s, wa.N, (wa.N + kRows - 1) / kRows, ya};
  if (wb) a.pb = SPart{wb->w, wb->s, wb->N, (wb->N + kRows - 1) / kRows, yb};
  return stream_launch<false>(a, st, taken);
}

Status tc_fp4_stream(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb,
                     const int32_t* expert, cudaStream_t st, ExpertPdl pdl, bool* taken) {
  StreamArgs a;
  a.xc = q.codes;
  a.xs = q.scales;
  a.M = M;
  a.x_div = x_div;
  a.K = int(wa.K);
  a.w_stride = wa.w_stride;
  a.s_stride = wa.s_stride;
  a.expert = expert;
  a.pdl_mode = expert ? int(pdl) : 0;
  a.pa = SPart{wa.w, wa.s, wa.N, (wa.N + kRows - 1) / kRows, ya};
  if (wb) a.pb = SPart{wb->w, wb->s, wb->N, (wb->N + kRows - 1) / kRows, yb};
  return stream_launch<true>(a, st, taken);
}

}  // namespace fb::cuda
