"""quant_both.cu against another git revision of it: the same bytes out, and each one's time.

Both sources are built with nvcc as infir builds its own (kernels/cuda_build.py), the older one from
`git show REV:...` with the headers of the same revision (or from a directory holding quant_both.cu and
fp8_common.cuh, where no git history travels with the tree), and called through the same ctypes entry
points, alternating, on the same inputs. A kernel change is kept when its bytes equal the older
kernel's on every output and it is faster: this is the check, in one process and one machine, that
bench/quant.py's absolute figures (which move by a few percent between machines) cannot give.

  python bench/cuda_ab.py --old HEAD --out /root/out/ab.md
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import base_parser, bench_ms, copy_bandwidth_gbs, emit, markdown_table  # noqa: E402
from infir.fp8.kernels import cuda_build  # noqa: E402
from infir.fp8.kernels import cuda_lib  # noqa: E402

SRC = Path("infir/fp8/kernels")
# default shapes: X of the Qwen2.5 projections (hidden 896 .. 8192 columns), SwiGLU at 0.5B/1.5B/7B's ffn
X_SHAPES = "16384x8192,8192x18944,8192x3584,16384x1536,8192x1536,8192x896"
FFN_SHAPES = "8192x4864,8192x8960,8192x18944"


def build(rev: str | None) -> ctypes.CDLL:
    """quant_both.cu of `rev`, a git revision or a directory (None: the working tree), built for this
    GPU, its kernels set up."""
    root = Path(__file__).resolve().parents[1]
    src = root / SRC / "quant_both.cu"
    if rev is not None and Path(rev).is_dir():
        src = Path(rev) / "quant_both.cu"
    elif rev is not None:
        tmp = Path(tempfile.mkdtemp(prefix="cuda_ab_"))
        for name in ["quant_both.cu", "fp8_common.cuh"]:
            text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{SRC / name}"], check=True,
                                  capture_output=True, text=True).stdout
            (tmp / name).write_text(text)
        src = tmp / "quant_both.cu"
    dev = torch.device("cuda")
    lib = ctypes.CDLL(str(cuda_build.build(src, cuda_build.gpu_arch(dev), cuda_build.find_nvcc())))
    if lib.infir_quant_token_both_init():
        raise RuntimeError(f"quant_both.cu ({rev or 'working tree'}): kernel setup failed")
    for entry, (_, _, argtypes) in cuda_lib.CUDA_ENTRY.items():
        if entry.startswith("infir_swiglu") or entry == "infir_quant_token_both":
            fn = getattr(lib, entry)
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
    return lib


def calls(lib, shape: str, kind: str, loads: int):
    """(bytes moved, a function launching `kind` at `shape` into fixed outputs, those outputs)."""
    a, b = map(int, shape.split("x"))
    stream = torch.cuda.current_stream().cuda_stream
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "plain":
        M, K = a, b
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        out = cuda_lib.both_layouts_outputs(M, K, "e4m3", x.device)
        ptrs = [t.data_ptr() for t in out]
        return (4 * M * K + 8 * M * K // 128, out,
                lambda: lib.infir_quant_token_both(x.data_ptr(), K, *ptrs, M, K, 1, 0, loads, stream))
    M, F = a, b
    if kind == "swiglu_bwd":
        # FP8 bytes of either sign, none NaN (0x7f, 0xff)
        qh = (torch.randint(0, 0x7F, (M, 2 * F), device="cuda", generator=g)
              + 0x80 * torch.randint(0, 2, (M, 2 * F), device="cuda", generator=g)).to(torch.uint8)
        sh = torch.full((M, 2 * F // 128), 2.0 ** -4, device="cuda")
        dy = torch.randn(M, F, device="cuda", dtype=torch.bfloat16, generator=g)
        out = cuda_lib.both_layouts_outputs(M, 2 * F, "e4m3", dy.device)
        ptrs = [t.data_ptr() for t in out]
        return (8 * M * F + 16 * F * M // 128, out,
                lambda: lib.infir_swiglu_bwd_quant_both(qh.data_ptr(), sh.data_ptr(), 0, dy.data_ptr(), F, *ptrs,
                                                        M, F, 1, 0, loads, stream))
    h = torch.randn(M, 2 * F, device="cuda", dtype=torch.bfloat16, generator=g)
    qh = torch.empty(M, 2 * F, device="cuda", dtype=torch.uint8)
    sh = torch.empty(M, 2 * F // 128, device="cuda")
    out = (qh, sh) + cuda_lib.both_layouts_outputs(M, F, "e4m3", h.device)
    ptrs = [t.data_ptr() for t in out[2:]]
    return (8 * M * F + 16 * F * M // 128, out,
            lambda: lib.infir_swiglu_fwd_quant_both(h.data_ptr(), 2 * F, qh.data_ptr(), sh.data_ptr(), 1, 0, *ptrs,
                                                    M, F, 1, 0, loads, stream))


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--old", default="HEAD", help="the git revision (or a directory with its quant_both.cu and "
                   "fp8_common.cuh) to compare the working tree's kernel with")
    p.add_argument("--x-shapes", default=X_SHAPES)
    p.add_argument("--ffn-shapes", default=FFN_SHAPES)
    p.add_argument("--rounds", type=int, default=3, help="timings a side, alternating; each side's median is kept")
    args = p.parse_args(argv)
    bw = copy_bandwidth_gbs()
    libs = {"old": build(args.old), "new": build(None)}
    jobs = [(s, "plain", 4) for s in args.x_shapes.split(",")]
    jobs += [(s, k, 4) for s in args.ffn_shapes.split(",") for k in ("swiglu_bwd", "swiglu_fwd")]
    rows = []
    for shape, kind, loads in jobs:
        side = {}
        for name, lib in libs.items():
            nbytes, out, fn = calls(lib, shape, kind, loads)
            if fn():
                raise RuntimeError(f"{name} {kind} launch failed at {shape}")
            side[name] = (fn, [t.clone() for t in out])
        bits = lambda t: t.view(torch.int32 if t.element_size() == 4 else torch.uint8)  # NaN scales compare too
        same = all(torch.equal(bits(a), bits(b)) for a, b in zip(side["old"][1], side["new"][1]))
        times = {n: [] for n in side}
        for _ in range(args.rounds):
            for n, (fn, _) in side.items():
                times[n].append(bench_ms(fn))
        med = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
        rows.append({"kernel": kind, "shape": shape, "bytes equal": same,
                     "old ms": med["old"], "new ms": med["new"], "old/new": med["old"] / med["new"],
                     "old % copy BW": 100 * nbytes / med["old"] / 1e6 / bw,
                     "new % copy BW": 100 * nbytes / med["new"] / 1e6 / bw,
                     "rounds (old / new)": " ".join(f"{t * 1e3:.1f}" for t in times["old"]) + " / "
                     + " ".join(f"{t * 1e3:.1f}" for t in times["new"])})
        print(rows[-1], flush=True)
        side = None
        torch.cuda.empty_cache()
    emit(f"quant_both.cu: working tree vs {args.old}",
         [f"measured copy bandwidth (read+write): {bw:.0f} GB/s; times in us in the rounds column",
          markdown_table(rows)], args.out)


if __name__ == "__main__":
    main()
