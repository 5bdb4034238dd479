"""The FP8 wgrad GEMM (1x128 x 1x128 scales along the tokens, added into FP32) through CUTLASS's Hopper
blockwise-scaled kernels, against cuBLASLt's algorithm that infir runs (kernels/lt_wgrad.cu).

Why: at 7B gate_up that GEMM is the slowest of the three, well behind fprop and dgrad for the same
FLOPs (bench/linear_kernels.py times them), and cuBLASLt offers nothing faster for these scales
(bench/wgrad_lt.py). CUTLASS ships the same product as templates (examples/67, groupwise); this times
three of its schedules, built from bench/cutlass_wgrad_probe.cu against the headers of PyPI's
`nvidia-cutlass` wheel, at bench/linear.py's projection shapes.

  pip install --no-deps nvidia-cutlass   # headers only; or pass --cutlass-root
  python bench/cutlass_wgrad_probe.py --out /root/out/cutlass_wgrad.md
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import base_parser, bench_ms, emit, markdown_table  # noqa: E402
from bench.linear import MODELS, projections  # noqa: E402
from infir.fp8 import quantize  # noqa: E402
from infir.fp8.gemm import fp8_gemm_accumulate, outer_dim_major  # noqa: E402
from infir.fp8.kernels import cuda_build  # noqa: E402

VARIANTS = {0: "cooperative 128x128, cluster 1x2", 1: "cooperative 128x128, cluster 2x1", 2: "pingpong 64x128, cluster 1x2"}


def cutlass_root(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    spec = importlib.util.find_spec("cutlass_library")  # nvidia-cutlass's package, not imported (its deps)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("cutlass_wgrad_probe: CUTLASS headers not found; `pip install --no-deps nvidia-cutlass` "
                         "or pass --cutlass-root DIR (the directory holding include/ and tools/util/include/)")
    return Path(list(spec.submodule_search_locations)[0]) / "source"


def build(root: Path) -> ctypes.CDLL:
    src = Path(__file__).with_name("cutlass_wgrad_probe.cu")
    nvcc = cuda_build.find_nvcc()
    if nvcc is None:
        raise SystemExit("cutlass_wgrad_probe: nvcc not found; put the CUDA toolkit's bin on PATH or set CUDA_HOME")
    flags = ["-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",  # asserts serialize the wgmma pipeline
             f"-I{root / 'include'}", f"-I{root / 'tools' / 'util' / 'include'}"]
    lib = ctypes.CDLL(str(cuda_build.build(src, cuda_build.gpu_arch(torch.device("cuda")), nvcc, flags)))
    lib.probe_wgrad.restype = ctypes.c_int
    lib.probe_wgrad.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    return lib


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="1.5B,7B", help=f"of {sorted(MODELS)}")
    p.add_argument("--tokens", default="8192,16384")
    p.add_argument("--cutlass-root")
    args = p.parse_args(argv)
    lib = build(cutlass_root(args.cutlass_root))
    stream = torch.cuda.current_stream().cuda_stream
    rows, totals = [], {}
    for T in (int(t) for t in args.tokens.split(",")):
        for model, proj, K, N in projections(args.models.split(",")):
            # dW [N, K] += dY^T [N, T] X [T, K]: both operands quantized 1x128 along the tokens
            qa = quantize(torch.randn(N, T, device="cuda", dtype=torch.bfloat16), "token")
            qb = quantize(torch.randn(K, T, device="cuda", dtype=torch.bfloat16), "token")
            sa, sb = outer_dim_major(qa.scale), outer_dim_major(qb.scale)
            ref = torch.zeros(N, K, device="cuda")
            fp8_gemm_accumulate(qa, qb, ref)
            out = torch.zeros_like(ref)
            row = {"model": model, "proj": proj, "wgrad M,N,K": f"{N},{K},{T}"}
            lt_ms = bench_ms(lambda: fp8_gemm_accumulate(qa, qb, out))
            row["cuBLASLt ms"] = lt_ms
            totals["cuBLASLt"] = totals.get("cuBLASLt", 0.0) + lt_ms
            for v, name in VARIANTS.items():
                def call():
                    err = lib.probe_wgrad(v, qa.data.data_ptr(), sa.data_ptr(), qb.data.data_ptr(), sb.data_ptr(),
                                          out.data_ptr(), N, K, T, stream)
                    if err:
                        raise RuntimeError(f"CUTLASS variant {v} failed ({err}) at {N}x{K}x{T}")
                out.zero_()
                try:
                    call()
                except RuntimeError as e:  # a schedule CUTLASS cannot run at this shape: say so, go on
                    row[f"{name} ms"] = str(e)
                    continue
                torch.cuda.synchronize()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                ms = bench_ms(call)
                row[f"{name} ms"] = ms
                row[f"{name}: lt/cutlass"] = lt_ms / ms
                row[f"{name}: max err / max"] = err
                totals[name] = totals.get(name, 0.0) + ms
            rows.append(row)
            print(markdown_table([row]).splitlines()[-1], flush=True)
    # a variant that failed at some shape is summed over fewer shapes: marked, not compared
    ran = {k: sum(isinstance(r.get(f"{k} ms"), float) for r in rows) for k in VARIANTS.values()}
    summary = [{"wgrad path": k, "summed ms": v,
                "cuBLASLt / it": totals["cuBLASLt"] / v if ran.get(k, len(rows)) == len(rows) else "ran at "
                f"{ran[k]} of {len(rows)} shapes"} for k, v in totals.items()]
    emit("FP8 wgrad GEMM: CUTLASS blockwise (1x128 x 1x128) vs cuBLASLt, accumulating into FP32",
         [markdown_table(rows), "### summed over the shapes", markdown_table(summary)], args.out)


if __name__ == "__main__":
    main()
