// X along K (1x128 scales) and X^T along M (128x1 scales, written transposed) from one read of X:
// the both-layouts token quantizer of kernels/quant.py, in CUDA C++.
//
// Why CUDA here, where the single-layout quantizers stay in Triton: this kernel needs each 128x128
// bf16 tile reduced along both axes and written out in both orientations. Triton keeps the tile in
// registers and transposes through layout conversions it chooses itself; every Triton design we
// tried (one fused tile, two chunked passes, row and column programs reading X twice, grouped for
// L2) stayed at 44-71% of copy bandwidth on an H100 (BENCHMARKS.md). Here the tile goes through
// shared memory once, laid out for conflict-free column reads, and the transposed FP8 bytes are
// staged so that every store is a full 128-byte line.
//
// Bits: identical to the PyTorch reference (quantize.py) and to the Triton kernels: amax with NaN as
// +inf, scale = RN(amax / fmax) (UE8M0: 2^ceil(log2) from the bits; 0 -> 1; inf -> NaN), quotient
// x * 2^-e for UE8M0 (exact) or IEEE division for FP32 scales, saturating round-to-nearest-even cast
// (the cvt.rn.satfinite instruction Triton's casts lower to as well).
//
// Shapes: M and K multiples of 128, rows 16-byte aligned (the caller checks and falls back to Triton).
// Layouts (those scaled_mm reads): q [M, K]; s (M, K/128) at s[kb * M + m]; qt [K, M];
// st (K, M/128) at st[mb * K + k].
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_common.cuh"

namespace {

using namespace infir_fp8;

constexpr int TILE = 128;
constexpr int THREADS = 256;
constexpr int XS_PITCH = TILE + 8;     // bf16 elements per shared row: 16-byte rows, conflict-free word columns
constexpr int QS_PITCH = TILE + 16;    // bytes per staged FP8 row of X^T
constexpr int XS_BYTES = TILE * XS_PITCH * 2, QS_BYTES = TILE * QS_PITCH;
constexpr int SMEM_BYTES = XS_BYTES + QS_BYTES + 4 * TILE * 4;  // 55,296: four blocks fit an SM

// 1/s for UE8M0 scales (a power of two, 1, or NaN): exact, so x * inv is the rounded quotient.
__device__ __forceinline__ float inv_pow2(float s) {
  int e = ((__float_as_int(s) >> 23) & 0xFF) - 127;
  return s != s ? s : exp2i(-e);
}

template <bool UE8M0>
__device__ __forceinline__ float quot(float x, float s, float inv) {
  return UE8M0 ? x * inv : __fdiv_rn(x, s);
}

// LOADS: 16-byte loads in flight per thread in the row phase (4 or 8; 8 rows of 16 per thread).
template <bool UE8M0, bool E5M2, int LOADS>
__global__ void __launch_bounds__(THREADS) quant_token_both(
    const __nv_bfloat16* __restrict__ x, long long ldx, uint8_t* __restrict__ q, float* __restrict__ s,
    uint8_t* __restrict__ qt, float* __restrict__ st, int M, int K) {
  constexpr float FMAX = E5M2 ? 57344.f : 448.f;
  // dynamic shared memory (SMEM_BYTES, over the 48 KB static limit): the bf16 tile, X^T's FP8
  // bytes staged for full-line stores, and the column maxima of each quarter of the rows
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16(*xs)[XS_PITCH] = reinterpret_cast<__nv_bfloat16(*)[XS_PITCH]>(smem);
  uint8_t(*qs)[QS_PITCH] = reinterpret_cast<uint8_t(*)[QS_PITCH]>(smem + XS_BYTES);
  float(*col_amax)[TILE] = reinterpret_cast<float(*)[TILE]>(smem + XS_BYTES + QS_BYTES);

  const int kb = blockIdx.x, mb = blockIdx.y, tid = threadIdx.x;
  const long long m0 = (long long)mb * TILE, k0 = (long long)kb * TILE;

  // Rows: 16 lanes per row, 8 bf16 each; a warp covers two rows per step, eight steps, LOADS of
  // them loaded before any is processed.
  const int seg = tid & 15, rsub = tid >> 4;
#pragma unroll
  for (int part = 0; part < 8 / LOADS; ++part) {
    uint4 v[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int r = rsub + 16 * (LOADS * part + i);
      v[i] = __ldg(reinterpret_cast<const uint4*>(x + (m0 + r) * ldx + k0 + seg * 8));
    }
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int r = rsub + 16 * (LOADS * part + i);
      *reinterpret_cast<uint4*>(&xs[r][seg * 8]) = v[i];
      const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      float f[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float2 p = bf16x2_to_float2(w[j]);
        f[2 * j] = p.x;
        f[2 * j + 1] = p.y;
      }
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) a = fmaxf(a, abs_nan_inf(f[j]));
#pragma unroll
      for (int o = 8; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      const float sc = scale_from_amax<UE8M0>(a, FMAX);
      const float inv = UE8M0 ? inv_pow2(sc) : 0.f;
      uint2 out;
      out.x = fp8x2<E5M2>(quot<UE8M0>(f[0], sc, inv), quot<UE8M0>(f[1], sc, inv)) |
              (fp8x2<E5M2>(quot<UE8M0>(f[2], sc, inv), quot<UE8M0>(f[3], sc, inv)) << 16);
      out.y = fp8x2<E5M2>(quot<UE8M0>(f[4], sc, inv), quot<UE8M0>(f[5], sc, inv)) |
              (fp8x2<E5M2>(quot<UE8M0>(f[6], sc, inv), quot<UE8M0>(f[7], sc, inv)) << 16);
      *reinterpret_cast<uint2*>(q + (m0 + r) * K + k0 + seg * 8) = out;
      if (seg == 0) s[(long long)kb * M + m0 + r] = sc;
    }
  }
  __syncthreads();

  // Columns: a thread owns a pair of adjacent columns (one 32-bit word per row) over a quarter of
  // the tile's rows; a warp reads 32 consecutive words of a row (no bank conflicts). Two passes
  // over shared memory (amax, then quantize) keep the registers low enough for four blocks an SM.
  const int warp = tid >> 5, lane = tid & 31;
  const int cp = (warp & 1) * 32 + lane;   // column pair 0..63
  const int quarter = warp >> 1;           // rows quarter*32 .. +32
  const uint32_t* col = reinterpret_cast<const uint32_t*>(&xs[quarter * 32][2 * cp]);
  constexpr int WORDS_PER_ROW = XS_PITCH / 2;
  float a0 = 0.f, a1 = 0.f;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    float2 p = bf16x2_to_float2(col[j * WORDS_PER_ROW]);
    a0 = fmaxf(a0, abs_nan_inf(p.x));
    a1 = fmaxf(a1, abs_nan_inf(p.y));
  }
  *reinterpret_cast<float2*>(&col_amax[quarter][2 * cp]) = make_float2(a0, a1);
  __syncthreads();
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    float2 p = *reinterpret_cast<const float2*>(&col_amax[t][2 * cp]);
    a0 = fmaxf(a0, p.x);
    a1 = fmaxf(a1, p.y);
  }
  const float s0 = scale_from_amax<UE8M0>(a0, FMAX), s1 = scale_from_amax<UE8M0>(a1, FMAX);
  const float i0 = UE8M0 ? inv_pow2(s0) : 0.f, i1 = UE8M0 ? inv_pow2(s1) : 0.f;
  if (quarter == 0) *reinterpret_cast<float2*>(st + m0 / TILE * K + k0 + 2 * cp) = make_float2(s0, s1);
  // X^T rows 2cp and 2cp+1, bytes quarter*32 .. +32 of each, staged in shared memory 16 at a time
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t p0[4], p1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v0[4], v1[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float2 p = bf16x2_to_float2(col[(16 * h + 4 * j + u) * WORDS_PER_ROW]);
        v0[u] = quot<UE8M0>(p.x, s0, i0);
        v1[u] = quot<UE8M0>(p.y, s1, i1);
      }
      p0[j] = fp8x2<E5M2>(v0[0], v0[1]) | (fp8x2<E5M2>(v0[2], v0[3]) << 16);
      p1[j] = fp8x2<E5M2>(v1[0], v1[1]) | (fp8x2<E5M2>(v1[2], v1[3]) << 16);
    }
    *reinterpret_cast<uint4*>(&qs[2 * cp][quarter * 32 + 16 * h]) = make_uint4(p0[0], p0[1], p0[2], p0[3]);
    *reinterpret_cast<uint4*>(&qs[2 * cp + 1][quarter * 32 + 16 * h]) = make_uint4(p1[0], p1[1], p1[2], p1[3]);
  }
  __syncthreads();
  // Full 128-byte lines of X^T: 8 threads per row, 32 rows per pass.
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int r = (tid >> 3) + 32 * p, b = (tid & 7) * 16;
    *reinterpret_cast<uint4*>(qt + (k0 + r) * M + m0 + b) = *reinterpret_cast<const uint4*>(&qs[r][b]);
  }
}

template <bool UE8M0, bool E5M2>
cudaError_t launch(const void* x, long long ldx, void* q, void* s, void* qt, void* st, int M, int K,
                   int loads, cudaStream_t stream) {
  dim3 grid(K / TILE, M / TILE);
  auto kernel = loads >= 8 ? quant_token_both<UE8M0, E5M2, 8> : quant_token_both<UE8M0, E5M2, 4>;
  kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(
      static_cast<const __nv_bfloat16*>(x), ldx, static_cast<uint8_t*>(q), static_cast<float*>(s),
      static_cast<uint8_t*>(qt), static_cast<float*>(st), M, K);
  return cudaGetLastError();
}

template <bool UE8M0, bool E5M2, int LOADS>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(quant_token_both<UE8M0, E5M2, LOADS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              SMEM_BYTES);
}

}  // namespace

// Once per device, before its first launch: a kernel must opt in to over 48 KB of shared memory
// (a driver call, kept off the per-launch path).
extern "C" int infir_quant_token_both_init() {
  const cudaError_t errs[] = {allow_smem<true, true, 4>(),   allow_smem<true, false, 4>(), allow_smem<false, true, 4>(),
                              allow_smem<false, false, 4>(), allow_smem<true, true, 8>(),  allow_smem<true, false, 8>(),
                              allow_smem<false, true, 8>(),  allow_smem<false, false, 8>()};
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return (int)e;
  return 0;
}

// The entry point Python calls through ctypes (kernels/cuda_build.py). Returns a cudaError_t.
// loads: the row phase's loads in flight per thread (4 or 8, see LOADS).
extern "C" int infir_quant_token_both(const void* x, long long ldx, void* q, void* s, void* qt, void* st,
                                      int M, int K, int ue8m0, int e5m2, int loads, void* stream) {
  if (M % TILE || K % TILE || M <= 0 || K <= 0) return (int)cudaErrorInvalidValue;
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  auto go = ue8m0 ? (e5m2 ? launch<true, true> : launch<true, false>) : (e5m2 ? launch<false, true> : launch<false, false>);
  return (int)go(x, ldx, q, s, qt, st, M, K, loads, cs);
}
