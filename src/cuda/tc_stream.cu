// The streaming form of the tensor-core decode GEMVs (tc_gemv.h, CudaRunOptions::tc_stream).
//
// tc_gemv.cu gives every (stripe of 16 rows, K chunk[, row group / expert row]) tile its own CTA:
// copy the tile, wait, compute, fold, exit. Each CTA's copy starts only when an earlier CTA has
// left the SM, so the SM's loads come in bursts with idle gaps between them (ncu at 354c406:
// 1.2-1.5 TB/s for tiles of 32 KB). Here the grid is only as large as the device holds at once
// (persistent clusters of nk CTAs) and each CTA walks the units u = cluster, cluster + clusters,
// ... with two shared-memory stages: while it computes unit u, unit u's successor is already in
// flight (cp.async groups), so every SM keeps one tile per CTA loading at all times.
//
// A unit is the same tile as in tc_gemv.cu, with the same chunking (tc_chunks), the same per-warp
// split of the 32-blocks, the same warp fold and the same rank-order fold of the nk chunks (through
// distributed shared memory, double-buffered so a rank may run one unit ahead of rank 0's read):
// every output is bit for bit the cluster kernel's, so deterministic and row-invariant by the same
// argument (an output's terms and their order depend on (N, K) and its own row only).
//
// Differences in staging only: weight scales (e8m0) and the activation codes of the MXFP4 row are
// copied raw with cp.async (4 / 16 bytes) and decoded where they are used; the activation rows of
// FP8 / bf16 staging are min(M, 8) (shared memory per CTA follows M, so a 1-row step fits 3 CTAs
// per SM). Needs K % 128 == 0 and 4-byte aligned scale rows (tc_stream_fits); other shapes keep the
// cluster kernel.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"
#include "cuda/tc_gemv.h"
#include "cuda/tc_gemv_dev.cuh"

namespace fb::cuda {

namespace cg = cooperative_groups;
using dev::to_bf;
using namespace tcdev;

namespace {

std::atomic<bool> g_stream{true};

// 4 bytes global -> shared (through L1: scale rows are re-read by neighbouring units).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// One stage: byte offsets of the weight tile, the activations, their scales and the raw weight
// scales, and the stage size (a multiple of 128). ra = activation rows staged (FP8 / BFX).
struct StageLayout {
  int x = 0, xs = 0, ws = 0, bytes = 0;
};
__host__ __device__ inline StageLayout stage_layout(int mode, int kc_max, int ra) {
  const bool fp4 = mode == kModeFp4, bfx = mode == kModeBf16x;
  const int kb = kc_max / 32;
  StageLayout s;
  s.x = kStripe * (fp4 ? kc_max / 2 : kc_max);
  s.xs = s.x + (fp4 ? kc_max : ra * ((bfx ? 2 * kc_max : kc_max) + 16));
  s.ws = s.xs + (fp4 ? kb * 4 : bfx ? 0 : ra * kb * 4);
  s.bytes = (s.ws + (fp4 ? kStripe * kb : kb) + 127) / 128 * 128;
  return s;
}
constexpr int kFoldBytes = kWarps * 128 * 4 + 2 * 128 * 4;  // warp partials + the double-buffered cluster partial

// The scale products of the unit being computed, one f32 per (weight row or activation row, block).
__host__ __device__ inline int table_floats(int mode, int kc_max, int ra) {
  const int kb = kc_max / 32;
  return mode == kModeFp4 ? kStripe * kb : mode == kModeBf16x ? kb : ra * kb;
}
size_t stream_smem(int mode, int kc_max, int ra) {
  return size_t(2) * stage_layout(mode, kc_max, ra).bytes + kFoldBytes + size_t(table_floats(mode, kc_max, ra)) * 4;
}

// One unit's operands.
struct Unit {
  const uint8_t* W;
  const uint8_t* S;
  int64_t N, n0, m;  // m: the row group (FP8 / BFX) or the row (MXFP4)
  uint16_t* y;
};

template <int MODE>
__global__ void __launch_bounds__(kThreads) tc_stream_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, int64_t x_div,
                                                           TcPart pa, TcPart pb, int K, int nk, int kc_max, int ra, int64_t w_stride,
                                                           int64_t s_stride, const int32_t* __restrict__ expert, BfxArgs bx,
                                                           unsigned long long* ctr) {
  constexpr bool FP4 = MODE == kModeFp4, BFX = MODE == kModeBf16x;
  pdl_trigger();
  extern __shared__ __align__(128) uint8_t smem[];
  const StageLayout L = stage_layout(MODE, kc_max, ra);
  float* red = reinterpret_cast<float*>(smem + 2 * L.bytes);  // [warps][32][4]
  float* part = red + kWarps * 128;                            // [2][32][4]
  float* tbl = part + 2 * 128;                                 // scale products of the unit computed
  __shared__ long long uslot[4];                               // rank 0: the unit of iteration i at [i % 4]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rank = int(blockIdx.x % unsigned(nk));
  const int64_t ncl = gridDim.x / nk;
  const int k0 = rank * kc_max, kc = min(kc_max, K - k0), nb = kc / 32, KB = K / 32, kbm = kc_max / 32;
  const int rb = FP4 ? kc_max / 2 : kc_max;
  const int64_t per_stripe = FP4 ? M : (M + kRowGroup - 1) / kRowGroup;
  const int64_t units = (pa.stripes + pb.stripes) * per_stripe;

  auto decode = [&](int64_t u) {
    const int64_t ts = u / per_stripe;
    const bool second = ts >= pa.stripes;
    Unit c{second ? pb.W : pa.W, second ? pb.S : pa.S, second ? pb.N : pa.N, (second ? ts - pa.stripes : ts) * kStripe, u % per_stripe,
           second ? pb.y : pa.y};
    if constexpr (FP4) {
      const int64_t e = expert ? expert[c.m] : 0;
      c.W += e * w_stride;
      c.S += e * s_stride;
    }
    return c;
  };
  // The next unit of the launch: clusters take units from one counter (rank 0, thread 0), so a
  // cluster that starts late (the SMs busy with a kernel of the other stream) takes fewer units
  // instead of a fixed share. MXFP4 rows of expert < 0 are skipped.
  auto fetch = [&]() -> int64_t {
    int64_t u;
    do {
      u = int64_t(atomicAdd(ctr, 1ull));
    } while (FP4 && expert && u < units && expert[u % per_stripe] < 0);
    return u;
  };
  // rank 0's uslot[i] (after a cluster barrier, or a CTA barrier when nk == 1)
  auto slot = [&](int i) -> int64_t { return nk > 1 ? *cg::this_cluster().map_shared_rank(&uslot[i], 0) : uslot[i]; };
  auto issue_w = [&](const Unit& c, int s) {
    uint8_t* st = smem + s * L.bytes;
    const int upr = (FP4 ? kc / 2 : kc) / 16;
    const int64_t gstride = FP4 ? K / 2 : K, gk0 = FP4 ? k0 / 2 : k0;
    for (int u = tid; u < kStripe * upr; u += kThreads) {
      const int r = u / upr, j = u % upr;
      const int64_t n = c.n0 + r < c.N ? c.n0 + r : c.N - 1;
      cp_async16(smem_u32(st + tile_off(r, j, rb)), c.W + n * gstride + gk0 + j * 16, 16);
    }
    const int nw = (nb + 3) / 4;  // raw scale words (KB % 4 == 0: never past the scale row)
    if constexpr (FP4) {
      for (int i = tid; i < kStripe * nw; i += kThreads) {
        const int r = i / nw, q = i % nw;
        const int64_t n = c.n0 + r < c.N ? c.n0 + r : c.N - 1;
        cp_async4(smem_u32(st + L.ws + r * kbm + 4 * q), c.S + n * KB + k0 / 32 + 4 * q, 4);
      }
    } else {
      for (int q = tid; q < nw; q += kThreads) cp_async4(smem_u32(st + L.ws + 4 * q), c.S + (c.n0 / 32) * KB + k0 / 32 + 4 * q, 4);
    }
  };
  auto issue_x = [&](const Unit& c, int s) {
    uint8_t* st = smem + s * L.bytes;
    if constexpr (FP4) {
      const int64_t xm = c.m / x_div;
      for (int q = tid; q < kc / 16; q += kThreads) cp_async16(smem_u32(st + L.x + 16 * q), xc + xm * K + k0 + 16 * q, 16);
      for (int b = tid; b < nb; b += kThreads) cp_async4(smem_u32(st + L.xs + 4 * b), xs + xm * KB + k0 / 32 + b, 4);
    } else if constexpr (BFX) {
      const int64_t m0 = c.m * kRowGroup, xoff = (c.n0 / bx.grp_rows) * bx.grp_stride + k0;
      const int xupr = kc / 8, xrow = 2 * kc_max + 16;
      for (int u = tid; u < ra * xupr; u += kThreads) {
        const int j = u / xupr, q = u % xupr;
        const bool ok = m0 + j < M;
        const uint8_t* src = reinterpret_cast<const uint8_t*>(bx.x + (ok ? (m0 + j) * bx.ldx + xoff : 0));
        cp_async16(smem_u32(st + L.x + j * xrow + q * 16), src + (ok ? q * 16 : 0), ok ? 16 : 0);
      }
    } else {
      const int64_t m0 = c.m * kRowGroup;
      const int xupr = kc / 16, xrow = kc_max + 16;
      for (int u = tid; u < ra * xupr; u += kThreads) {
        const int j = u / xupr, q = u % xupr;
        const bool ok = m0 + j < M;
        cp_async16(smem_u32(st + L.x + j * xrow + q * 16), xc + (ok ? (m0 + j) * K + k0 + q * 16 : 0), ok ? 16 : 0);
      }
      for (int i = tid; i < ra * nb; i += kThreads) {
        const int j = i / nb, b = i % nb;
        const bool ok = m0 + j < M;
        cp_async4(smem_u32(st + L.xs + 4 * (j * kbm + b)), xs + (ok ? (m0 + j) * KB + k0 / 32 + b : 0), ok ? 4 : 0);
      }
    }
  };

  cg::cluster_group cluster = cg::this_cluster();
  if constexpr (FP4) pdl_wait();  // the expert ids come from the step
  if (rank == 0 && tid == 0) {
    const int64_t u0 = fetch();
    uslot[0] = u0;
    uslot[1] = u0 < units ? fetch() : units;
  }
  if (nk > 1) cluster.sync();
  else __syncthreads();
  int64_t u = slot(0), un = slot(1);
  if (u < units) {
    Unit cur = decode(u);
    issue_w(cur, 0);  // dense weights never depend on the step: copied before the wait
    if constexpr (!FP4) pdl_wait();
    issue_x(cur, 0);
    cp_async_commit();

    const int li = lane >> 3, lr = (lane & 7) + 8 * (li & 1);  // ldmatrix: this lane addresses matrix li's row lr
    const int kunits = FP4 ? (nb + 1) / 2 : nb;
    for (int i = 0, s = 0;; ++i, s ^= 1) {
      const bool more = un < units;
      Unit nxt = cur;
      if (more) {
        nxt = decode(un);
        issue_w(nxt, s ^ 1);
        issue_x(nxt, s ^ 1);
        cp_async_commit();
        cp_async_wait_one();
      } else {
        cp_async_wait_all();
      }
      if (rank == 0 && tid == 0) uslot[(i + 2) & 3] = more ? fetch() : units;  // read after the fold's barrier
      __syncthreads();

      // the scale products of this unit (the tile kernel's factors, the same bits)
      const uint8_t* stg = smem + s * L.bytes;
      const uint8_t* xt = stg + L.x;
      const float* xsc = reinterpret_cast<const float*>(stg + L.xs);
      const uint8_t* wsr = stg + L.ws;
      if constexpr (FP4) {
        for (int q = tid; q < kStripe * nb; q += kThreads) {
          const int r = q / nb, b = q % nb;
          tbl[r * kbm + b] = __fmul_rn(dev::e8m0_val(wsr[r * kbm + b]), xsc[b]);
        }
      } else if constexpr (BFX) {
        for (int b = tid; b < nb; b += kThreads) tbl[b] = dev::e8m0_val(wsr[b]);
      } else {
        for (int q = tid; q < ra * nb; q += kThreads) {
          const int j = q / nb, b = q % nb;
          tbl[j * kbm + b] = __fmul_rn(dev::e8m0_val(wsr[b]), xsc[j * kbm + b]);
        }
      }
      __syncthreads();

      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int k = warp; k < kunits; k += kWarps) {
        uint32_t r[4];
        ldsm_x4(smem_u32(stg + tile_off(lr, 2 * k + (li >> 1), rb)), r);
        if constexpr (FP4) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int b = 2 * k + h;
            if (b >= nb) break;
            const uint32_t w0 = r[2 * h], w1 = r[2 * h + 1];  // word t of block b, rows g and g + 8
            const uint32_t a[4] = {e2m1_lo_e4m3(w0), e2m1_lo_e4m3(w1), e2m1_hi_e4m3(w0), e2m1_hi_e4m3(w1)};
            uint32_t b0 = 0, b1 = 0;
            if (g == 0) {  // activation codes 8t..8t+7 of the block: even ones to b0, odd ones to b1
              const uint2 p = *reinterpret_cast<const uint2*>(xt + b * 32 + 8 * t);
              b0 = __byte_perm(p.x, p.y, 0x6420);
              b1 = __byte_perm(p.x, p.y, 0x7531);
            }
            float d[4];
            mma_e4m3(a, b0, b1, d);
            acc[0] = __fmaf_rn(__fmul_rn(d[0], 64.0f), tbl[g * kbm + b], acc[0]);
            acc[2] = __fmaf_rn(__fmul_rn(d[2], 64.0f), tbl[(g + 8) * kbm + b], acc[2]);
          }
        } else if constexpr (BFX) {
          const int b = k;
          uint2 p0 = make_uint2(0u, 0u), p1 = make_uint2(0u, 0u);
          if (g < ra) {
            const uint8_t* xb = xt + g * (2 * kc_max + 16) + (b * 32 + 4 * t) * 2;
            p0 = *reinterpret_cast<const uint2*>(xb);
            p1 = *reinterpret_cast<const uint2*>(xb + 32);
          }
          const uint32_t a1[4] = {e4m3x2_bf16x2(r[0]), e4m3x2_bf16x2(r[1]), e4m3x2_bf16x2(r[0] >> 16), e4m3x2_bf16x2(r[1] >> 16)};
          const uint32_t a2[4] = {e4m3x2_bf16x2(r[2]), e4m3x2_bf16x2(r[3]), e4m3x2_bf16x2(r[2] >> 16), e4m3x2_bf16x2(r[3] >> 16)};
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16(a1, p0.x, p0.y, d);
          mma_bf16(a2, p1.x, p1.y, d);
          const float ws = tbl[b];
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[q] = __fmaf_rn(d[q], ws, acc[q]);
        } else {
          const int b = k;
          uint32_t b0 = 0, b1 = 0;
          if (g < ra) {
            const uint8_t* xb = xt + g * (kc_max + 16) + b * 32 + 4 * t;
            b0 = *reinterpret_cast<const uint32_t*>(xb);
            b1 = *reinterpret_cast<const uint32_t*>(xb + 16);
          }
          float d[4];
          mma_e4m3(r, b0, b1, d);
          const float s0 = 2 * t < ra ? tbl[(2 * t) * kbm + b] : 0.0f, s1 = 2 * t + 1 < ra ? tbl[(2 * t + 1) * kbm + b] : 0.0f;
          acc[0] = __fmaf_rn(d[0], s0, acc[0]);
          acc[1] = __fmaf_rn(d[1], s1, acc[1]);
          acc[2] = __fmaf_rn(d[2], s0, acc[2]);
          acc[3] = __fmaf_rn(d[3], s1, acc[3]);
        }
      }

      // fold: warps in order, then the cluster's chunks in rank order (tc_gemv.cu's order)
      reinterpret_cast<float4*>(red)[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      float4* pt = reinterpret_cast<float4*>(part) + s * 32;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (warp == 0) {
        v = reinterpret_cast<const float4*>(red)[lane];
        for (int w = 1; w < kWarps; ++w) {
          const float4 o = reinterpret_cast<const float4*>(red)[w * 32 + lane];
          v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
        }
        pt[lane] = v;
      }
      bool writer = warp == 0;
      if (nk > 1) {
        cluster.sync();  // every rank's partial of this unit is in its part[s]; rank 0's next-but-one unit in uslot
        writer = writer && rank == 0;
        if (writer)
          for (int rk = 1; rk < nk; ++rk) {
            const float4 o = cluster.map_shared_rank(pt, rk)[lane];
            v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
          }
      }
      if (writer) {
        const int64_t na = cur.n0 + g, nb8 = cur.n0 + g + 8, N = cur.N;
        if constexpr (FP4) {
          if (t == 0) {
            if (na < N) cur.y[cur.m * N + na] = to_bf(v.x);
            if (nb8 < N) cur.y[cur.m * N + nb8] = to_bf(v.z);
          }
        } else {
          const int64_t c0 = cur.m * kRowGroup + 2 * t, c1 = c0 + 1;
          if (na < N && c0 < M) cur.y[c0 * N + na] = to_bf(v.x);
          if (na < N && c1 < M) cur.y[c1 * N + na] = to_bf(v.y);
          if (nb8 < N && c0 < M) cur.y[c0 * N + nb8] = to_bf(v.z);
          if (nb8 < N && c1 < M) cur.y[c1 * N + nb8] = to_bf(v.w);
        }
      }
      const int64_t unn = slot((i + 2) & 3);
      __syncthreads();  // stage s, the table and the warp partials are free for the next unit
      if (!more) break;
      u = un;
      un = unn;
      cur = nxt;
    }
  } else if constexpr (!FP4) {
    pdl_wait();
  }
  if (nk > 1) cluster.sync();  // rank 0 has read the last partials and slots before any rank's shared memory goes
  // the last cluster out resets the counter pair for the launch that next uses it
  if (rank == 0 && tid == 0) {
    __threadfence();
    if (atomicAdd(ctr + 1, 1ull) == static_cast<unsigned long long>(ncl - 1)) {
      ctr[0] = 0;
      ctr[1] = 0;
    }
  }
}

// Clusters (of nk CTAs) the device holds at once for this kernel and shared memory; cached.
Result<int64_t> resident_clusters(const void* kernel, size_t smem, int nk) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int>, int64_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, smem, nk);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int dev = 0, sms = 0;
  FB_CUDA_TRY(cudaGetDevice(&dev));
  FB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int64_t n = 0;
  if (nk == 1) {
    int per_sm = 0;
    FB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    n = int64_t(per_sm) * sms;
  } else {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(nk * sms));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(nk);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    FB_CUDA_TRY(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    n = clusters;
  }
  FB_CHECK(n > 0) << "tc stream kernel does not fit on the device (" << smem << " bytes of shared memory, cluster " << nk << ")";
  cache[key] = n;
  return n;
}

// The launches' unit counters: a ring of (next unit, clusters done) pairs, one pair per launch in
// issue order; a launch's last cluster zeroes its pair, and a pair comes round again only after
// kCounterRing - 1 later launches (far more than any step holds in flight, on either stream).
constexpr int kCounterRing = 4096;
struct Counters {
  std::mutex mu;
  unsigned long long* base = nullptr;
  int device = -1;
  std::atomic<uint32_t> next{0};
};
Counters& counters() {
  static Counters c;  // lives as long as the process (the device memory goes with the context)
  return c;
}
// The launch's counter pair; nullptr when none can be had here (no ring on this device yet and
// the stream is being captured: allocation is not allowed there), so the caller keeps the tile kernel.
unsigned long long* counter_pair(cudaStream_t st) {
  Counters& c = counters();
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.base == nullptr || c.device != dev) {
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return nullptr;
      if (c.base != nullptr) return nullptr;  // one device per process
      void* p = nullptr;
      if (cudaMalloc(&p, size_t(2) * kCounterRing * sizeof(unsigned long long)) != cudaSuccess) return nullptr;
      if (cudaMemset(p, 0, size_t(2) * kCounterRing * sizeof(unsigned long long)) != cudaSuccess) return nullptr;
      c.base = static_cast<unsigned long long*>(p);
      c.device = dev;
    }
  }
  return c.base + 2 * (c.next.fetch_add(1, std::memory_order_relaxed) % kCounterRing);
}

template <int MODE>
Status stream_launch(const TcStreamCall& c, unsigned long long* ctr, cudaStream_t st) {
  constexpr bool FP4 = MODE == kModeFp4;
  const int ra = FP4 ? 1 : int(std::min<int64_t>(c.M, kRowGroup));
  const size_t smem = stream_smem(MODE, c.ch.kc, ra);
  const auto kernel = &tc_stream_kernel<MODE>;
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  const int64_t per_stripe = FP4 ? c.M : (c.M + kRowGroup - 1) / kRowGroup;
  const int64_t units = (c.pa.stripes + c.pb.stripes) * per_stripe;
  if (units == 0) return Status();
  const int64_t resident = FB_TRY(resident_clusters(reinterpret_cast<const void*>(kernel), smem, c.ch.nk));
  const int64_t clusters = std::min(units, resident);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(clusters * c.ch.nk));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (fast_pdl()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  if (c.ch.nk > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = unsigned(c.ch.nk);
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = unsigned(na);
  FB_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, c.xc, c.xs, c.M, c.x_div, c.pa, c.pb, int(c.K), c.ch.nk, c.ch.kc, ra, c.w_stride, c.s_stride,
                                 c.expert, c.bfx, ctr));
  FB_CUDA_LAUNCHED("tc_stream_kernel");
  return Status();
}

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

}  // namespace

void set_tc_stream(bool on) { g_stream.store(on, std::memory_order_relaxed); }
bool tc_stream() { return g_stream.load(std::memory_order_relaxed); }

bool tc_stream_fits(const TcStreamCall& c) {
  if (!tc_stream() || c.K % 128 != 0 || c.s_stride % 4 != 0) return false;
  return aligned4(c.pa.S) && (c.pb.stripes == 0 || aligned4(c.pb.S));
}

Result<bool> tc_stream_launch(int mode, const TcStreamCall& c, cudaStream_t st) {
  unsigned long long* ctr = counter_pair(st);
  if (ctr == nullptr) return false;
  if (mode == kModeFp4) FB_RETURN_IF_ERROR(stream_launch<kModeFp4>(c, ctr, st));
  else if (mode == kModeBf16x) FB_RETURN_IF_ERROR(stream_launch<kModeBf16x>(c, ctr, st));
  else FB_RETURN_IF_ERROR(stream_launch<kModeFp8>(c, ctr, st));
  return true;
}

}  // namespace fb::cuda
