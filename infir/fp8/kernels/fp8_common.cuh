// Device helpers shared by infir's CUDA quantizers, each equal bit for bit to its twin in
// kernels/triton_fp8.py (Triton) and formats.py (the reference).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace infir_fp8 {

// |v| with NaN counted as +inf, so that no amax can drop a NaN (max instructions return the other operand)
__device__ __forceinline__ float abs_nan_inf(float v) {
  float a = fabsf(v);
  return a != a ? __int_as_float(0x7f800000) : a;
}

// ceil(log2(x)) for x >= 0, from the bits, clamped to E8M0's [-127, 127]
__device__ __forceinline__ int ceil_log2(float x) {
  int bits = __float_as_int(x);
  int biased = (bits >> 23) & 0xFF, mant = bits & 0x7FFFFF;
  int e = biased == 0 ? (mant > (1 << 22) ? -126 : -127) : biased - 127 + (mant != 0);
  return min(max(e, -127), 127);
}

// 2^e for integer e in [-127, 127], exact
__device__ __forceinline__ float exp2i(int e) {
  return __int_as_float(e >= -126 ? (e + 127) << 23 : 1 << 22);
}

// the stored scale for an amax: RN(amax / fmax), as a power of two rounded up for UE8M0; 0 -> 1; inf -> NaN.
// UE8M0 skips the IEEE division (a dozen instructions and a slow-path branch, once per 8 values in the
// row quantizers) wherever RN(amax / fmax) is a normal float: both fmax are 1.75 * 2^k (448, 57344), so
// for amax = m * 2^E, m in [1, 2), the least e with amax / fmax <= 2^e is E - k + (m > 1.75), and RN
// cannot round a quotient above 2^e down onto it: no float's m lies in (1.75, 1.75 * (1 + 2^-24)].
template <bool UE8M0>
__device__ __forceinline__ float scale_from_amax(float amax, float fmax) {
  if (UE8M0) {
    const int bits = __float_as_int(amax), E = ((bits >> 23) & 0xFF) - 127;
    const int k = ((__float_as_int(fmax) >> 23) & 0xFF) - 127;
    if (E - k >= -125 && E < 128) return exp2i(E - k + ((bits & 0x7FFFFF) > 0x600000));  // quotient > 2^-126
  }
  float s = __fdiv_rn(amax, fmax);
  float out = UE8M0 ? exp2i(ceil_log2(s)) : s;
  out = s == 0.f ? 1.f : out;
  return amax == __int_as_float(0x7f800000) ? __int_as_float(0x7fc00000) : out;
}

// Per half, the larger of two bf16x2 words' values, NaN where either is NaN (max.NaN.bf16x2): one
// instruction for two values where the float path takes six (unpack, NaN test and select, max). With
// the sign bits cleared first (& BF16X2_ABS), a running amax that no NaN can drop.
constexpr uint32_t BF16X2_ABS = 0x7FFF7FFFu;
__device__ __forceinline__ uint32_t bf16x2_max_nan(uint32_t a, uint32_t b) {
  const __nv_bfloat162 m = __hmax2_nan(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                       *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&m);
}

// two floats as two FP8 bytes (the first in the low byte): saturating round-to-nearest-even, NaN kept
template <bool E5M2>
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3);
}

// the two bf16 of a 32-bit word (the first in the low half) as floats
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

}  // namespace infir_fp8
