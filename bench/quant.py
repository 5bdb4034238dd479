"""FP8 quantization kernels: time and HBM bandwidth at 16k x 8192 bf16 (and other sizes).

Bytes counted: each input read once plus each output (FP8 data, scales) written once, the
fewest any implementation must move; the percentage is of the measured copy bandwidth.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import base_parser, bench_ms, copy_bandwidth_gbs, emit, markdown_table  # noqa: E402
from infir.fp8 import kernels as kn  # noqa: E402


def cases(x):
    M, K = x.shape
    n = M * K
    read = 2 * n
    return [
        ("token 1x128 (X along K)", lambda: kn.quantize_token_triton(x), read + n + 4 * n // 128),
        ("token 128x1 along M, written transposed (X^T)", lambda: kn.quantize_token_triton(x, rows=False, cols=True),
         read + n + 4 * n // 128),
        ("token both layouts (one launch, autotuned: fused or split)", lambda: kn.quantize_token_triton(x, rows=True, cols=True),
         read + 2 * n + 8 * n // 128),
        ("block 128x128 (W)", lambda: kn.quantize_block_triton(x), read + n + 4 * n // 16384),
        ("block 128x128 + W^T bytes", lambda: kn.quantize_block_triton(x, transpose=True), read + 2 * n + 4 * n // 16384),
        ("two_level (MOSS, 32)", lambda: kn.quantize_two_level_triton(x), read + n + 5 * n // 32 + 4 * M),
        ("two_level folded (MOSS GEMM operand)", lambda: kn.quantize_two_level_triton(x, fold=True), read + n + 4 * M),
        ("tensor JIT (amax + quantize)", lambda: kn.quantize_tensor_triton(x, "fp32"), read + n),
        ("tensor, given scale (autoscale)", lambda: kn.quantize_tensor_triton(x, "fp32", scale=torch.ones((), device=x.device)),
         read + n),
    ]


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--shapes", default="16384x8192,8192x3584,8192x18944")
    p.add_argument("--tune-two-level", action="store_true", help="sweep the two-level kernel's tile sizes")
    args = p.parse_args(argv)
    bw = copy_bandwidth_gbs()
    if args.tune_two_level:
        rows = []
        for shape in args.shapes.split(","):
            M, K = map(int, shape.split("x"))
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            for bm, bk, nw in [(1, 1024, 4), (1, 2048, 8), (2, 1024, 4), (2, 2048, 8), (4, 512, 4), (4, 1024, 8), (8, 512, 8)]:
                ms = bench_ms(lambda: kn.quantize_two_level_triton(x, fold=True, block_m=bm, block_k=bk, num_warps=nw))
                gbs = (3 * M * K + 4 * M) / ms / 1e6
                rows.append({"shape": shape, "BM,BK,warps": f"{bm},{bk},{nw}", "ms": ms, "% of copy BW": 100 * gbs / bw})
        emit("two-level quantize tile sweep", [markdown_table(rows)], args.out)
        return
    rows = []
    for shape in args.shapes.split(","):
        M, K = map(int, shape.split("x"))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for name, fn, nbytes in cases(x):
            ms = bench_ms(fn)
            gbs = nbytes / ms / 1e6
            rows.append({"shape (bf16)": shape, "kernel": name, "ms": ms, "GB/s": gbs, "% of copy BW": 100 * gbs / bw})
        x = None  # free it before the next shape
        torch.cuda.empty_cache()
    emit("FP8 quantization kernels", [f"measured copy bandwidth (read+write): {bw:.0f} GB/s", markdown_table(rows)], args.out)


if __name__ == "__main__":
    main()
