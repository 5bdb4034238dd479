// MOSS two-level rows (quantize.quantize_two_level_ref, and fold_two_level of it) in CUDA C++:
// one FP32 scale per row (row amax / fmax), one E8M0 power of two per group of 32.
//
// Why CUDA here: the row scale depends on the whole row, so Triton's kernel reads each row twice
// (an amax pass, then a quantize pass served partly from L2) and stayed under copy bandwidth
// on an H100 (bench/quant.py measures it). Here one block holds a row, in its threads' registers up to 8192
// elements and in shared memory beyond: one read from HBM.
//
// Bits: identical to the reference and to _quant_two_level_kernel: s = RN(row amax / fmax) in the
// scale format; per group s_i = RN(amax_i / fmax), e = ceil(log2(RN(s_i / s))) (0 for an all-zero
// group), effective scale s * 2^e (NaN and code 255 for a row holding inf/NaN), data =
// satfinite RNE(x / eff), the quotient correctly rounded (div_rn); FOLD: that data re-rounded
// times 2^e (Q * ss).
//
// Shapes: K a multiple of 32 and at most MAX_K, rows 16-byte aligned (the caller checks and falls
// back to Triton). Outputs: q [M, K]; s (eff) and code [M, K/32]; g [M] (the row scales).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_common.cuh"

namespace {

using namespace infir_fp8;

constexpr int THREADS = 256;
constexpr int MAX_K = 49152;  // 96 KB of bf16 row in shared memory
constexpr int MAX_REG_VECS = 4;  // rows of up to 4 x 8 x THREADS = 8192 elements stay in registers

// an FP8 byte back to float (exact through half)
template <bool E5M2>
__device__ __forceinline__ float fp8_to_float(uint32_t byte) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)byte, E5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float vec_absmax(uint4 w) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = bf16x2_to_float2(u[j]);
    a = fmaxf(a, fmaxf(abs_nan_inf(f.x), abs_nan_inf(f.y)));
  }
  return a;
}

// the row's amax from each thread's share (every thread of the block calls it)
__device__ __forceinline__ float block_max(float a, float* warp_max) {
#pragma unroll
  for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = a;
  __syncthreads();
  a = warp_max[0];
#pragma unroll
  for (int i = 1; i < THREADS / 32; ++i) a = fmaxf(a, warp_max[i]);
  return a;
}

// a / b rounded to nearest, given y = RN(1/b): one division per group instead of one per value.
// q0 = RN(a y) is within an ulp of a / b, and one FMA correction makes it the correctly rounded
// quotient (Markstein) while nothing under- or overflows; `fast` holds b in [2^-90, 2^126], where
// every quotient that is not flushed to FP8 zero anyway is exact (checked exhaustively on a CPU
// with fmaf against a / b for every bf16 and fp32 mantissa). copysign keeps -0 / b = -0.
__device__ __forceinline__ float div_rn(float a, float b, float y, bool fast) {
  if (!fast) return __fdiv_rn(a, b);
  const float q0 = __fmul_rn(a, y);
  return copysignf(fmaf(fmaf(-q0, b, a), y, q0), a);
}

// One thread's 8 values (vector v of row m; four consecutive threads hold a group of 32) quantized
// and stored. vmax: their abs max. Every thread of the warp calls it (the group amax is shuffled).
template <bool UE8M0, bool E5M2, bool FOLD>
__device__ __forceinline__ void quantize_vec(uint4 w, float vmax, float s, bool active, long long m, int v,
                                             int K, uint8_t* __restrict__ q, float* __restrict__ s_out,
                                             uint8_t* __restrict__ code_out) {
  constexpr float FMAX = E5M2 ? 57344.f : 448.f;
  float ga = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 1));
  ga = fmaxf(ga, __shfl_xor_sync(0xffffffffu, ga, 2));
  if (!active) return;
  const bool finite = s == s;
  const float s_i = __fdiv_rn(ga, FMAX);
  const int e = ga == 0.f ? 0 : ceil_log2(__fdiv_rn(s_i, s));
  const float eff = finite ? s * exp2i(e) : __int_as_float(0x7fc00000);
  const bool fast = eff >= 0x1p-90f && eff <= 0x1p126f;
  const float y = fast ? __frcp_rn(eff) : 0.f;
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float r[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = bf16x2_to_float2(u[j]);
    r[2 * j] = div_rn(f.x, eff, y, fast);
    r[2 * j + 1] = div_rn(f.y, eff, y, fast);
  }
  uint2 out;
  if (FOLD && !E5M2) {
    // Q rounded to FP8, times ss = 2^e <= 1, rounded again: the row-scaled GEMM operand. In half
    // precision, two values an instruction: E4M3's 4 significant bits times 2^e are exact in half
    // down to 2^-21, and anything smaller (ss flushed to 0 below 2^-24 included) is far under
    // E4M3's least subnormal, so both roundings give the same zero.
    const __half2 ss2 = __float2half2_rn(exp2i(e));
    uint32_t h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2_raw qh = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)fp8x2<false>(r[2 * j], r[2 * j + 1]), __NV_E4M3);
      const __half2 t = __hmul2(__half2(qh), ss2);
      h[j] = __nv_cvt_halfraw2_to_fp8x2(__half2_raw(t), __NV_SATFINITE, __NV_E4M3);
    }
    out.x = h[0] | (h[1] << 16);
    out.y = h[2] | (h[3] << 16);
  } else if (FOLD) {  // E5M2 reaches 2^-16: its products may need more range than half's
    const float ss = exp2i(e);
    float t[8];
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const uint32_t b = fp8x2<E5M2>(r[j], r[j + 1]);
      t[j] = fp8_to_float<E5M2>(b & 0xFF) * ss;
      t[j + 1] = fp8_to_float<E5M2>(b >> 8) * ss;
    }
    out.x = fp8x2<E5M2>(t[0], t[1]) | (fp8x2<E5M2>(t[2], t[3]) << 16);
    out.y = fp8x2<E5M2>(t[4], t[5]) | (fp8x2<E5M2>(t[6], t[7]) << 16);
  } else {
    out.x = fp8x2<E5M2>(r[0], r[1]) | (fp8x2<E5M2>(r[2], r[3]) << 16);
    out.y = fp8x2<E5M2>(r[4], r[5]) | (fp8x2<E5M2>(r[6], r[7]) << 16);
  }
  reinterpret_cast<uint2*>(q + m * K)[v] = out;
  if (!FOLD && (v & 3) == 0) {
    const int groups = K / 32;
    s_out[m * groups + v / 4] = eff;
    code_out[m * groups + v / 4] = (uint8_t)(finite ? e + 127 : 255);
  }
}

// Rows of up to VECS x 8 x THREADS elements: each thread keeps its VECS vectors (and their abs
// max) in registers between the row-amax reduction and the quantization, so nothing is read twice.
template <bool UE8M0, bool E5M2, bool FOLD, int VECS>
__global__ void __launch_bounds__(THREADS) quant_two_level_regs(const __nv_bfloat16* __restrict__ x, long long ldx,
                                                                uint8_t* __restrict__ q, float* __restrict__ s_out,
                                                                float* __restrict__ g_out,
                                                                uint8_t* __restrict__ code_out, int K) {
  __shared__ float warp_max[THREADS / 32];
  const long long m = blockIdx.x;
  const int tid = threadIdx.x, nvec = K / 8;
  const uint4* src = reinterpret_cast<const uint4*>(x + m * ldx);
  uint4 w[VECS];
  float vmax[VECS];
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int v = i * THREADS + tid;
    w[i] = v < nvec ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    vmax[i] = vec_absmax(w[i]);
    a = fmaxf(a, vmax[i]);
  }
  const float s = scale_from_amax<UE8M0>(block_max(a, warp_max), E5M2 ? 57344.f : 448.f);
  if (tid == 0) g_out[m] = s;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int v = i * THREADS + tid;
    quantize_vec<UE8M0, E5M2, FOLD>(w[i], vmax[i], s, v < nvec, m, v, K, q, s_out, code_out);
  }
}

// Longer rows: the block keeps its row in shared memory (one read from HBM) and reads it back.
template <bool UE8M0, bool E5M2, bool FOLD>
__global__ void __launch_bounds__(THREADS) quant_two_level(const __nv_bfloat16* __restrict__ x, long long ldx,
                                                           uint8_t* __restrict__ q, float* __restrict__ s_out,
                                                           float* __restrict__ g_out, uint8_t* __restrict__ code_out,
                                                           int K) {
  extern __shared__ __align__(16) uint4 row[];  // the row, 8 bf16 per entry
  __shared__ float warp_max[THREADS / 32];
  const long long m = blockIdx.x;
  const int tid = threadIdx.x, nvec = K / 8;
  const uint4* src = reinterpret_cast<const uint4*>(x + m * ldx);

  // four 16-byte loads in flight per thread, the row's amax on the way
  float a = 0.f;
  for (int base = 0; base < nvec; base += 4 * THREADS) {
    uint4 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = base + i * THREADS + tid;
      if (v < nvec) w[i] = __ldg(src + v);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = base + i * THREADS + tid;
      if (v < nvec) {
        row[v] = w[i];
        a = fmaxf(a, vec_absmax(w[i]));
      }
    }
  }
  const float s = scale_from_amax<UE8M0>(block_max(a, warp_max), E5M2 ? 57344.f : 448.f);
  if (tid == 0) g_out[m] = s;
  // every thread runs every iteration (nvec is a multiple of 4, and so is THREADS), so that the
  // group shuffles see whole warps
  for (int v0 = 0; v0 < nvec; v0 += THREADS) {
    const int v = v0 + tid;
    const bool active = v < nvec;
    const uint4 w = active ? row[v] : make_uint4(0, 0, 0, 0);
    quantize_vec<UE8M0, E5M2, FOLD>(w, vec_absmax(w), s, active, m, v, K, q, s_out, code_out);
  }
}

template <bool UE8M0, bool E5M2, bool FOLD>
cudaError_t launch(const void* x, long long ldx, void* q, void* s, void* g, void* code, int M, int K,
                   cudaStream_t stream) {
  auto xp = static_cast<const __nv_bfloat16*>(x);
  auto qp = static_cast<uint8_t*>(q);
  auto sp = static_cast<float*>(s);
  auto gp = static_cast<float*>(g);
  auto cp = static_cast<uint8_t*>(code);
  const int vecs = (K / 8 + THREADS - 1) / THREADS;
  if (vecs == 1)
    quant_two_level_regs<UE8M0, E5M2, FOLD, 1><<<M, THREADS, 0, stream>>>(xp, ldx, qp, sp, gp, cp, K);
  else if (vecs == 2)
    quant_two_level_regs<UE8M0, E5M2, FOLD, 2><<<M, THREADS, 0, stream>>>(xp, ldx, qp, sp, gp, cp, K);
  else if (vecs <= MAX_REG_VECS)
    quant_two_level_regs<UE8M0, E5M2, FOLD, MAX_REG_VECS><<<M, THREADS, 0, stream>>>(xp, ldx, qp, sp, gp, cp, K);
  else
    quant_two_level<UE8M0, E5M2, FOLD><<<M, THREADS, K * 2, stream>>>(xp, ldx, qp, sp, gp, cp, K);
  return cudaGetLastError();
}

template <bool UE8M0, bool E5M2, bool FOLD>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(quant_two_level<UE8M0, E5M2, FOLD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              MAX_K * 2);
}

}  // namespace

// Once per device, before its first launch: rows over 24K elements need over 48 KB of shared memory.
extern "C" int infir_quant_two_level_init() {
  const cudaError_t errs[] = {allow_smem<true, true, true>(),    allow_smem<true, false, true>(),
                              allow_smem<false, true, true>(),   allow_smem<false, false, true>(),
                              allow_smem<true, true, false>(),   allow_smem<true, false, false>(),
                              allow_smem<false, true, false>(),  allow_smem<false, false, false>()};
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return (int)e;
  return 0;
}

// The entry point Python calls through ctypes (kernels/cuda_build.py). Returns a cudaError_t.
extern "C" int infir_quant_two_level(const void* x, long long ldx, void* q, void* s, void* g, void* code, int M,
                                     int K, int ue8m0, int e5m2, int fold, void* stream) {
  if (K % 32 || K <= 0 || K > MAX_K || M <= 0) return (int)cudaErrorInvalidValue;
  cudaStream_t cs = static_cast<cudaStream_t>(stream);
  using Fn = cudaError_t (*)(const void*, long long, void*, void*, void*, void*, int, int, cudaStream_t);
  const Fn table[8] = {launch<false, false, false>, launch<false, false, true>, launch<false, true, false>,
                       launch<false, true, true>,   launch<true, false, false>, launch<true, false, true>,
                       launch<true, true, false>,   launch<true, true, true>};
  return (int)table[(ue8m0 ? 4 : 0) + (e5m2 ? 2 : 0) + (fold ? 1 : 0)](x, ldx, q, s, g, code, M, K, cs);
}
