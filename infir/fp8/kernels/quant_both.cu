// X along K (1x128 scales) and X^T along M (128x1 scales, written transposed) from one read of X:
// the both-layouts token quantizer of kernels/quant_token.py, in CUDA C++.
//
// Why CUDA here, where the single-layout quantizers stay in Triton: this kernel needs each 128x128
// bf16 tile reduced along both axes and written out in both orientations. Triton keeps the tile in
// registers and transposes through layout conversions it chooses itself; every Triton design we
// tried (one fused tile, two chunked passes, row and column programs reading X twice, grouped for
// L2) stayed well under copy bandwidth on an H100 (bench/quant.py measures it). Here the tile goes through
// shared memory once, laid out for conflict-free column reads, and the transposed FP8 bytes are
// staged so that every store is a full 128-byte line.
//
// Bits: identical to the PyTorch reference (quantize.py) and to the Triton kernels: amax with NaN as
// +inf, scale = RN(amax / fmax) (UE8M0: 2^ceil(log2) from the bits; 0 -> 1; inf -> NaN), quotient
// x * 2^-e for UE8M0 (exact) or IEEE division for FP32 scales, saturating round-to-nearest-even cast
// (the cvt.rn.satfinite instruction Triton's casts lower to as well).
//
// The same kernel also quantizes SwiGLU's backward as it computes it (infir_swiglu_bwd_quant_both):
// dh = [dgate, dup] of y = silu(gate) * up, from SwiGLU's FP8 copy of h and dY, rounded to bf16 and
// quantized into FC1's dgrad and wgrad operands without ever being written. Unfused, dh went out in
// bf16 and came back for the quantizer: at Qwen2.5-1.5B (ffn 8960) the widest operand of the layer.
// A block holds gate's and up's tiles of the same 128 columns (512 threads, two blocks an SM), so
// every input is read and every sigmoid computed once. The values are swiglu.swiglu_backward's in
// float32, op by op, but for the sigmoid's fast exp and division (__expf, __fdividef: 2 ulp): with
// the IEEE pair the kernel was instruction-bound, slower than the unfused pair (bench/quant.py
// --swiglu). After the bf16 and FP8 roundings the bytes rarely differ from the
// reference's (tests/fp8/test_swiglu.py bounds how rarely).
//
// And SwiGLU's forward (infir_swiglu_fwd_quant_both): y = silu(gate) * up from h = FC1's bf16 output,
// quantized into FC2's fprop and wgrad operands, with h's FP8 copy for the backward written on the way
// (the row quantizer's bytes). Unfused, y went out in bf16 and came back for FC2's quantizer: a third
// of the pair's traffic. y's values are the Triton forward's (swiglu.py's kernel): silu rounded to bf16,
// then the product; the exp and division are the fast ones, as there.
//
// Shapes: M and K multiples of 128, rows 16-byte aligned (the caller checks and falls back to Triton).
// Layouts (those scaled_mm reads): q [M, K]; s (M, K/128) at s[kb * M + m]; qt [K, M];
// st (K, M/128) at st[mb * K + k].
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_common.cuh"

namespace {

using namespace infir_fp8;

constexpr int TILE = 128;
constexpr int TILE_THREADS = 256;      // threads per 128x128 tile a block quantizes
constexpr int XS_PITCH = TILE + 8;     // bf16 elements per shared row: 16-byte rows, conflict-free word columns
constexpr int QS_PITCH = TILE + 16;    // bytes per staged FP8 row of X^T
constexpr int XS_BYTES = TILE * XS_PITCH * 2, QS_BYTES = TILE * QS_PITCH;
static_assert(QS_BYTES <= XS_BYTES, "X^T's staged bytes reuse the bf16 tile's shared memory");
constexpr int TILE_SMEM = XS_BYTES + 4 * TILE * 4;  // 36,864 a tile: five plain tiles (registers allow five) fit an SM

// 1/s for UE8M0 scales (a power of two, 1, or NaN): exact, so x * inv is the rounded quotient.
__device__ __forceinline__ float inv_pow2(float s) {
  int e = ((__float_as_int(s) >> 23) & 0xFF) - 127;
  return s != s ? s : exp2i(-e);
}

template <bool UE8M0>
__device__ __forceinline__ float quot(float x, float s, float inv) {
  return UE8M0 ? x * inv : __fdiv_rn(x, s);
}

// 8 values of a row of 128, its other 120 in the 15 lanes beside this one (lanes 16-aligned): the
// row's amax over the 16 lanes, its scale (stored by the row's first lane), the 8 FP8 bytes.
template <bool UE8M0, bool E5M2>
__device__ __forceinline__ void quant_row8(const uint4& v, uint8_t* dst, float* s_dst, bool first_lane) {
  constexpr float FMAX = E5M2 ? 57344.f : 448.f;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float f[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 p = bf16x2_to_float2(w[j]);
    f[2 * j] = p.x;
    f[2 * j + 1] = p.y;
  }
  const uint32_t m = bf16x2_max_nan(bf16x2_max_nan(v.x & BF16X2_ABS, v.y & BF16X2_ABS),
                                    bf16x2_max_nan(v.z & BF16X2_ABS, v.w & BF16X2_ABS));
  const float2 mh = bf16x2_to_float2(m);
  float a = fmaxf(abs_nan_inf(mh.x), abs_nan_inf(mh.y));
#pragma unroll
  for (int o = 8; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float sc = scale_from_amax<UE8M0>(a, FMAX);
  const float inv = UE8M0 ? inv_pow2(sc) : 0.f;
  uint2 out;
  out.x = fp8x2<E5M2>(quot<UE8M0>(f[0], sc, inv), quot<UE8M0>(f[1], sc, inv)) |
          (fp8x2<E5M2>(quot<UE8M0>(f[2], sc, inv), quot<UE8M0>(f[3], sc, inv)) << 16);
  out.y = fp8x2<E5M2>(quot<UE8M0>(f[4], sc, inv), quot<UE8M0>(f[5], sc, inv)) |
          (fp8x2<E5M2>(quot<UE8M0>(f[6], sc, inv), quot<UE8M0>(f[7], sc, inv)) << 16);
  *reinterpret_cast<uint2*>(dst) = out;
  if (first_lane) *s_dst = sc;
}

// Where a block's TILES 128x128 bf16 tiles come from. For each row and 8 consecutive columns of its
// tiles, a source loads the inputs (load), then makes the 8 bf16 values of every tile (values: given
// the row, the launch's column index and the column, for side outputs). out_block(bx, t): the
// output's 128-column block of tile t for the launch's column index bx. LOADS_LO / LOADS_HI: the two
// LOADS the launcher instantiates (more rows ahead than the registers hold would spill).

// X itself: one tile a block.
struct Bf16Rows {
  static constexpr int TILES = 1, LOADS_LO = 4, LOADS_HI = 8, BLOCKS_PER_SM = 5;
  const __nv_bfloat16* x;
  long long ldx;
  using Raw = uint4;
  __device__ __forceinline__ int out_block(int bx, int) const { return bx; }
  __device__ __forceinline__ Raw load(long long m, int bx, int c) const {
    return __ldg(reinterpret_cast<const uint4*>(x + m * ldx + (long long)bx * TILE + c));
  }
  __device__ __forceinline__ void values(const Raw& r, uint4 (&v)[TILES], long long, int, int) const { v[0] = r; }
};

__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t v, bool e5m2) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, e5m2 ? __NV_E5M2 : __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

// dh = [dgate, dup] of SwiGLU y = silu(g) * u, h = [g, u] ([M, 2F], F = nfb * 128), from h's FP8 copy
// (1x128 scales, row-major [M, 2F/128]) and dY [M, F]: block j's two tiles are dgate's block j and
// dup's block nfb + j, so each input is read once and each sigmoid computed once.
struct SwigluBwdRows {
  static constexpr int TILES = 2, LOADS_LO = 2, LOADS_HI = 4, BLOCKS_PER_SM = 2;
  const uint8_t* qh;
  const float* sh;
  const __nv_bfloat16* dy;
  long long ldy;
  int nfb;
  bool h_e5m2;
  struct Raw {
    uint2 g, u;
    uint4 d;
    float sg, su;
  };
  __device__ __forceinline__ int out_block(int bx, int t) const { return t * nfb + bx; }
  __device__ __forceinline__ Raw load(long long m, int j, int c) const {
    const long long F = (long long)nfb * TILE, col = (long long)j * TILE + c;
    Raw r;
    r.g = __ldg(reinterpret_cast<const uint2*>(qh + m * 2 * F + col));
    r.u = __ldg(reinterpret_cast<const uint2*>(qh + m * 2 * F + F + col));
    r.d = __ldg(reinterpret_cast<const uint4*>(dy + m * ldy + col));
    r.sg = __ldg(sh + m * 2 * nfb + j);
    r.su = __ldg(sh + m * 2 * nfb + nfb + j);
    return r;
  }
  __device__ __forceinline__ void values(const Raw& r, uint4 (&v)[TILES], long long, int, int) const {
    const uint32_t gw[2] = {r.g.x, r.g.y}, uw[2] = {r.u.x, r.u.y}, dw[4] = {r.d.x, r.d.y, r.d.z, r.d.w};
    uint32_t dg[4], du[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 g2 = fp8x2_to_float2(uint16_t(gw[i / 2] >> (16 * (i & 1))), h_e5m2);
      const float2 u2 = fp8x2_to_float2(uint16_t(uw[i / 2] >> (16 * (i & 1))), h_e5m2);
      const float2 d2 = bf16x2_to_float2(dw[i]);
      const float gs[2] = {g2.x, g2.y}, us[2] = {u2.x, u2.y}, ds[2] = {d2.x, d2.y};
      float a[2], b[2];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        // swiglu_backward's ops, each rounded as torch rounds it, but for the sigmoid: the fast
        // exp and division (2 ulp), the accurate pair (IEEE division) made the kernel instruction-bound
        const float g = __fmul_rn(gs[t], r.sg), u = __fmul_rn(us[t], r.su);
        const float sig = __fdividef(1.f, __fadd_rn(1.f, __expf(-g)));
        a[t] = __fmul_rn(__fmul_rn(__fmul_rn(ds[t], u), sig), __fadd_rn(1.f, __fmul_rn(g, __fsub_rn(1.f, sig))));
        b[t] = __fmul_rn(ds[t], __fmul_rn(g, sig));
      }
      const __nv_bfloat162 pa = __floats2bfloat162_rn(a[0], a[1]), pb = __floats2bfloat162_rn(b[0], b[1]);
      dg[i] = *reinterpret_cast<const uint32_t*>(&pa);
      du[i] = *reinterpret_cast<const uint32_t*>(&pb);
    }
    v[0] = make_uint4(dg[0], dg[1], dg[2], dg[3]);
    v[1] = make_uint4(du[0], du[1], du[2], du[3]);
  }
};

// y = silu(g) * u of SwiGLU, h = [g, u] ([M, 2F] bf16, row stride ldh, F = nfb * 128): block j's tile
// is y's block j, from h's blocks j and nfb + j, which it also writes as h's FP8 copy for the
// backward (1x128 scales, qh [M, 2F], sh [M, 2F/128] row-major, in h's own formats).
struct SwigluFwdRows {
  static constexpr int TILES = 1, LOADS_LO = 2, LOADS_HI = 4, BLOCKS_PER_SM = 4;
  const __nv_bfloat16* h;
  long long ldh;
  int nfb;
  uint8_t* qh;
  float* sh;
  bool h_ue8m0, h_e5m2;
  struct Raw {
    uint4 g, u;
  };
  __device__ __forceinline__ int out_block(int bx, int) const { return bx; }
  __device__ __forceinline__ Raw load(long long m, int j, int c) const {
    const __nv_bfloat16* row = h + m * ldh + (long long)j * TILE + c;
    return Raw{__ldg(reinterpret_cast<const uint4*>(row)),
               __ldg(reinterpret_cast<const uint4*>(row + (long long)nfb * TILE))};
  }
  __device__ __forceinline__ void store_h(const uint4& v, long long m, int block, int c) const {
    uint8_t* dst = qh + m * 2 * nfb * TILE + (long long)block * TILE + c;
    float* s_dst = sh + m * 2 * nfb + block;
    if (h_ue8m0)
      h_e5m2 ? quant_row8<true, true>(v, dst, s_dst, c == 0) : quant_row8<true, false>(v, dst, s_dst, c == 0);
    else
      h_e5m2 ? quant_row8<false, true>(v, dst, s_dst, c == 0) : quant_row8<false, false>(v, dst, s_dst, c == 0);
  }
  __device__ __forceinline__ void values(const Raw& r, uint4 (&v)[TILES], long long m, int j, int c) const {
    store_h(r.g, m, j, c);
    store_h(r.u, m, nfb + j, c);
    const uint32_t gw[4] = {r.g.x, r.g.y, r.g.z, r.g.w}, uw[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
    uint32_t y[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 g2 = bf16x2_to_float2(gw[i]), u2 = bf16x2_to_float2(uw[i]);
      // silu rounded to bf16 (torch's activation dtype), then the product rounded
      const float s0 = __bfloat162float(__float2bfloat16_rn(__fdividef(g2.x, __fadd_rn(1.f, __expf(-g2.x)))));
      const float s1 = __bfloat162float(__float2bfloat16_rn(__fdividef(g2.y, __fadd_rn(1.f, __expf(-g2.y)))));
      const __nv_bfloat162 p = __floats2bfloat162_rn(__fmul_rn(s0, u2.x), __fmul_rn(s1, u2.y));
      y[i] = *reinterpret_cast<const uint32_t*>(&p);
    }
    v[0] = make_uint4(y[0], y[1], y[2], y[3]);
  }
};

// One block: Src::TILES tiles of 128 rows x 128 columns, 256 threads a tile. LOADS: rows loaded per
// thread before any is processed (of its 8 / TILES: 4 or 8 for X, 2 or 4 for SwiGLU's backward).
template <class Src, bool UE8M0, bool E5M2, int LOADS>
__global__ void __launch_bounds__(TILE_THREADS * Src::TILES, Src::BLOCKS_PER_SM) quant_token_both(
    const Src src, uint8_t* __restrict__ q, float* __restrict__ s,
    uint8_t* __restrict__ qt, float* __restrict__ st, int M, int K) {
  constexpr int T = Src::TILES;
  static_assert((8 / T) % LOADS == 0, "LOADS must divide the row steps");
  constexpr float FMAX = E5M2 ? 57344.f : 448.f;
  // dynamic shared memory (TILE_SMEM a tile, over the 48 KB static limit): per tile, the bf16 values
  // (then, over them, X^T's FP8 bytes staged for full-line stores) and the column maxima of each
  // quarter of the rows
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, bx = blockIdx.x, mb = blockIdx.y;
  const long long m0 = (long long)mb * TILE;

  // Rows: 16 lanes per row, 8 values each; a step covers 16 * T rows, 8 / T steps, LOADS of them
  // loaded before any is processed.
  const int seg = tid & 15, rsub = tid >> 4;
  constexpr int STEPS = 8 / T;
#pragma unroll
  for (int part = 0; part < STEPS / LOADS; ++part) {
    typename Src::Raw raw[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) raw[i] = src.load(m0 + rsub + 16 * T * (LOADS * part + i), bx, seg * 8);
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int r = rsub + 16 * T * (LOADS * part + i);
      uint4 vals[T];
      src.values(raw[i], vals, m0 + r, bx, seg * 8);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        __nv_bfloat16(*xs)[XS_PITCH] = reinterpret_cast<__nv_bfloat16(*)[XS_PITCH]>(smem + t * TILE_SMEM);
        const long long k0 = (long long)src.out_block(bx, t) * TILE;
        *reinterpret_cast<uint4*>(&xs[r][seg * 8]) = vals[t];
        quant_row8<UE8M0, E5M2>(vals[t], q + (m0 + r) * K + k0 + seg * 8, s + k0 / TILE * M + m0 + r, seg == 0);
      }
    }
  }
  __syncthreads();

  // Columns: each tile's 256 threads. A thread owns a pair of adjacent columns (one 32-bit word per
  // row) over a quarter of the tile's rows; a warp reads 32 consecutive words of a row (no bank
  // conflicts). Two passes over shared memory (amax, then quantize) keep the registers low enough
  // for Src::BLOCKS_PER_SM blocks an SM.
  const int tile = tid / TILE_THREADS, ttid = tid % TILE_THREADS;
  unsigned char* tsm = smem + tile * TILE_SMEM;
  __nv_bfloat16(*xs)[XS_PITCH] = reinterpret_cast<__nv_bfloat16(*)[XS_PITCH]>(tsm);
  uint8_t(*qs)[QS_PITCH] = reinterpret_cast<uint8_t(*)[QS_PITCH]>(tsm);  // over xs, once it is read
  float(*col_amax)[TILE] = reinterpret_cast<float(*)[TILE]>(tsm + XS_BYTES);
  const long long k0 = (long long)src.out_block(bx, tile) * TILE;
  const int warp = ttid >> 5, lane = ttid & 31;
  const int cp = (warp & 1) * 32 + lane;   // column pair 0..63
  const int quarter = warp >> 1;           // rows quarter*32 .. +32
  const uint32_t* col = reinterpret_cast<const uint32_t*>(&xs[quarter * 32][2 * cp]);
  constexpr int WORDS_PER_ROW = XS_PITCH / 2;
  uint32_t m = 0;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) m = bf16x2_max_nan(m, col[j * WORDS_PER_ROW] & BF16X2_ABS);
  const float2 mh = bf16x2_to_float2(m);
  float a0 = abs_nan_inf(mh.x), a1 = abs_nan_inf(mh.y);
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
  // X^T rows 2cp and 2cp+1, bytes quarter*32 .. +32 of each: quantized into registers, then, once
  // every thread has read its columns, staged in shared memory over the bf16 tile
  uint32_t p0[2][4], p1[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v0[4], v1[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float2 p = bf16x2_to_float2(col[(16 * h + 4 * j + u) * WORDS_PER_ROW]);
        v0[u] = quot<UE8M0>(p.x, s0, i0);
        v1[u] = quot<UE8M0>(p.y, s1, i1);
      }
      p0[h][j] = fp8x2<E5M2>(v0[0], v0[1]) | (fp8x2<E5M2>(v0[2], v0[3]) << 16);
      p1[h][j] = fp8x2<E5M2>(v1[0], v1[1]) | (fp8x2<E5M2>(v1[2], v1[3]) << 16);
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    *reinterpret_cast<uint4*>(&qs[2 * cp][quarter * 32 + 16 * h]) = make_uint4(p0[h][0], p0[h][1], p0[h][2], p0[h][3]);
    *reinterpret_cast<uint4*>(&qs[2 * cp + 1][quarter * 32 + 16 * h]) = make_uint4(p1[h][0], p1[h][1], p1[h][2], p1[h][3]);
  }
  __syncthreads();
  // Full 128-byte lines of X^T: 8 threads per row, 32 rows per pass.
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int r = (ttid >> 3) + 32 * p, b = (ttid & 7) * 16;
    *reinterpret_cast<uint4*>(qt + (k0 + r) * M + m0 + b) = *reinterpret_cast<const uint4*>(&qs[r][b]);
  }
}

template <class Src, bool UE8M0, bool E5M2, int LOADS>
cudaError_t launch_one(const Src& src, int grid_x, void* q, void* s, void* qt, void* st, int M, int K,
                       cudaStream_t stream) {
  quant_token_both<Src, UE8M0, E5M2, LOADS><<<dim3(grid_x, M / TILE), TILE_THREADS * Src::TILES,
                                              TILE_SMEM * Src::TILES, stream>>>(
      src, static_cast<uint8_t*>(q), static_cast<float*>(s), static_cast<uint8_t*>(qt), static_cast<float*>(st), M, K);
  return cudaGetLastError();
}

template <class Src, bool UE8M0, bool E5M2>
cudaError_t launch(const Src& src, int grid_x, void* q, void* s, void* qt, void* st, int M, int K, int loads,
                   cudaStream_t stream) {
  return loads >= Src::LOADS_HI ? launch_one<Src, UE8M0, E5M2, Src::LOADS_HI>(src, grid_x, q, s, qt, st, M, K, stream)
                                : launch_one<Src, UE8M0, E5M2, Src::LOADS_LO>(src, grid_x, q, s, qt, st, M, K, stream);
}

template <class Src>
cudaError_t launch_any(const Src& src, int grid_x, void* q, void* s, void* qt, void* st, int M, int K, int ue8m0,
                       int e5m2, int loads, cudaStream_t stream) {
  auto go = ue8m0 ? (e5m2 ? launch<Src, true, true> : launch<Src, true, false>)
                  : (e5m2 ? launch<Src, false, true> : launch<Src, false, false>);
  return go(src, grid_x, q, s, qt, st, M, K, loads, stream);
}

template <class Src, bool UE8M0, bool E5M2, int LOADS>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(quant_token_both<Src, UE8M0, E5M2, LOADS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              TILE_SMEM * Src::TILES);
}

template <class Src, int LOADS>
cudaError_t allow_smem_all() {
  const cudaError_t errs[] = {allow_smem<Src, true, true, LOADS>(), allow_smem<Src, true, false, LOADS>(),
                              allow_smem<Src, false, true, LOADS>(), allow_smem<Src, false, false, LOADS>()};
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace

// Once per device, before its first launch: a kernel must opt in to over 48 KB of shared memory
// (a driver call, kept off the per-launch path).
extern "C" int infir_quant_token_both_init() {
  const cudaError_t errs[] = {allow_smem_all<Bf16Rows, 4>(),      allow_smem_all<Bf16Rows, 8>(),
                              allow_smem_all<SwigluBwdRows, 2>(), allow_smem_all<SwigluBwdRows, 4>(),
                              allow_smem_all<SwigluFwdRows, 2>(), allow_smem_all<SwigluFwdRows, 4>()};
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return (int)e;
  return 0;
}

// The entry point Python calls through ctypes (kernels/cuda_build.py). Returns a cudaError_t.
// loads: the row phase's rows loaded ahead per thread (see LOADS).
extern "C" int infir_quant_token_both(const void* x, long long ldx, void* q, void* s, void* qt, void* st,
                                      int M, int K, int ue8m0, int e5m2, int loads, void* stream) {
  if (M % TILE || K % TILE || M <= 0 || K <= 0) return (int)cudaErrorInvalidValue;
  const Bf16Rows src{static_cast<const __nv_bfloat16*>(x), ldx};
  return (int)launch_any(src, K / TILE, q, s, qt, st, M, K, ue8m0, e5m2, loads, static_cast<cudaStream_t>(stream));
}

// dh of SwiGLU (SwigluBwdRows) quantized in both layouts, K = 2F: q [M, 2F], s, qt [2F, M], st laid
// out as infir_quant_token_both's. qh [M, 2F] and sh [M, 2F/128] (row-major): SwiGLU's saved copy
// of h, in E5M2 if h_e5m2 else E4M3; dy [M, F] with row stride ldy.
extern "C" int infir_swiglu_bwd_quant_both(const void* qh, const void* sh, int h_e5m2, const void* dy, long long ldy,
                                           void* q, void* s, void* qt, void* st, int M, int F, int ue8m0, int e5m2,
                                           int loads, void* stream) {
  if (M % TILE || F % TILE || M <= 0 || F <= 0) return (int)cudaErrorInvalidValue;
  const SwigluBwdRows src{static_cast<const uint8_t*>(qh), static_cast<const float*>(sh),
                          static_cast<const __nv_bfloat16*>(dy), ldy, F / TILE, h_e5m2 != 0};
  return (int)launch_any(src, F / TILE, q, s, qt, st, M, 2 * F, ue8m0, e5m2, loads,
                         static_cast<cudaStream_t>(stream));
}

// SwiGLU's output y [M, F] (SwigluFwdRows) quantized in both layouts, laid out as
// infir_quant_token_both's, from h [M, 2F] bf16 (row stride ldh); h's FP8 copy to qh [M, 2F] and
// sh [M, 2F/128] (row-major), with UE8M0 scales if h_ue8m0, in E5M2 if h_e5m2.
extern "C" int infir_swiglu_fwd_quant_both(const void* h, long long ldh, void* qh, void* sh, int h_ue8m0, int h_e5m2,
                                           void* q, void* s, void* qt, void* st, int M, int F, int ue8m0, int e5m2,
                                           int loads, void* stream) {
  if (M % TILE || F % TILE || M <= 0 || F <= 0) return (int)cudaErrorInvalidValue;
  const SwigluFwdRows src{static_cast<const __nv_bfloat16*>(h), ldh, F / TILE, static_cast<uint8_t*>(qh),
                          static_cast<float*>(sh), h_ue8m0 != 0, h_e5m2 != 0};
  return (int)launch_any(src, F / TILE, q, s, qt, st, M, F, ue8m0, e5m2, loads, static_cast<cudaStream_t>(stream));
}
