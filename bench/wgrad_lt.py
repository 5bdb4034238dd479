"""The wgrad GEMM (dW = dY^T X, 1x128 x 1x128 scales along the tokens) through cuBLASLt directly.

torch's scaled_mm takes the first algorithm of cuBLASLt's heuristic and writes a new tensor, which
the trainer then adds to megatron's FP32 main_grad. This bench times, at Qwen2.5 projection shapes:
  torch          scaled_mm, FP32 out (what the training step runs), and that plus main_grad.add_;
  lt beta=1      cuBLASLt accumulating into the FP32 buffer itself (D = A B^T + C), the heuristic's
                 first algorithm and the fastest of every algorithm and split-K variant it offers;
  lt bf16        the same search with bf16 out (the linear bench's bf16 weight);
  1x128 x 128x128  torch's scaled_mm with X^T in 128x128 blocks instead (fprop's kernel family), for scale.
and checks each cuBLASLt result against torch's. It builds bench/lt_probe.cu with nvcc.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import base_parser, bench_ms, emit, markdown_table  # noqa: E402
from bench.linear import projections  # noqa: E402
from infir.fp8 import fp8_gemm, quantize  # noqa: E402
from infir.fp8.gemm import outer_dim_major, scaled_mm_blockwise, scaled_mm_scale  # noqa: E402
from infir.fp8.dispatch import quantize_pair  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMES = {0: "none", 1: "inplace", 2: "compute", 4: "output"}


def loaded_cublaslt() -> str:
    """The libcublasLt torch has loaded (linking the probe to the same one)."""
    torch.ones(16, 16, device="cuda") @ torch.ones(16, 16, device="cuda")
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcublasLt" in line}
    if not paths:
        raise RuntimeError("torch has not loaded libcublasLt")
    return sorted(paths)[0]


def build() -> ctypes.CDLL:
    lib = loaded_cublaslt()
    incs = [os.path.join(os.path.dirname(os.path.dirname(lib)), "include"), "/usr/local/cuda/include"]
    inc = next((d for d in incs if os.path.exists(os.path.join(d, "cublasLt.h"))), None)
    if inc is None:
        raise RuntimeError(f"cublasLt.h not found in {incs}")
    out = os.path.join(tempfile.mkdtemp(), "lt_probe.so")
    cmd = ["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90a", f"-I{inc}", "-o", out,
           os.path.join(HERE, "lt_probe.cu"), f"-L{os.path.dirname(lib)}", f"-l:{os.path.basename(lib)}"]
    subprocess.run(cmd, check=True)
    so = ctypes.CDLL(out)
    so.lt_probe.restype = so.lt_run.restype = ctypes.c_int
    return so


MAXC = 512
_MS, _CFG, _WS = (ctypes.c_float * MAXC)(), (ctypes.c_int * (8 * MAXC))(), (ctypes.c_size_t * MAXC)()


def lt_search(so, a, sa, b, sb, b_block, out, d_fp32, beta, probe_args):
    """[(ms, config ints, workspace bytes)] of every candidate lt_probe timed for out = a b^T (+ beta out)."""
    ws, ws_bytes, stream, max_heur, reps = probe_args
    n_out, k_out = out.shape
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())
    cnt = so.lt_probe(ptr(a), ptr(b), ptr(sa), ptr(sb), ptr(out), n_out, k_out, a.shape[1], b_block, d_fp32,
                      ctypes.c_float(beta), ptr(ws), ctypes.c_size_t(ws_bytes), stream, max_heur, reps, MAXC,
                      _MS, _CFG, _WS)
    if cnt < 0:
        raise RuntimeError(f"lt_probe failed with cublasStatus {-cnt} at {tuple(out.shape)} x {a.shape[1]}")
    return [(_MS[i], list(_CFG[8 * i:8 * i + 8]), _WS[i]) for i in range(cnt) if _MS[i] > 0]


def forward_rows(so, tokens, model, proj, k, n, probe_args):
    """fprop (X W^T) and dgrad (dY W) at one shape: torch's scaled_mm vs cuBLASLt's first and best algorithm, bf16 out."""
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    qx, _ = quantize_pair(x, "token", "ue8m0", "e4m3")
    qdy, _ = quantize_pair(dy, "token", "ue8m0", "e4m3")
    rows = []
    for gemm, qa, qb in (("fprop", qx, quantize(w, "block", "ue8m0")), ("dgrad", qdy, quantize(w.t().contiguous(), "block", "ue8m0"))):
        sa, sb = outer_dim_major(qa.scale), scaled_mm_scale(qb)
        mm = lambda: scaled_mm_blockwise(qa.data, sa, qb.data, sb, "block", torch.bfloat16)
        ref = mm()
        t_torch = bench_ms(mm)
        out = torch.empty_like(ref)
        cands = lt_search(so, qa.data, sa, qb.data, sb, 1, out, 0, 0.0, probe_args)
        first, best = next(c for c in cands if c[1][7] == 0), min(cands, key=lambda c: c[0])
        flop = 2.0 * tokens * qa.data.shape[1] * qb.data.shape[0]
        rows.append({"model": model, "proj": proj, "gemm": gemm, "M,K,N": f"{tokens},{qa.data.shape[1]},{qb.data.shape[0]}",
                     "torch TFLOP/s": flop / t_torch / 1e9, "torch ms": t_torch, "lt first ms": first[0],
                     "lt best ms": best[0], "lt best TFLOP/s": flop / best[0] / 1e9, "lt best": describe(best),
                     "candidates": len(cands)})
    return rows


def describe(c) -> str:
    return (f"id {c[1][0]} tile {c[1][1]} splitk {c[1][2]} {SCHEMES.get(c[1][3], c[1][3])} "
            f"swz {c[1][4]} stages {c[1][5]} cluster {c[1][6]} ws {c[2] >> 20}M")


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", default="8192,16384")
    p.add_argument("--models", default="1.5B,7B")
    p.add_argument("--max-heur", type=int, default=32)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--workspace-mib", type=int, default=64)
    p.add_argument("--fprop-dgrad", action="store_true", help="also search fprop and dgrad (1x128 x 128x128, bf16 out)")
    a = p.parse_args()
    so = build()
    ws_bytes = a.workspace_mib << 20
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    probe_args = (ws, ws_bytes, stream, a.max_heur, a.reps)
    rows, sums, fwd_rows = [], {}, []
    torch.manual_seed(0)
    for tokens in [int(t) for t in a.tokens.split(",")]:
        for model, proj, k, n in projections(a.models.split(",")):
            x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) * 1e-3
            _, qxt = quantize_pair(x, "token", "ue8m0", "e4m3", rows=False, cols=True)     # [K, tokens]
            _, qdyt = quantize_pair(dy, "token", "ue8m0", "e4m3", rows=False, cols=True)   # [N, tokens]
            sa, sb = outer_dim_major(qdyt.scale), outer_dim_major(qxt.scale)
            flop = 2.0 * tokens * k * n
            mm = lambda dt: scaled_mm_blockwise(qdyt.data, sa, qxt.data, sb, "token", dt)
            ref = mm(torch.float32)
            grad = torch.randn(n, k, device="cuda", dtype=torch.float32)
            t_mm = bench_ms(lambda: mm(torch.float32))
            t_add = bench_ms(lambda: grad.add_(mm(torch.float32)))
            t_bf16 = bench_ms(lambda: mm(torch.bfloat16))
            xt_block = quantize(x.t().contiguous(), "block", "ue8m0")
            t_2d = bench_ms(lambda: fp8_gemm(qdyt, xt_block, torch.float32))

            search = lambda d_fp32, beta, out: lt_search(so, qdyt.data, sa, qxt.data, sb, 0, out, d_fp32, beta, probe_args)
            acc = torch.zeros(n, k, device="cuda", dtype=torch.float32)
            c32 = search(1, 1.0, acc)
            c16 = search(0, 0.0, torch.empty(n, k, device="cuda", dtype=torch.bfloat16))
            first = next(c for c in c32 if c[1][7] == 0)
            best = min(c32, key=lambda c: c[0])
            best16 = min(c16, key=lambda c: c[0])
            first16 = next(c for c in c16 if c[1][7] == 0)

            # cuBLASLt's C0 + A B^T vs torch's product added to C0
            def check(cand):
                rank, splits, scheme = cand[1][7], cand[1][2], cand[1][3]
                rank = rank if rank >= 0 else -1 - rank
                out = grad.clone()
                st = so.lt_run(ctypes.c_void_p(qdyt.data.data_ptr()), ctypes.c_void_p(qxt.data.data_ptr()),
                               ctypes.c_void_p(sa.data_ptr()), ctypes.c_void_p(sb.data_ptr()),
                               ctypes.c_void_p(out.data_ptr()), n, k, tokens, 0, 1, ctypes.c_float(1.0),
                               ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes), stream, rank, splits, scheme)
                if st:
                    return None
                return out

            want = grad + ref
            got = check(best)
            err = "failed" if got is None else f"{((got - want).abs().max() / ref.abs().max()).item():.1e}"
            # every unsplit algorithm adds its K-blocks in the same order: are they all torch's bits?
            unsplit = [c for c in c32 if c[1][7] >= 0 and c[1][2] == 1]
            same = sum(1 for c in unsplit if (o := check(c)) is not None and torch.equal(o, want))

            tf = lambda ms: flop / ms / 1e9
            desc = describe
            row = {"model": model, "proj": proj, "wgrad N,K,tokens": f"{n},{k},{tokens}",
                   "torch fp32 TFLOP/s": tf(t_mm), "torch fp32 + add_ ms": t_add,
                   "lt beta=1 first ms": first[0], "lt beta=1 best ms": best[0],
                   "lt beta=1 best TFLOP/s": tf(best[0]), "lt beta=1 best": desc(best),
                   "beta=1 err": err, "unsplit == torch + C": f"{same}/{len(unsplit)}",
                   "candidates": len(c32),
                   "torch bf16 ms": t_bf16, "lt bf16 first ms": first16[0], "lt bf16 best ms": best16[0],
                   "lt bf16 best": desc(best16), "1x128 x 128x128 TFLOP/s": tf(t_2d)}
            rows.append(row)
            print(row, flush=True)
            if a.fprop_dgrad:
                fwd_rows += forward_rows(so, tokens, model, proj, k, n, probe_args)
            for key, v in (("torch fp32 + add_", t_add), ("lt beta=1 first", first[0]), ("lt beta=1 best", best[0]),
                           ("torch bf16", t_bf16), ("lt bf16 first", first16[0]), ("lt bf16 best", best16[0]),
                           ("torch fp32", t_mm), ("1x128 x 128x128 fp32", t_2d)):
                sums[key] = sums.get(key, 0.0) + v
            del x, dy, qxt, qdyt, ref, grad, acc, xt_block
    total = [{"wgrad path": key, "summed ms": v, "vs torch fp32 + add_": sums["torch fp32 + add_"] / v}
             for key, v in sums.items()]
    sections = [f"workspace {a.workspace_mib} MiB; heuristic results asked: {a.max_heur}; split-K variants 2-4 of each",
                markdown_table(rows), "#### summed over the shapes", markdown_table(total)]
    if fwd_rows:
        fsum = {g: [sum(r[c] for r in fwd_rows if r["gemm"] == g) for c in ("torch ms", "lt first ms", "lt best ms")]
                for g in ("fprop", "dgrad")}
        sections += ["#### fprop and dgrad (1x128 x 128x128, bf16 out)", markdown_table(fwd_rows),
                     markdown_table([{"gemm": g, "torch ms": v[0], "lt first ms": v[1], "lt best ms": v[2],
                                      "torch / lt best": v[0] / v[2]} for g, v in fsum.items()])]
    emit("wgrad GEMM: torch scaled_mm vs cuBLASLt's other algorithms, accumulating into FP32", sections, a.out)


if __name__ == "__main__":
    main()
