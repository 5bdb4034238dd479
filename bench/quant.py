"""FP8 quantization kernels: time and HBM bandwidth at 16k x 8192 bf16 (and other sizes), and the
host cost of one wrapper call.

Bytes counted: each input read once plus each output (FP8 data, scales) written once, the
fewest any implementation must move; the percentage is of the measured copy bandwidth. The
just-in-time per-tensor quantizer must read X twice (amax pass, then quantize pass: the scale of
the first element depends on the last), so its row counts 2 reads + 1 write.

--host: microseconds of host time per call, 1000 calls on a 256x256 tensor without synchronizing
(the GPU work is a few microseconds, so the host is the bottleneck: this is what a host-bound
training step pays per quantization).
--sweep: every kernel configuration, timed at each shape (tuning).
--old PATH: also time an older kernels/quant.py (before/after comparisons in one run).
--swiglu: SwiGLU and the FP8 quantizers around it at tokens x ffn shapes, unfused (SwiGLU's Triton
kernel, then the both-layouts quantizer) against quant_both.cu's fused kernels: backward, FC1's
gradient operands (dh never written in bf16); forward, FC2's input operands with h's FP8 copy (y
never written in bf16). Bytes are the fused pass's, the least either way must move, so the unfused
pair's share shows what it costs extra.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import base_parser, bench_ms, copy_bandwidth_gbs, emit, markdown_table  # noqa: E402
from infir.fp8 import kernels as kn  # noqa: E402
from infir.fp8.kernels import autotune, cuda_lib, quant_token  # noqa: E402
from infir.fp8.policy import policy_override  # noqa: E402


def load_old(path):
    spec = importlib.util.spec_from_file_location("infir.fp8.kernels._quant_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cases(x, k=kn):
    M, K = x.shape
    n = M * K
    read = 2 * n
    one = torch.ones((), device=x.device)
    return [
        ("token 1x128 (X along K)", lambda: k.quantize_token_triton(x), read + n + 4 * n // 128),
        ("token 128x1 along M, written transposed (X^T)", lambda: k.quantize_token_triton(x, rows=False, cols=True),
         read + n + 4 * n // 128),
        ("token both layouts (X and X^T, one launch)", lambda: k.quantize_token_triton(x, rows=True, cols=True),
         read + 2 * n + 8 * n // 128),
        ("block 128x128 (W)", lambda: k.quantize_block_triton(x), read + n + 4 * n // 16384),
        ("two_level (MOSS, 32)", lambda: k.quantize_two_level_triton(x), read + n + 5 * n // 32 + 4 * M),
        ("two_level folded (MOSS GEMM operand)", lambda: k.quantize_two_level_triton(x, fold=True), read + n + 4 * M),
        ("tensor JIT (amax + quantize: 2 reads + 1 write)", lambda: k.quantize_tensor_triton(x, "fp32"), 2 * read + n),
        ("tensor, given scale (autoscale)", lambda: k.quantize_tensor_triton(x, "fp32", scale=one), read + n),
    ] + transpose_cases(x, k)


def transpose_cases(x, k):
    """The backward's transposes (W^T for dgrad; per-tensor and MOSS X^T), by our kernel and by
    torch's transposing copy, which they replaced; bytes = one read + one write."""
    if not hasattr(k, "transpose_2d"):  # an --old module from before the kernel
        return []
    x8 = x.to(torch.float8_e4m3fn)
    n = x.numel()
    return [
        ("transpose FP8 (W^T), Triton", lambda: k.transpose_2d(x8), 2 * n),
        ("transpose FP8 (W^T), torch x.view(uint8).t().contiguous()", lambda: x8.view(torch.uint8).t().contiguous(), 2 * n),
        ("transpose BF16 (MOSS X^T), Triton", lambda: k.transpose_2d(x), 4 * n),
        ("transpose BF16 (MOSS X^T), torch x.t().contiguous()", lambda: x.t().contiguous(), 4 * n),
    ]


def host_cases(x, k=kn):
    one = torch.ones((), device=x.device)
    w = x
    return [
        ("quantize_token_triton(x, rows=True, cols=True)", lambda: k.quantize_token_triton(x, rows=True, cols=True)),
        ("quantize_token_triton(x)", lambda: k.quantize_token_triton(x)),
        ("quantize_block_triton(w)", lambda: k.quantize_block_triton(w)),
        ("quantize_two_level_triton(x, fold=True)", lambda: k.quantize_two_level_triton(x, fold=True)),
        ("quantize_tensor_triton(x) (JIT)", lambda: k.quantize_tensor_triton(x)),
        ("quantize_tensor_triton(x, scale=s)", lambda: k.quantize_tensor_triton(x, scale=one)),
    ]


def traced_host_cases(x):
    """The ops a compiled FP8 layer calls (infir.fp8.ops), beside what they wrap: where a step is
    host-bound, the gap between the two is the op layer's own cost."""
    import torch.nn.functional as F

    from infir.fp8 import quantize
    from infir.fp8.gemm import fp8_gemm, scaled_mm_scale
    from infir.fp8.ops import fp8_mm

    @torch.library.custom_op("infir_bench::clone", mutates_args=())
    def clone_op(t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    qx, qw = quantize(x, "token", "ue8m0"), quantize(x, "block", "ue8m0")
    sb, sbt = scaled_mm_scale(qw), scaled_mm_scale(qw, transposed=True)  # as a weight cache makes them
    st, sw = F.ScalingType, F.SwizzleType.NO_SWIZZLE
    ops = torch.ops.infir
    return [
        ("x.clone()", lambda: x.clone()),
        ("custom op around x.clone()", lambda: clone_op(x)),
        ("infir::fp8_quantize_pair(x, token, cols=True)", lambda: ops.fp8_quantize_pair(x, "token", "ue8m0", "e4m3", True)),
        ("F.scaled_mm(1x128 x 128x128), scales prepared", lambda: F.scaled_mm(
            qx.data, qw.data.t(), qx.scale, st.BlockWise1x128, sb, st.BlockWise128x128, swizzle_a=sw, swizzle_b=sw,
            output_dtype=torch.bfloat16)),
        ("torch._scaled_mm(1x128 x 128x128), scales prepared", lambda: torch._scaled_mm(
            qx.data, qw.data.t(), qx.scale, sb, out_dtype=torch.bfloat16)),
        ("fp8_gemm(qx, qw) (weight QTensor kept)", lambda: fp8_gemm(qx, qw)),
        ("infir::fp8_mm fprop, scale layout per call", lambda: fp8_mm(qx.data, qx.scale, "token", qw.data, qw.scale,
                                                                       "block", torch.bfloat16)),
        ("infir::fp8_mm fprop, weight's layout prepared", lambda: fp8_mm(qx.data, qx.scale, "token", qw.data, qw.scale,
                                                                          "block", torch.bfloat16, False, sb)),
        ("infir::fp8_mm dgrad (W^T bytes made inside), prepared", lambda: fp8_mm(
            qx.data, qx.scale, "token", qw.data, qw.scale, "block", torch.bfloat16, True, sbt)),
        ("infir::fp8_mm wgrad (token x token)", lambda: fp8_mm(qx.data, qx.scale, "token", qx.data, qx.scale, "token",
                                                              torch.float32)),
    ]


def host_us(fn, n=1000, repeats=5):
    """Host microseconds per call, n calls without synchronizing (median of `repeats` runs)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def both_host_rows():
    rows = []
    for shape in ((256, 256), (8192, 1536), (8192, 17920)):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        cfgs = [("Triton default", autotune.TRITON_BOTH)] + ([("CUDA", {"CUDA": True, "LOADS": 4})] if cuda_lib.cuda_both_ok(x) else [])
        for name, cfg in cfgs:
            run = quant_token.token_runner(x, "ue8m0", "e4m3", True, True, 32, dict(cfg))
            rows.append({"shape (bf16)": "x".join(map(str, shape)), "kernel": name,
                         "host us/call": host_us(lambda: run(x)), "kernel us": 1e3 * bench_ms(lambda: run(x))})
    return rows


def sweep_variants():
    """(name, setup) pairs: setup() changes autotune's defaults; the cache is cleared after it."""
    out = []

    def cfg(name, **kw):
        def setup():
            autotune.DEFAULT_CFG[name] = dict(kw)
        return setup

    for c in autotune.BOTH_CONFIGS:
        out.append(("both " + ",".join(f"{k}={v}" for k, v in c.items()), "both", cfg("both", **c)))
    for c in autotune.COLS_CONFIGS:
        out.append(("cols " + ",".join(f"{k}={v}" for k, v in c.items()), "cols", cfg("cols", **c)))
    for w in (2, 4, 8):
        out.append((f"rows num_warps={w}", "rows", cfg("rows", num_warps=w)))
    for w in (4, 8, 16):
        out.append((f"block num_warps={w}", "block", cfg("block", num_warps=w)))
    for bm, bk in ((32, 128), (64, 128), (128, 128), (32, 256)):
        for w in (4, 8):
            out.append((f"scalar BM={bm},BK={bk},num_warps={w}", "scalar", cfg("scalar", BM=bm, BK=bk, num_warps=w)))
    for blk, w, ps in ((4096, 8, 4), (8192, 8, 4), (4096, 4, 8), (2048, 4, 8)):
        out.append((f"amax BLOCK={blk},num_warps={w},per_sm={ps}", "amax", cfg("amax", BLOCK=blk, num_warps=w, per_sm=ps)))
    return out


def sweep_calls(x):
    one = torch.ones((), device=x.device)
    return {
        "both": lambda: kn.quantize_token_triton(x, rows=True, cols=True),
        "cols": lambda: kn.quantize_token_triton(x, rows=False, cols=True),
        "rows": lambda: kn.quantize_token_triton(x),
        "block": lambda: kn.quantize_block_triton(x),
        "scalar": lambda: kn.quantize_tensor_triton(x, "fp32", scale=one),
        "amax": lambda: kn.quantize_tensor_triton(x, "fp32"),
    }


def same(a, b):
    if a is None or b is None:
        return a is b
    if isinstance(a, tuple):
        return all(same(u, v) for u, v in zip(a, b))
    ok = torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    return bool(ok)


def run_sweep(shapes, bw, out, only=None):
    with policy_override(autotune=False):  # time each configuration as set
        _run_sweep(shapes, bw, out, only)


def _run_sweep(shapes, bw, out, only):
    import copy

    base = copy.deepcopy(autotune.DEFAULT_CFG)
    rows = []
    for shape in shapes:
        M, K = map(int, shape.split("x"))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * torch.exp(torch.randn(M, K, device="cuda") * 2).bfloat16()
        nbytes = {c[0]: c[2] for c in cases(x)}
        calls = sweep_calls(x)
        byt = {"both": nbytes["token both layouts (X and X^T, one launch)"],
               "cols": nbytes["token 128x1 along M, written transposed (X^T)"],
               "rows": nbytes["token 1x128 (X along K)"], "block": nbytes["block 128x128 (W)"],
               "scalar": nbytes["tensor, given scale (autoscale)"],
               "amax": nbytes["tensor JIT (amax + quantize: 2 reads + 1 write)"]}
        autotune.DEFAULT_CFG.update(copy.deepcopy(base))
        autotune.clear_launch_cache()
        refs = {name: fn() for name, fn in calls.items()}
        for label, name, setup in sweep_variants():
            if only is not None and name != only:
                continue
            autotune.DEFAULT_CFG.update(copy.deepcopy(base))
            setup()
            autotune.clear_launch_cache()
            ok = same(calls[name](), refs[name])
            ms = bench_ms(calls[name])
            rows.append({"shape": shape, "variant": label, "bits == default": ok, "ms": ms,
                         "% of copy BW": 100 * byt[name] / ms / 1e6 / bw})
            print(rows[-1], flush=True)
        two_level = [] if only not in (None, "two_level") else [
            ("triton", bm, bk, nw) for bm, bk, nw in
            [(1, 1024, 4), (1, 2048, 8), (2, 1024, 4), (2, 2048, 8), (4, 512, 4), (4, 1024, 8), (8, 512, 8)]]
        two_level += [("cuda", 2, 2048, 8)] if two_level and cuda_lib.cuda_two_level_ok(x) else []
        for impl, bm, bk, nw in two_level:
            for fold in (False, True):
                fn = lambda: kn.quantize_two_level_triton(x, fold=fold, block_m=bm, block_k=bk, num_warps=nw, impl=impl)
                ms = bench_ms(fn)
                nb = 3 * M * K + 4 * M + (0 if fold else 5 * M * K // 32)
                label = f"BM={bm},BK={bk},warps={nw}" if impl == "triton" else "CUDA (quant_two_level.cu)"
                rows.append({"shape": shape, "variant": f"two_level fold={fold} {label}",
                             "bits == default": same(fn(), kn.quantize_two_level_triton(x, fold=fold, impl="triton")),
                             "ms": ms, "% of copy BW": 100 * nb / ms / 1e6 / bw})
                print(rows[-1], flush=True)
        x = None
        torch.cuda.empty_cache()
    emit("FP8 quantization kernels: configuration sweep", [f"measured copy bandwidth (read+write): {bw:.0f} GB/s",
                                                            markdown_table(rows)], out)


def run_swiglu(shapes, bw, out):
    from infir.fp8.kernels import swiglu as ks
    from infir.fp8.quantize import QTensor

    def pair(o):  # the both-layouts operands of a (q, scale, q^T, scale^T) tuple
        return QTensor(o[0], o[1], "token"), QTensor(o[2], o[3], "token")

    def quantize_both(x):
        return tuple(t for qt in kn.quantize_token_triton(x, rows=True, cols=True) for t in (qt.data, qt.scale))

    def swiglu_then_quantize(h):
        y, qh, sh = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
        return (qh, sh, *quantize_both(y))

    rows = []
    for shape in shapes:
        M, F = map(int, shape.split("x"))
        h = torch.randn(M, 2 * F, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, F, device="cuda", dtype=torch.bfloat16)
        _, q, s = ks.swiglu_fp8_fwd(h, "ue8m0", "e4m3")
        scales = 4 * F * M // 128  # bytes of one FP32 scale per 128 values of an [M, F] tensor
        # (pass, bytes of the fused pass, unfused, fused(loads), the outputs compared)
        cases = [
            ("backward: FC1's gradient operands", 2 * F * M + 2 * F * M + 4 * F * M + 4 * scales,
             ("SwiGLU backward (Triton), then quantize both layouts",
              lambda: quantize_both(ks.swiglu_fp8_bwd(q, s, dy, torch.bfloat16))),
             lambda n: ks.swiglu_fp8_bwd_quant(q, s, dy, "ue8m0", "e4m3", n), lambda o: o),
            ("forward: FC2's input operands (+ h's FP8 copy)", 4 * F * M + 2 * F * M + 2 * scales + 2 * F * M + 2 * scales,
             ("SwiGLU forward (Triton), then quantize both layouts", lambda: swiglu_then_quantize(h)),
             lambda n: ks.swiglu_fp8_fwd_quant(h, "ue8m0", "e4m3", "ue8m0", "e4m3", n), lambda o: o[2:]),
        ]
        for direction, nbytes, (uname, unfused), fused, compared in cases:
            base = bench_ms(unfused)
            ref = pair(compared(unfused()))
            for name, fn, loads in [(uname, unfused, None)] + [(f"fused (quant_both.cu, loads {n})",
                                                                 (lambda n=n: fused(n)), n) for n in (2, 4)]:
                ms = base if loads is None else bench_ms(fn)
                # the fused kernels' exp and division are the fast ones: bits may differ in rare ulps
                differ = sum(int((a.data.view(torch.uint8) != b.data.view(torch.uint8)).sum())
                             for a, b in zip(pair(compared(fn())), ref))
                rows.append({"tokens x ffn": shape, "pass": direction, "kernels": name, "ms": ms,
                             "% of copy BW (fused bytes)": 100 * nbytes / ms / 1e6 / bw, "x vs unfused": base / ms,
                             "bytes differing from unfused": f"{differ / (2 * ref[0].data.numel()):.2e}"})
                print(rows[-1], flush=True)
        h = dy = q = s = None
        torch.cuda.empty_cache()
    emit("SwiGLU fused with FC1's / FC2's FP8 quantizers, unfused vs fused",
         [f"measured copy bandwidth (read+write): {bw:.0f} GB/s", markdown_table(rows)], out)


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--shapes", default="16384x8192,8192x3584,8192x18944")
    p.add_argument("--host", action="store_true", help="also measure the host cost per call")
    p.add_argument("--sweep", action="store_true", help="time every kernel configuration instead")
    p.add_argument("--old", help="path of an older kernels/quant.py to time beside this one")
    p.add_argument("--swiglu", action="store_true", help="time SwiGLU's forward / backward + quantizer, unfused vs fused, "
                   "at tokens x ffn shapes (--shapes, default the Qwen2.5 0.5B/1.5B/7B ffn sizes)")
    p.add_argument("--only", choices=["both", "cols", "rows", "block", "scalar", "amax", "two_level"],
                   help="with --sweep: only this kernel's configurations")
    p.add_argument("--kernels", default="",
                   help="the default table: only the rows whose kernel name contains this text (e.g. 'both layouts'); "
                        "without it a fresh machine compiles and autotunes every kernel's configurations, minutes in all")
    args = p.parse_args(argv)
    bw = copy_bandwidth_gbs()
    if args.swiglu:
        shapes = args.shapes if args.shapes != p.get_default("shapes") else "8192x4864,8192x8960,8192x18944"
        run_swiglu(shapes.split(","), bw, args.out)
        return
    if args.sweep:
        run_sweep(args.shapes.split(","), bw, args.out, args.only)
        return
    old = load_old(args.old) if args.old else None
    impls = [("", kn)] + ([("old ", old)] if old else [])
    rows = []
    for shape in args.shapes.split(","):
        M, K = map(int, shape.split("x"))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for tag, k in impls:
            for name, fn, nbytes in cases(x, k):
                if args.kernels not in name:
                    continue
                ms = bench_ms(fn)
                gbs = nbytes / ms / 1e6
                rows.append({"shape (bf16)": shape, "kernel": tag + name, "ms": ms, "GB/s": gbs, "% of copy BW": 100 * gbs / bw})
                print(rows[-1], flush=True)
        x = None  # free it before the next shape
        torch.cuda.empty_cache()
    sections = [f"measured copy bandwidth (read+write): {bw:.0f} GB/s", markdown_table(rows)]
    if args.host:
        x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        hrows = []
        for tag, k in impls:
            for name, fn in host_cases(x, k):
                hrows.append({"call (256x256 bf16)": tag + name, "host us/call": host_us(fn)})
        for name, fn in traced_host_cases(x):
            try:
                us = host_us(fn)
            except RuntimeError as e:  # e.g. a torch whose private _scaled_mm takes no blockwise scales
                us = f"error: {str(e).splitlines()[0][:80]}"
            hrows.append({"call (256x256 bf16)": name, "host us/call": us})
        sections += ["host cost per call (1000 calls without synchronizing, median of 5):", markdown_table(hrows),
                     "both layouts, each kernel's own launcher (no cache lookup): host time per call beside its "
                     "kernel time; where the host's exceeds the kernel's, timing single calls measures the host:",
                     markdown_table(both_host_rows())]
    emit("FP8 quantization kernels", sections, args.out)


if __name__ == "__main__":
    main()
