// Device experiment for issue 19 (a register-streamed GEMV that gives the tile kernels' bits):
// does one mma.m16n8k32 e4m3 (what tc_gemv.cu runs per 32-block) give the same f32 bits as the
// same 32 products through two mma.m16n8k16 f16 (what rs_gemv.cu runs: e4m3 widened to f16
// exactly, the second mma accumulating on the first)? And when the f16 operand carries the
// values times a power of two (rs's MXFP4 decode), does the result scale back to the same bits?
// Every operand is an exact e4m3 value, so the exact 32-term sum (double) is known; the check of
// each path against it shows the fragment layouts are right.
//
//   nvcc -std=c++17 -O2 -arch=sm_90a tools/device_mma_equiv.cu -o /tmp/mma_equiv && /tmp/mma_equiv [tiles]
// Prints mismatch counts; exit 0 when it ran (the answer is the counts, not the exit code).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

// e4m3 code -> value (host; no NaN codes are generated).
double e4m3_val(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

__device__ __forceinline__ uint32_t pack4(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

// two e4m3 codes -> f16x2 (exact), low half = first
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint8_t lo, uint8_t hi) {
  uint32_t h;
  const uint16_t two = uint16_t(lo) | uint16_t(hi) << 8;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(two));
  return h;
}
// f16x2 times 2^-k (exact while the values stay representable; k small)
__device__ __forceinline__ uint32_t scale_f16x2(uint32_t h, float s) {
  __half2 v = *reinterpret_cast<__half2*>(&h);
  v = __hmul2(v, __float2half2_rn(s));
  return *reinterpret_cast<uint32_t*>(&v);
}

// One warp per tile: A [16][32] e4m3 row-major, B [8][32] e4m3 (column n = row n of this array).
// out[tile][path][16][8] f32: path 0 = m16n8k32 e4m3 from zero; 1 = two m16n8k16 f16 chained
// (k 0..15 from zero, k 16..31 accumulating); 2 = the two from zero, then added in f32;
// 3 = path 1 with A's f16 values times 2^-8, the result times 2^8.
__global__ void mma_paths(const uint8_t* A, const uint8_t* B, int tiles, float* out) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (warp >= tiles) return;
  const uint8_t* a = A + size_t(warp) * 16 * 32;
  const uint8_t* b = B + size_t(warp) * 8 * 32;
  const int g = lane / 4, t = lane % 4;
  float d[4][4];
  {  // e4m3 k32: a0 (g, 4t..), a1 (g+8, 4t..), a2 (g, 16+4t..), a3 (g+8, 16+4t..); b0 (4t.., g), b1 (16+4t.., g)
    const uint32_t a0 = pack4(a + g * 32 + 4 * t), a1 = pack4(a + (g + 8) * 32 + 4 * t), a2 = pack4(a + g * 32 + 16 + 4 * t),
                   a3 = pack4(a + (g + 8) * 32 + 16 + 4 * t);
    const uint32_t b0 = pack4(b + g * 32 + 4 * t), b1 = pack4(b + g * 32 + 16 + 4 * t);
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
  }
  // f16 k16 fragments of the half h (k offset 16 h): a0 (g, 2t, 2t+1), a1 (g+8, ..), a2 (g, 2t+8, 2t+9), a3 (g+8, ..);
  // b0 (2t, 2t+1; g), b1 (2t+8, 2t+9; g)
  uint32_t fa[2][4], fb[2][2];
  for (int h = 0; h < 2; ++h) {
    const int k0 = 16 * h;
    fa[h][0] = e4m3x2_f16x2(a[g * 32 + k0 + 2 * t], a[g * 32 + k0 + 2 * t + 1]);
    fa[h][1] = e4m3x2_f16x2(a[(g + 8) * 32 + k0 + 2 * t], a[(g + 8) * 32 + k0 + 2 * t + 1]);
    fa[h][2] = e4m3x2_f16x2(a[g * 32 + k0 + 2 * t + 8], a[g * 32 + k0 + 2 * t + 9]);
    fa[h][3] = e4m3x2_f16x2(a[(g + 8) * 32 + k0 + 2 * t + 8], a[(g + 8) * 32 + k0 + 2 * t + 9]);
    fb[h][0] = e4m3x2_f16x2(b[g * 32 + k0 + 2 * t], b[g * 32 + k0 + 2 * t + 1]);
    fb[h][1] = e4m3x2_f16x2(b[g * 32 + k0 + 2 * t + 8], b[g * 32 + k0 + 2 * t + 9]);
  }
  auto mma16 = [](const uint32_t (&x)[4], const uint32_t (&y)[2], float (&acc)[4], bool zero) {
    if (zero) acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(y[0]), "r"(y[1]));
  };
  mma16(fa[0], fb[0], d[1], true);
  mma16(fa[1], fb[1], d[1], false);
  float lo[4], hi[4];
  mma16(fa[0], fb[0], lo, true);
  mma16(fa[1], fb[1], hi, true);
  for (int i = 0; i < 4; ++i) d[2][i] = lo[i] + hi[i];
  uint32_t sa[2][4];
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) sa[h][i] = scale_f16x2(fa[h][i], 1.0f / 256.0f);
  mma16(sa[0], fb[0], d[3], true);
  mma16(sa[1], fb[1], d[3], false);
  for (int i = 0; i < 4; ++i) d[3][i] *= 256.0f;
  // d[p][0..1]: row g, cols 2t, 2t+1; d[p][2..3]: row g+8
  for (int p = 0; p < 4; ++p) {
    float* o = out + (size_t(warp) * 4 + p) * 128;
    o[g * 8 + 2 * t] = d[p][0];
    o[g * 8 + 2 * t + 1] = d[p][1];
    o[(g + 8) * 8 + 2 * t] = d[p][2];
    o[(g + 8) * 8 + 2 * t + 1] = d[p][3];
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 100000;
  double val[256];
  for (int c = 0; c < 256; ++c) val[c] = e4m3_val(uint8_t(c));
  std::mt19937_64 rng(7);
  std::vector<uint8_t> A(size_t(tiles) * 512), B(size_t(tiles) * 256);
  // codes with every exponent, a share of tiles with wide exponent spreads and exact cancellations
  auto code = [&](int mode) -> uint8_t {
    uint8_t c = uint8_t(rng() & 0xFF);
    if ((c & 0x7F) == 0x7F) c &= 0xFE;  // no NaN
    if (mode == 1) c = uint8_t((c & 0x87) | ((2 + rng() % 4) << 3));  // narrow exponents: long carries
    return c;
  };
  for (int i = 0; i < tiles; ++i) {
    const int mode = int(rng() % 3);
    for (int j = 0; j < 512; ++j) A[size_t(i) * 512 + j] = code(mode);
    for (int j = 0; j < 256; ++j) B[size_t(i) * 256 + j] = code(mode);
  }
  uint8_t *dA, *dB;
  float* dO;
  cudaMalloc(&dA, A.size());
  cudaMalloc(&dB, B.size());
  cudaMalloc(&dO, size_t(tiles) * 4 * 128 * sizeof(float));
  cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice);
  mma_paths<<<(tiles * 32 + 255) / 256, 256>>>(dA, dB, tiles, dO);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("kernel failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<float> O(size_t(tiles) * 4 * 128);
  cudaMemcpy(O.data(), dO, O.size() * sizeof(float), cudaMemcpyDeviceToHost);
  long long differ[4] = {0, 0, 0, 0}, not_exact[4] = {0, 0, 0, 0}, total = 0;
  double worst_rel[4] = {0, 0, 0, 0};
  for (int i = 0; i < tiles; ++i)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double s = 0;
        for (int k = 0; k < 32; ++k) s += val[A[size_t(i) * 512 + m * 32 + k]] * val[B[size_t(i) * 256 + n * 32 + k]];
        ++total;
        uint32_t b0;
        std::memcpy(&b0, &O[(size_t(i) * 4 + 0) * 128 + m * 8 + n], 4);
        for (int p = 0; p < 4; ++p) {
          const float v = O[(size_t(i) * 4 + p) * 128 + m * 8 + n];
          uint32_t bp;
          std::memcpy(&bp, &v, 4);
          if (bp != b0) ++differ[p];
          if (double(v) != double(float(s))) ++not_exact[p];
          worst_rel[p] = std::max(worst_rel[p], std::fabs(double(v) - s) / std::max(1e-30, std::fabs(s)));
        }
      }
  const char* name[4] = {"k32 e4m3 (tiles)", "2 x k16 f16 chained (rs)", "2 x k16 f16, f32 add", "rs with A x 2^-8, out x 2^8"};
  std::printf("%lld outputs of %d random 16x8x32 tiles\n", total, tiles);
  for (int p = 0; p < 4; ++p)
    std::printf("  %-28s bits differ from k32 e4m3: %lld; differ from the exact sum rounded to f32: %lld; worst relative error %.3g\n", name[p],
                differ[p], not_exact[p], worst_rel[p]);
  return 0;
}
