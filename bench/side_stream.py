#!/usr/bin/env python3
"""Does a kernel on a side stream run beside an FP8 GEMM, eagerly and in a CUDA graph's replay? One GPU.

A split sequence-parallel schedule (parallel.tp_comm_overlap) hides an exchange's NCCL kernel, a few
thread blocks on NCCL's stream, behind the GEMM beside it. This times the same pair on one GPU with a
stand-in for the NCCL kernel: a copy of the exchange's bytes by `--ctas` thread blocks (NCCL's channels)
on a side stream, and the same copy as one device-to-device cudaMemcpyAsync (the call symmetric-memory
transfers over NVLink make; the driver picks copy engines or SMs for it), beside infir's blockwise FP8
GEMM, for each GEMM of the 7B layer at TP=2. Per form, the pair's time against the two alone: `hidden` is
the share of the shorter one that running them together saves (1: fully beside each other, 0: one after
the other, below 0: slower than that).

- eager: the copy issued first, then the GEMM (the schedule's order); with CUDA_DEVICE_MAX_CONNECTIONS=1
  (the trainer's setting) both go to one hardware queue in that order.
- graphed: the same calls captured in one CUDA graph and replayed, as the trainer's compiled FP8 layers
  run: whether the replay keeps the schedule's order, or starts the GEMM first, whose persistent cuBLAS
  kernel would then hold every SM until it ends.
- graphed, GEMM first: captured with the GEMM issued before the copy.
- graphed, carveout: captured with the GEMM leaving --sm-carveout SMs to other kernels (torch's cuBLASLt
  SM count target); `gemm, carveout` is that GEMM alone.

    CUDA_DEVICE_MAX_CONNECTIONS=1 python bench/side_stream.py --out side_stream.md
"""
from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import base_parser, bench_ms, capture_graph, emit, markdown_table  # noqa: E402


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    # grid-stride: `ctas` programs walk the whole buffer, as an NCCL kernel's channels do
    start = tl.program_id(0) * BLOCK
    step = tl.num_programs(0) * BLOCK
    for lo in range(start, n, step):
        offs = lo + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def few_cta_copy(src: torch.Tensor, dst: torch.Tensor, ctas: int) -> None:
    """dst[:] = src[:] (int32 words) by `ctas` thread blocks."""
    _copy_kernel[(ctas,)](src, dst, src.numel(), BLOCK=4096)


def pair(gemm, copy, gemm_first: bool):
    """The copy on a side stream beside the GEMM on the current one, joined after both."""
    side = torch.cuda.Stream()

    def run():
        main = torch.cuda.current_stream()  # under capture, the capturing stream
        side.wait_stream(main)
        if gemm_first:
            out = gemm()
        with torch.cuda.stream(side):
            copy()
        if not gemm_first:
            out = gemm()
        main.wait_stream(side)
        return out

    return run


def graphed(fn, carveout: int | None):
    return capture_graph(fn, sm_carveout=carveout)[0].replay


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--tokens", type=int, default=8192, help="tokens of one micro-batch, all TP ranks together")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--ctas", type=int, default=16, help="thread blocks of the stand-in exchange kernel")
    p.add_argument("--sm-carveout", type=int, default=16)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("side_stream.py: needs a GPU")
    from infir.fp8 import quantize
    from infir.fp8.gemm import outer_dim_major, scaled_mm_blockwise, scaled_mm_scale
    from infir.model.qwen import get_size

    size, tp = get_size(args.model), args.tp
    d, kv, f = size.hidden, size.kv_heads * size.head_dim, size.ffn
    m = args.tokens // tp
    # (GEMM, K, N, bytes the exchange beside it moves: the FP8 input shard, or the BF16 partial product)
    shapes = [("QKV", d, (d + 2 * kv) // tp, m * d), ("FC1", d, 2 * f // tp, m * d),
              ("proj", d // tp, d, 2 * m * d), ("FC2", f // tp, d, 2 * m * d)]
    rows = []
    for name, k, n, nbytes in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        qx, qw = quantize(x, "token", "ue8m0"), quantize(w, "block", "ue8m0")
        xs, ws = outer_dim_major(qx.scale.contiguous()), scaled_mm_scale(qw)
        gemm = lambda: scaled_mm_blockwise(qx.data, xs, qw.data, ws, "block", torch.bfloat16)  # noqa: E731
        src = torch.randint(1, 1 << 30, (nbytes // 4,), device="cuda", dtype=torch.int32)
        dst = torch.empty_like(src)
        t_gemm, t_carved = bench_ms(graphed(gemm, None)), bench_ms(graphed(gemm, args.sm_carveout))
        stand_ins = {f"{args.ctas}-block copy": lambda: few_cta_copy(src, dst, args.ctas),
                     "memcpy": lambda: dst.copy_(src)}
        for stand_in, copy in stand_ins.items():
            forms = {"eager": pair(gemm, copy, False),
                     "graphed": graphed(pair(gemm, copy, False), None),
                     "graphed, GEMM first": graphed(pair(gemm, copy, True), None),
                     "graphed, carveout": graphed(pair(gemm, copy, False), args.sm_carveout)}
            t = {key: bench_ms(fn) for key, fn in forms.items()}
            # every form's replay did copy: the side stream's work is in its graph, not run once at capture
            for key, fn in forms.items():
                dst.zero_()
                fn()
                assert torch.equal(dst, src), f"{name}, {stand_in}, {key}: the side stream's copy did not run"
            t_copy = bench_ms(graphed(copy, None))
            shorter, apart = min(t_gemm, t_copy), t_gemm + t_copy
            row = {"GEMM": name, "m x K x N": f"{m}x{k}x{n}", "gemm ms": t_gemm, "gemm, carveout ms": t_carved,
                   "stand-in exchange": stand_in, "MB": nbytes / 1e6, "alone ms": t_copy}
            for key in forms:
                row[f"{key} ms"] = t[key]
                row[f"{key} hidden"] = (apart - t[key]) / shorter
            rows.append(row)
            print(row, flush=True)
    emit("A few-block kernel on a side stream beside an FP8 GEMM: eager vs CUDA graph replay (bench/side_stream.py)",
         [f"{args.model}, TP={tp}, {args.tokens} tokens a micro-batch ({m} rows a rank); stand-in exchange: "
          f"a copy by {args.ctas} thread blocks, or one cudaMemcpyAsync; carveout: {args.sm_carveout} SMs",
          markdown_table(rows)], args.out)


if __name__ == "__main__":
    main()
