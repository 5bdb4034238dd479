"""Launch each CUDA C++ quantizer once per shape, for a hardware-counter profiler to read:

    ncu --clock-control none --kernel-name regex:quant_token_both --section SpeedOfLight \
        --section Occupancy --section WarpStateStats python bench/kernel_once.py --shapes 8192x4864

Each kernel runs twice (the first launch builds and loads the library); profile the second with
ncu's --launch-skip. Shapes: tokens x ffn for SwiGLU's fused kernels (their inputs are [M, 2F]);
the plain both-layouts quantizer runs on [M, F]."""
import argparse

import torch

from infir.fp8.kernels import quant as kn
from infir.fp8.kernels import swiglu as ks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8192x4864")
    p.add_argument("--kernels", nargs="+", default=["bwd", "fwd", "both"])
    args = p.parse_args()
    for shape in args.shapes.split(","):
        M, F = map(int, shape.split("x"))
        h = torch.randn(M, 2 * F, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, F, device="cuda", dtype=torch.bfloat16)
        _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
        run = {"bwd": lambda: ks.swiglu_fp8_bwd_quant(q, s, dy, "ue8m0", "e4m3"),
               "fwd": lambda: ks.swiglu_fp8_fwd_quant(h, "ue8m0", "e4m3", "ue8m0", "e4m3"),
               "both": lambda: kn._cuda_both_run(dy, "ue8m0", "e4m3", 4)(dy)}
        for name in args.kernels:
            for _ in range(2):
                run[name]()
            torch.cuda.synchronize()
            print(f"{shape} {name}: launched twice", flush=True)


if __name__ == "__main__":
    main()
