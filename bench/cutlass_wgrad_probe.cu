// Probe: the FP8 wgrad GEMM (1x128 x 1x128 scales along K, the tokens) as CUTLASS's Hopper blockwise-scaled
// GEMM, C[M, N] += A[M, K] B[N, K]^T in FP32 (megatron's main_grad, in place), for bench/cutlass_wgrad_probe.py
// to time against cuBLASLt's (kernels/lt_wgrad.cu). A measurement, not a kernel infir uses.
// Scales: float, (M, K/128) and (N, K/128), the rows contiguous (the layout the quantizers write).
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace {

template <class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule>
struct Wgrad {
  using E4M3 = cutlass::float_e4m3_t;
  static constexpr int ALIGN_AB = 16, ALIGN_C = 4;  // 16 bytes
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, 128, GMMA::Major::MN, GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      float, cutlass::layout::RowMajor, ALIGN_C, float, cutlass::layout::RowMajor, ALIGN_C,
      EpilogueSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      E4M3, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, ALIGN_AB,
      E4M3, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, ALIGN_AB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static int run(const void* a, const void* sfa, const void* b, const void* sfb, float* c, int M, int N, int K,
                 cudaStream_t stream) {
    using SA = typename Kernel::StrideA;
    using SB = typename Kernel::StrideB;
    using SC = typename Kernel::StrideC;
    using SD = typename Kernel::StrideD;
    auto lsfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(M, N, K, 1));
    auto lsfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(M, N, K, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, 1},
        {static_cast<const E4M3*>(a), cutlass::make_cute_packed_stride(SA{}, make_shape(M, K, 1)),
         static_cast<const E4M3*>(b), cutlass::make_cute_packed_stride(SB{}, make_shape(N, K, 1)),
         static_cast<const float*>(sfa), lsfa, static_cast<const float*>(sfb), lsfb},
        {{}, c, cutlass::make_cute_packed_stride(SC{}, make_shape(M, N, 1)),
         c, cutlass::make_cute_packed_stride(SD{}, make_shape(M, N, 1))}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 1.f;
    Gemm gemm;
    if (Gemm::get_workspace_size(args) != 0) return 1001;  // a persistent, unsplit schedule needs none
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1002;
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return 1003;
    if (gemm.run(stream) != cutlass::Status::kSuccess) return 1004;
    return (int)cudaGetLastError();
  }
};

using Coop = Wgrad<Shape<_128, _128, _128>, Shape<_1, _2, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                   cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Coop21 = Wgrad<Shape<_128, _128, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                     cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Ping = Wgrad<Shape<_64, _128, _128>, Shape<_1, _2, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                   cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace

extern "C" int probe_wgrad(int variant, const void* a, const void* sfa, const void* b, const void* sfb, float* c,
                           int M, int N, int K, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (variant) {
    case 0: return Coop::run(a, sfa, b, sfb, c, M, N, K, s);
    case 1: return Coop21::run(a, sfa, b, sfb, c, M, N, K, s);
    case 2: return Ping::run(a, sfa, b, sfb, c, M, N, K, s);
    default: return 1000;
  }
}
