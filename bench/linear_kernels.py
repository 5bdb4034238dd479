"""Every GPU kernel of one linear fwd+bwd, FP8 (fp8_blockwise_ue8m0, weight cached as in gradient
accumulation) and BF16 nn.Linear, from torch.profiler: what bench/linear.py's summed times are made of
beyond the GEMMs and the quantizers it times alone (transposes, scale layouts, fills).

  python bench/linear_kernels.py --shapes 16384,3584,37888 8192,1536,2048 --out /root/out/linear_kernels.md
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import base_parser, emit, kernel_times_us, markdown_table  # noqa: E402
from infir.fp8 import Fp8Linear  # noqa: E402

REPS = 5


def kernel_table(layer, x, dy) -> tuple[list[dict], float]:
    """(one row per kernel name: calls and GPU us per fwd+bwd, summed kernel us per fwd+bwd)."""
    def step():
        x.grad = None
        layer.weight.grad = None
        layer(x).backward(dy)

    for _ in range(3):
        step()
    times = kernel_times_us(step, reps=REPS)
    total = sum(us for us, _ in times.values())
    rows = [{"kernel": name[:90], "calls": calls, "us": us, "% of kernels": 100 * us / total}
            for name, (us, calls) in sorted(times.items(), key=lambda kv: kv[1][0], reverse=True)]
    return rows, total


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["16384,3584,37888", "8192,1536,2048"],
                   help="M,K,N: tokens, in features, out features")
    args = p.parse_args(argv)
    sections = []
    for shape in args.shapes:
        M, K, N = map(int, shape.split(","))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        base = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        fp8 = Fp8Linear(K, N, bias=False, recipe="fp8_blockwise_ue8m0", device="cuda", dtype=torch.bfloat16)
        fp8.weight.data.copy_(base.weight.data)
        for name, layer in (("bf16 nn.Linear", base), ("fp8_blockwise_ue8m0, cached weight", fp8)):
            rows, total = kernel_table(layer, x, dy)
            sections += [f"### M,K,N = {M},{K},{N}: {name}, {total:.1f} us of kernels per fwd+bwd", markdown_table(rows)]
        del x, dy
        torch.cuda.empty_cache()
    emit("Kernels of one linear fwd+bwd (torch.profiler)", sections, args.out)


if __name__ == "__main__":
    main()
