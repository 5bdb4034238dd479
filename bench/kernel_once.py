"""Launch each quantizer twice per shape, for a hardware-counter profiler to read:

    ncu --clock-control none --kernel-name regex:quant_token_both --section SpeedOfLight \
        --section Occupancy --section WarpStateStats python bench/kernel_once.py --shapes 8192x4864

The first launch builds and loads a CUDA library; profile the second with ncu's --launch-skip, or
both. Shapes: tokens x ffn for SwiGLU's fused kernels (their inputs are [M, 2F]); every other kernel
runs on [M, F]. Besides the CUDA C++ kernels (bwd, fwd, both), the Triton single-layout quantizers
(rows: 1x128; cols: 128x1 written transposed; block: 128x128) and a plain elementwise pass (neg: 2
bytes in, 2 out, torch's own kernel) give the DRAM figures to set the both-layouts kernel against. Autotuning is off here, so each launches in its default
configuration only and the profile holds no candidate runs."""
import argparse
import os

os.environ["INFIR_FP8_AUTOTUNE"] = "0"  # read by infir.fp8.policy before the first kernel call

import torch  # noqa: E402

from infir.fp8 import kernels as kn  # noqa: E402
from infir.fp8.kernels.quant_token import cuda_both_runner  # noqa: E402
from infir.fp8.kernels import swiglu as ks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8192x4864")
    p.add_argument("--kernels", nargs="+", default=["bwd", "fwd", "both"],
                   choices=["bwd", "fwd", "both", "rows", "cols", "block", "neg"])
    args = p.parse_args()
    for shape in args.shapes.split(","):
        M, F = map(int, shape.split("x"))
        h = torch.randn(M, 2 * F, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, F, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(dy)
        _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
        run = {"bwd": lambda: ks.swiglu_fp8_bwd_quant(q, s, dy, "ue8m0", "e4m3"),
               "fwd": lambda: ks.swiglu_fp8_fwd_quant(h, "ue8m0", "e4m3", "ue8m0", "e4m3"),
               "both": lambda: cuda_both_runner(dy, "ue8m0", "e4m3", 4)(dy),
               "rows": lambda: kn.quantize_token_triton(dy, rows=True, cols=False),
               "cols": lambda: kn.quantize_token_triton(dy, rows=False, cols=True),
               "block": lambda: kn.quantize_block_triton(dy),
               "neg": lambda: torch.neg(dy, out=out)}
        for name in args.kernels:
            for _ in range(2):
                run[name]()
            torch.cuda.synchronize()
            print(f"{shape} {name}: launched twice", flush=True)


if __name__ == "__main__":
    main()
