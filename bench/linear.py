"""FP8 linear fwd+bwd vs bf16 nn.Linear (and torchao's Float8BlockwiseLinear) at Qwen2.5 shapes.

Each FP8 step re-quantizes the weight (one micro-batch per optimizer step, the worst case for
FP8); --cached-weight keeps it, as gradient accumulation over micro-batches does. --compiled runs
both sides through torch.compile, the FP8 one as compiled training layers do (infir.fp8.fp8_linear: the
weight quantized outside the graph, the linear one graph of custom ops); --cuda-graph captures
each side's whole fwd+bwd in one CUDA graph and times its replay, so that neither side pays its
host's launch cost (the training step runs blockwise FP8 layers under CUDA graphs by default,
model.compile_mode=auto): the GPU time of the kernels alone. Also reports
the share of the FP8 step spent in quantization kernels, two ways: the quantizers each timed alone
(each timing also counts its CUDA events' overhead), and their own GPU time inside the
timed step, from torch.profiler; and GEMM-only rates of the blockwise scaled_mm path vs the MOSS
two-level Triton GEMM.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import (base_parser, bench_ms, capture_graph, copy_bandwidth_gbs, emit,  # noqa: E402
                           kernel_times_us, l2_flush, markdown_table)
from infir.fp8 import Fp8Linear, LinearSpec, fp8_gemm, fp8_linear  # noqa: E402
from infir.fp8 import kernels as kn  # noqa: E402
from infir.fp8.kernels.gemm_two_level import two_level_gemm_triton  # noqa: E402

# (model, projection, K, N): Qwen2.5 hidden / intermediate sizes, fused QKV and gate-up as megatron runs them
MODELS = {"0.5B": (896, 4864, 1152), "1.5B": (1536, 8960, 2048), "7B": (3584, 18944, 4608)}
RECIPES = ("fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss")


def projections(models):
    for m in models:
        h, inter, qkv = MODELS[m]
        yield from [(m, "qkv", h, qkv), (m, "o", h, h), (m, "gate_up", h, 2 * inter), (m, "down", inter, h)]


def fwd_bwd_ms(layer, x, dy, before=None, graph=False, probe=None) -> float:
    """Median ms of one forward + backward of layer on x with output gradient dy; graph: of the
    replay of one CUDA graph holding it (captured after three warm-up runs on a side stream, where
    the quantizers pick their kernels and cuBLAS its workspaces). probe, when given, is called with
    the callable that was timed (the step, or the graph's replay) before the graph is freed."""
    def step():
        if before is not None:
            before()
        x.grad = None
        layer.weight.grad = None
        layer(x).backward(dy)
    if not graph:
        ms = bench_ms(step)
        if probe is not None:
            probe(step)
    else:
        g, _ = capture_graph(step)
        ms = bench_ms(g.replay)
        if probe is not None:
            probe(g.replay)
        del g
    x.grad = layer.weight.grad = None  # graph memory: freed with the graph
    return ms


def compile_static(fn, **kw):
    """torch.compile specialised to each shape, as a training layer sees one shape. Every shape here
    reuses a code object (CompiledFp8's lambda, nn.Linear.forward), so dynamo would otherwise turn
    to dynamic shapes from the second shape on, which no training layer runs; and its recompile
    limit (8) counts per code object, while one variant per shape x recipe is expected here."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
    return torch.compile(fn, dynamic=False, **kw)


class CompiledFp8(torch.nn.Module):
    """An Fp8Linear as a compiled training layer runs it: WeightCache.get outside, the FP8 core inside."""

    def __init__(self, layer: Fp8Linear):
        super().__init__()
        self.layer, self.weight = layer, layer.weight
        self.fn = compile_static(lambda x, w, wq: fp8_linear(x, w, wq, None, LinearSpec.of(layer.recipe, wq.granularity)), fullgraph=True)

    def forward(self, x):
        return self.fn(x, self.weight, self.layer.weight_cache.get(self.weight, self.layer.recipe))


def torchao_layer(K, N):
    try:
        from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear
    except Exception as e:  # noqa: BLE001 - the peer row is optional
        return None, f"{type(e).__name__}: {e}"
    ref = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    return Float8BlockwiseLinear.from_float(ref), None


def quant_ms(M, K, N, weight=True):
    """The quantize work of one fp8_blockwise fwd+bwd: X (dual), dY (dual), and W with its transpose
    for dgrad where the weight is quantized in the step (weight=False: cached, as accumulation does)."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    return (bench_ms(lambda: kn.quantize_token_triton(x, rows=True, cols=True))
            + (bench_ms(lambda: kn.quantize_block_triton(w).t()) if weight else 0.0)
            + bench_ms(lambda: kn.quantize_token_triton(dy, rows=True, cols=True)))


def quant_in_step_ms(run, flush, expected_calls: int) -> float:
    """GPU ms of the quantize kernels inside one timed fwd+bwd (run, after the same L2 flush that
    bench_ms puts before each run), from torch.profiler. quant_ms times each quantizer alone, which
    adds an event pair's overhead to every kernel; this is the time they take in the step itself.
    expected_calls: the quantize launches the recipe makes per fwd+bwd, checked so that a renamed
    kernel cannot drop out of the sum unseen."""
    times = kernel_times_us(lambda: (flush(), run()), reps=10)  # the flush's fill kernel is no quantizer
    quant = {n: v for n, v in times.items() if "quant" in n.lower()}
    calls = sum(c for _, c in quant.values())
    if calls != expected_calls:
        raise RuntimeError(f"expected {expected_calls} quantize kernels per fwd+bwd, the profile shows {calls}: "
                           f"{sorted(times)}; if a quantizer was renamed or added, update the 'quant' name filter "
                           f"or the expected count in bench/linear.py")
    return sum(us for us, _ in quant.values()) / 1e3


def profiled_quant_ms(M, K, N, args, flush) -> float:
    """quant_in_step_ms of the fp8_blockwise_ue8m0 fwd+bwd at M, K, N, run as the timing loop runs it."""
    layer = Fp8Linear(K, N, bias=False, recipe="fp8_blockwise_ue8m0", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    calls = 2 if args.cached_weight else 3  # X and dY, and W where it is re-quantized in the step
    before = None if args.cached_weight else layer.weight_cache.invalidate
    run = CompiledFp8(layer) if args.compiled else layer
    out = []
    fwd_bwd_ms(run, x, dy, before, graph=args.cuda_graph,
               probe=lambda timed: out.append(quant_in_step_ms(timed, flush, calls)))
    return out[0]


def quant_bytes(M, K, N, weight=True) -> int:
    """HBM bytes quant_ms's kernels must move at least: each operand read once in bf16 and written once
    per FP8 layout, with its float32 scales (one per 128 values a layout)."""
    both = lambda rows, cols: rows * cols * (2 + 2 * 1) + 2 * 4 * rows * cols // 128  # noqa: E731
    w = N * K * (2 + 1) + 4 * N * K // (128 * 128) if weight else 0
    return both(M, K) + both(M, N) + w


def gemm_rates(M, K, N):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    qx, _ = kn.quantize_token_triton(x)
    qw = kn.quantize_block_triton(w)
    qx2 = kn.quantize_two_level_triton(x)
    qxf = kn.quantize_two_level_triton(x, fold=True)
    qwt, _ = kn.quantize_tensor_triton(w, "fp32")
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    _, qdyt = kn.quantize_token_triton(dy, rows=False, cols=True)
    _, qxt = kn.quantize_token_triton(x, rows=False, cols=True)
    flop = 2 * M * N * K
    t_bf16 = bench_ms(lambda: x @ w.t())
    t_blk = bench_ms(lambda: fp8_gemm(qx, qw, backend="scaled_mm"))
    t_wgrad = bench_ms(lambda: fp8_gemm(qdyt, qxt, backend="scaled_mm"))  # dW = dY^T X, 1x128 x 1x128 along M
    t_fold = bench_ms(lambda: fp8_gemm(qxf, qwt, backend="scaled_mm"))
    t_moss = bench_ms(lambda: fp8_gemm(qx2, qwt, backend="triton"))
    return {"bf16 TFLOP/s": flop / t_bf16 / 1e9, "blockwise scaled_mm TFLOP/s": flop / t_blk / 1e9,
            "blockwise wgrad (1x128 x 1x128) TFLOP/s": flop / t_wgrad / 1e9,
            "MOSS folded scaled_mm TFLOP/s": flop / t_fold / 1e9, "MOSS exact triton TFLOP/s": flop / t_moss / 1e9,
            "MOSS folded / blockwise speed": t_blk / t_fold}


def tune_moss(M, K, N):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    qx2 = kn.quantize_two_level_triton(x)
    qwt, _ = kn.quantize_tensor_triton(w, "fp32")
    rows = []
    for bm, bn, bk, nw, ns in [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (128, 128, 64, 4, 4), (128, 128, 128, 4, 4),
                               (128, 256, 64, 8, 4), (64, 128, 128, 4, 4), (128, 128, 32, 4, 5)]:
        try:
            ms = bench_ms(lambda: two_level_gemm_triton(qx2, qwt, block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns))
            rows.append({"shape": f"{M}x{K}x{N}", "BM,BN,BK,warps,stages": f"{bm},{bn},{bk},{nw},{ns}", "ms": ms,
                         "TFLOP/s": 2 * M * N * K / ms / 1e9})
        except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, not fatal
            rows.append({"shape": f"{M}x{K}x{N}", "BM,BN,BK,warps,stages": f"{bm},{bn},{bk},{nw},{ns}", "ms": str(e)[:60]})
    return rows


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="1.5B,7B")
    p.add_argument("--tokens", default="8192,16384")
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--cached-weight", action="store_true")
    p.add_argument("--compiled", action="store_true", help="torch.compile both sides (the training path)")
    p.add_argument("--cuda-graph", action="store_true", help="time each side's fwd+bwd as one replayed CUDA graph")
    p.add_argument("--torchao", default="1.5B:8192",
                   help="model:tokens pairs that get the torchao peer row ('' for none); its quantize kernels "
                        "autotune ~45 configs per new shape, so every pair costs about half a minute")
    p.add_argument("--tune-moss", action="store_true", help="only sweep MOSS GEMM tile configs")
    args = p.parse_args(argv)
    if args.cuda_graph and not args.cached_weight:
        p.error("--cuda-graph needs --cached-weight: a captured graph would replay the weight's quantization with "
                "MOSS's automatic scale, a host-side prediction, frozen at its capture-time value")
    models, recipes = args.models.split(","), args.recipes.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.tune_moss:
        rows = [r for (m, proj, K, N) in projections(models[:1]) for r in tune_moss(tokens[0], K, N)]
        emit("MOSS two-level GEMM tile sweep", [markdown_table(rows)], args.out)
        return
    rows, gemm_rows, totals = [], [], {}
    ao_note = None
    copy_gbs = copy_bandwidth_gbs()
    for M in tokens:
        for model, proj, K, N in projections(models):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
            row = {"model": model, "proj": proj, "M,K,N": f"{M},{K},{N}"}
            base = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
            row["bf16 ms"] = fwd_bwd_ms(compile_static(base) if args.compiled else base, x, dy, graph=args.cuda_graph)
            for r in recipes:
                layer = Fp8Linear(K, N, bias=False, recipe=r, device="cuda", dtype=torch.bfloat16)
                layer.weight.data.copy_(base.weight.data)
                before = None if args.cached_weight else layer.weight_cache.invalidate
                run = CompiledFp8(layer) if args.compiled else layer
                row[f"{r} x"] = row["bf16 ms"] / fwd_bwd_ms(run, x, dy, before, graph=args.cuda_graph)
            if f"{model}:{M}" in args.torchao.split(","):
                ao, ao_note = torchao_layer(K, N)
                if ao is not None:
                    row["torchao blockwise x"] = row["bf16 ms"] / fwd_bwd_ms(ao, x, dy)
            q = quant_ms(M, K, N, weight=not args.cached_weight)
            blk_ms = row["bf16 ms"] / row["fp8_blockwise_ue8m0 x"] if "fp8_blockwise_ue8m0 x" in row else float("nan")
            row["quant % of blockwise step"] = 100 * q / blk_ms
            qb = quant_bytes(M, K, N, weight=not args.cached_weight)
            row["quant % of copy BW"] = 100 * qb / q / 1e6 / copy_gbs
            totals["quant bytes"] = totals.get("quant bytes", 0) + qb
            for key in [k for k in row if k.endswith(" x") and "torchao" not in k] + ["bf16 ms"]:
                ms = row["bf16 ms"] / row[key] if key.endswith(" x") else row[key]
                totals[key] = totals.get(key, 0.0) + ms
            totals["quant ms"] = totals.get("quant ms", 0.0) + q
            rows.append(row)
            gemm_rows.append({"M,K,N": row["M,K,N"], **gemm_rates(M, K, N)})
            print(markdown_table([row]).splitlines()[-1], flush=True)
            del x, dy
            torch.cuda.empty_cache()
    if "fp8_blockwise_ue8m0" in recipes:
        # After every timing: CUPTI stays subscribed after a profiler session (kernel_times_us), adding host
        # work to each later launch, which the host-bound rows (small GEMMs) would be timed with.
        flush = l2_flush()
        for row in rows:
            q = profiled_quant_ms(*map(int, row["M,K,N"].split(",")), args, flush)
            row["quant % in step (profiled)"] = 100 * q * row["fp8_blockwise_ue8m0 x"] / row["bf16 ms"]
            totals["quant ms in step"] = totals.get("quant ms in step", 0.0) + q
    summary = [{"recipe": k[:-2], "summed ms": v, "speedup vs bf16 (summed)": totals["bf16 ms"] / v}
               for k, v in totals.items() if k.endswith(" x") and "torchao" not in k]
    ao_rows = [r for r in rows if "torchao blockwise x" in r]
    if ao_rows:  # the peer ran on a subset: compare on that subset only
        bf, ao = sum(r["bf16 ms"] for r in ao_rows), sum(r["bf16 ms"] / r["torchao blockwise x"] for r in ao_rows)
        ours = sum(r["bf16 ms"] / r["fp8_blockwise_ue8m0 x"] for r in ao_rows if "fp8_blockwise_ue8m0 x" in r)
        summary.append({"recipe": f"torchao blockwise ({len(ao_rows)} shapes)", "summed ms": ao, "speedup vs bf16 (summed)": bf / ao})
        summary.append({"recipe": f"fp8_blockwise_ue8m0 on the same {len(ao_rows)} shapes", "summed ms": ours,
                        "speedup vs bf16 (summed)": bf / ours if ours else float("nan")})
    summary.append({"recipe": "bf16 nn.Linear", "summed ms": totals["bf16 ms"], "speedup vs bf16 (summed)": 1.0})
    blk_total = totals.get("fp8_blockwise_ue8m0 x", float("nan"))
    q_share = 100 * totals["quant ms"] / blk_total
    # what the share would be with every quantizer at copy speed, the rest of the step unchanged
    q_floor = totals["quant bytes"] / copy_gbs / 1e6
    floor_share = 100 * q_floor / (blk_total - totals["quant ms"] + q_floor)
    sections = [
        f"weight re-quantized every step: {not args.cached_weight}; torch.compile: {args.compiled}; "
        f"one CUDA graph per fwd+bwd: {args.cuda_graph}",
        "### fwd+bwd speedup over bf16 nn.Linear (x = bf16 ms / recipe ms)", markdown_table(rows),
        "### summed over the shapes", markdown_table(summary),
        f"quantization kernels: {q_share:.2f}% of the fp8_blockwise_ue8m0 step (summed; X and dY in both layouts"
        f"{'' if args.cached_weight else ', W and W^T'}, each timed alone); they move their bytes at "
        f"{100 * q_floor / totals['quant ms']:.1f}% of the measured copy bandwidth ({copy_gbs:.0f} GB/s); at 100% "
        f"the share would be {floor_share:.1f}%",
        f"quantization kernels in the step itself (torch.profiler, their own GPU time in the timed fwd+bwd, after the "
        f"same L2 flush): {100 * totals['quant ms in step'] / blk_total:.2f}% of the fp8_blockwise_ue8m0 step (summed)"
        if "quant ms in step" in totals else "quantization kernels in the step itself: not profiled (no fp8_blockwise_ue8m0)",
        "### GEMM only (fprop shape)", markdown_table(gemm_rows),
    ]
    if ao_note:
        sections.append(f"torchao row skipped: {ao_note}")
    emit("FP8 linear fwd+bwd", sections, args.out)


if __name__ == "__main__":
    main()
