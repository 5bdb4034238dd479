// MOSS two-level rows (quantize.quantize_two_level_ref, and fold_two_level of it) in CUDA C++:
// one FP32 scale per row (row amax / fmax), one E8M0 power of two per group of 32.
//
// Why CUDA here: the row scale depends on the whole row, so Triton's kernel reads each row twice
// (an amax pass, then a quantize pass served partly from L2) and reached 75-78% of copy bandwidth
// on an H100 (BENCHMARKS.md). Here a block keeps its row in shared memory: one read from HBM.
//
// Bits: identical to the reference and to _quant_two_level_kernel: s = RN(row amax / fmax) in the
// scale format; per group s_i = RN(amax_i / fmax), e = ceil(log2(RN(s_i / s))) (0 for an all-zero
// group), effective scale s * 2^e (NaN and code 255 for a row holding inf/NaN), data =
// satfinite RNE(x / eff) by IEEE division; FOLD: that data re-rounded times 2^e (Q * ss).
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

// an FP8 byte back to float (exact through half)
template <bool E5M2>
__device__ __forceinline__ float fp8_to_float(uint32_t byte) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)byte, E5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

template <bool UE8M0, bool E5M2, bool FOLD>
__global__ void __launch_bounds__(THREADS) quant_two_level(const __nv_bfloat16* __restrict__ x, long long ldx,
                                                           uint8_t* __restrict__ q, float* __restrict__ s_out,
                                                           float* __restrict__ g_out, uint8_t* __restrict__ code_out,
                                                           int K) {
  constexpr float FMAX = E5M2 ? 57344.f : 448.f;
  extern __shared__ __align__(16) uint4 row[];  // the row, 8 bf16 per entry
  __shared__ float warp_max[THREADS / 32];
  const long long m = blockIdx.x;
  const int tid = threadIdx.x, nvec = K / 8, groups = K / 32;
  const uint4* src = reinterpret_cast<const uint4*>(x + m * ldx);

  // one read of the row from HBM, four 16-byte loads in flight per thread, its amax on the way
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
        const uint32_t u[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a = fmaxf(a, abs_nan_inf(__uint_as_float(u[j] << 16)));
          a = fmaxf(a, abs_nan_inf(__uint_as_float(u[j] & 0xFFFF0000u)));
        }
      }
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if ((tid & 31) == 0) warp_max[tid >> 5] = a;
  __syncthreads();
  a = warp_max[0];
#pragma unroll
  for (int i = 1; i < THREADS / 32; ++i) a = fmaxf(a, warp_max[i]);
  const float s = scale_from_amax<UE8M0>(a, FMAX);
  const bool finite = s == s;
  if (tid == 0) g_out[m] = s;

  // groups of 32: four consecutive threads, 8 values each (nvec is a multiple of 4, and so is
  // THREADS). Every thread runs every iteration, so that the shuffles see whole warps.
  for (int v0 = 0; v0 < nvec; v0 += THREADS) {
    const int v = v0 + tid;
    const bool active = v < nvec;
    const uint4 w = active ? row[v] : make_uint4(0, 0, 0, 0);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    float f[8];
    float ga = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = __uint_as_float(u[j] << 16);
      f[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
      ga = fmaxf(ga, fmaxf(abs_nan_inf(f[2 * j]), abs_nan_inf(f[2 * j + 1])));
    }
    ga = fmaxf(ga, __shfl_xor_sync(0xffffffffu, ga, 1));
    ga = fmaxf(ga, __shfl_xor_sync(0xffffffffu, ga, 2));
    const float s_i = __fdiv_rn(ga, FMAX);
    const int e = ga == 0.f ? 0 : ceil_log2(__fdiv_rn(s_i, s));
    const float eff = finite ? s * exp2i(e) : __int_as_float(0x7fc00000);
    float r[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) r[j] = __fdiv_rn(f[j], eff);
    uint2 out;
    if (FOLD) {  // Q rounded to FP8, times ss = 2^e, rounded again: the row-scaled GEMM operand
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
    if (!active) continue;
    reinterpret_cast<uint2*>(q + m * K)[v] = out;
    if (!FOLD && (tid & 3) == 0) {
      s_out[m * groups + v / 4] = eff;
      code_out[m * groups + v / 4] = (uint8_t)(finite ? e + 127 : 255);
    }
  }
}

template <bool UE8M0, bool E5M2, bool FOLD>
cudaError_t launch(const void* x, long long ldx, void* q, void* s, void* g, void* code, int M, int K,
                   cudaStream_t stream) {
  quant_two_level<UE8M0, E5M2, FOLD><<<M, THREADS, K * 2, stream>>>(
      static_cast<const __nv_bfloat16*>(x), ldx, static_cast<uint8_t*>(q), static_cast<float*>(s),
      static_cast<float*>(g), static_cast<uint8_t*>(code), K);
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
