"""Triton quantizers with 1x128 scales along K (InfiR2's activations and gradients), in the two
layouts the FP8 GEMMs read; the CUDA C++ twin quant_both.cu is one more candidate of the autotune.

- `_quant_rows_kernel`: 1x128 scales along K (X in fprop, dY in dgrad).
- `_quant_cols_t_kernel`: 128x1 scales along M, written transposed (X^T and dY^T for wgrad, whose
  contraction runs over the tokens).
- `_quant_token_both_kernel`: both layouts in one launch, fused (one read of a 128x128 tile serves
  both; the transpose of the bf16 input or of the FP8 output goes through shared memory) or split
  (rows programs + transposing column programs, X read twice; grouped: the two kinds of programs
  interleaved per 128x128 region, so that the second read may come from L2). Where nvcc builds it,
  quant_both.cu (CUDA C++, closer to copy bandwidth than these) is one more candidate: it won at
  every shape of the 1.5B and 7B steps profiled on an H100.

Reference: quantize.quantize_token_ref (x along K; x^T along K for the transposed layout), bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..policy import kernel_policy
from ..quantize import TOKEN_BLOCK, QTensor
from .autotune import BOTH_CONFIGS, COLS_CONFIGS, ENTRIES, TRITON_BOTH, best, pick
from .cuda_lib import both_layouts_outputs, cuda_both_ok, cuda_fn
from .triton_fp8 import abs_nan_inf, check_device, consts, inv_scale, mask_t, q8, quot_ok, scale_from_amax


@triton.jit
def _quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm,
    BM: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    """1x128 along K: q [M, K]; scale (M, K/128) stored outer-dim-major (address m + kb * M),
    the layout scaled_mm reads, so no copy is needed before the GEMM. Programs walk K fastest."""
    pid = tl.program_id(0)
    n_kb = tl.cdiv(K, 128)
    _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid // n_kb, pid % n_kb, BM, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid_m, pid_k,
               BM: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
               DIV: tl.constexpr):
    """A [BM, 128] tile of X along K: q rows and their 1x128 scales."""
    rm = pid_m * BM + tl.arange(0, BM)
    rk = pid_k * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    s = scale_from_amax(tl.max(abs_nan_inf(x), axis=1), FMAX, UE8M0)
    q = q8(x, s[:, None], inv_scale(s, UE8M0)[:, None], quot_ok(s, DIV), FMAX, OUT_DTYPE, DIV)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
    tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)


@triton.jit
def _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, pid_m, pid_k,
                 BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                 DIV: tl.constexpr):
    """128x1 along M, written transposed: q^T [K, M]; scale (K, M/128) outer-dim-major
    (address k + mb * K). A [128, BN] tile is read along K and stored along M."""
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = pid_k * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    st = scale_from_amax(tl.max(abs_nan_inf(x), axis=0), FMAX, UE8M0)
    qt = tl.trans(q8(x, st[None, :], inv_scale(st, UE8M0)[None, :], quot_ok(st, DIV), FMAX, OUT_DTYPE, DIV))
    tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=mask_t(rm, rk, M, K))
    tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)


@triton.jit
def _quant_cols_t_kernel(x_ptr, qt_ptr, st_ptr, M, K, stride_xm,
                         BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                         DIV: tl.constexpr):
    pid = tl.program_id(0)
    n_kt = tl.cdiv(K, BN)
    _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, pid // n_kt, pid % n_kt, BN, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _quant_token_both_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, stride_xm,
    FUSED: tl.constexpr, TRANS_IN: tl.constexpr, GROUPED: tl.constexpr, BN: tl.constexpr, BM_ROWS: tl.constexpr,
    FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr,
):
    """X along K *and* X^T along M in one launch. FUSED: one read of a 128x128 tile serves both
    (the transpose of the bf16 input (TRANS_IN) or of the FP8 output goes through shared memory);
    else the grid's first programs do rows and the rest do the transposing columns, reading X
    twice, or (GROUPED) both kinds interleaved region by region. All configurations give the same
    bits."""
    pid = tl.program_id(0)
    n_kb = tl.cdiv(K, 128)
    if FUSED:
        pid_m = pid // n_kb
        pid_k = pid % n_kb
        rm = pid_m * 128 + tl.arange(0, 128)
        rk = pid_k * 128 + tl.arange(0, 128)
        mask = (rm[:, None] < M) & (rk[None, :] < K)
        xb = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mask, other=0.0)
        x = xb.to(tl.float32)
        s = scale_from_amax(tl.max(abs_nan_inf(x), axis=1), FMAX, UE8M0)
        q = q8(x, s[:, None], inv_scale(s, UE8M0)[:, None], quot_ok(s, DIV), FMAX, OUT_DTYPE, DIV)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], q, mask=mask)
        tl.store(s_ptr + pid_k.to(tl.int64) * M + rm, s, mask=rm < M)
        if TRANS_IN:
            xt = tl.trans(xb).to(tl.float32)  # [128 (K), 128 (M)]
            st = scale_from_amax(tl.max(abs_nan_inf(xt), axis=1), FMAX, UE8M0)
            qt = q8(xt, st[:, None], inv_scale(st, UE8M0)[:, None], quot_ok(st, DIV), FMAX, OUT_DTYPE, DIV)
        else:
            st = scale_from_amax(tl.max(abs_nan_inf(x), axis=0), FMAX, UE8M0)
            qt = tl.trans(q8(x, st[None, :], inv_scale(st, UE8M0)[None, :], quot_ok(st, DIV), FMAX, OUT_DTYPE, DIV))
        tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=mask_t(rm, rk, M, K))
        tl.store(st_ptr + pid_m.to(tl.int64) * K + rk, st, mask=rk < K)
    elif GROUPED:
        # Split, but the row and column programs of each 128x128 region of X run next to each
        # other, so that X's second read can come from L2 rather than HBM.
        rows_per = 128 // BM_ROWS
        per = rows_per + 128 // BN
        region = pid // per
        j = pid % per
        if j < rows_per:
            _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, (region // n_kb) * rows_per + j, region % n_kb,
                       BM_ROWS, FMAX, UE8M0, OUT_DTYPE, DIV)
        else:
            _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, region // n_kb,
                         (region % n_kb) * (128 // BN) + j - rows_per, BN, FMAX, UE8M0, OUT_DTYPE, DIV)
    else:
        n_row_progs = tl.cdiv(M, BM_ROWS) * n_kb
        if pid < n_row_progs:
            _rows_tile(x_ptr, q_ptr, s_ptr, M, K, stride_xm, pid // n_kb, pid % n_kb,
                       BM_ROWS, FMAX, UE8M0, OUT_DTYPE, DIV)
        else:
            c = pid - n_row_progs
            n_kt = tl.cdiv(K, BN)
            _cols_t_tile(x_ptr, qt_ptr, st_ptr, M, K, stride_xm, c // n_kt, c % n_kt, BN, FMAX, UE8M0, OUT_DTYPE, DIV)


# ----------------------------------------------------------------------------- host wrappers


def cuda_both_runner(x2, scale_format, fmt, loads):
    """run(x) -> (q, q^T) of quant_both.cu for inputs shaped as x2; loads: rows loaded ahead per thread."""
    fn = cuda_fn("infir_quant_token_both", x2.device)
    M, K = x2.shape
    ld, idx = x2.stride(0), x2.device.index
    ue, e5 = int(scale_format == "ue8m0"), int(fmt == "e5m2")
    stream = torch._C._cuda_getCurrentRawStream

    def run(x):
        q, s, qt, st = both_layouts_outputs(M, K, fmt, x.device)
        err = fn(x.data_ptr(), ld, q.data_ptr(), s.data_ptr(), qt.data_ptr(), st.data_ptr(), M, K, ue, e5, loads,
                 stream(idx))
        if err:
            raise RuntimeError(f"quant_both.cu launch failed with cudaError {err} at x {tuple(x.shape)}")
        return (QTensor(q, s, "token", scale_format, fmt), QTensor(qt, st, "token", scale_format, fmt))
    return run


def _tuned_runner(x2, scale_format, fmt, rows, cols, block_m):
    """token_runner of the fastest candidate configuration for x2 (autotune.best)."""
    if rows and cols:
        first = pick("both", None)
        cands = [first] + [dict(c) for c in BOTH_CONFIGS if c != first and (not c.get("CUDA") or cuda_both_ok(x2))]
    elif cols:
        first = pick("cols", None)
        cands = [first] + [dict(c) for c in COLS_CONFIGS if c != first]
    elif rows:
        first = pick("rows", None)
        cands = [first] + [{"num_warps": w} for w in (2, 4, 8) if w != first["num_warps"]]
    else:
        return token_runner(x2, scale_format, fmt, rows, cols, block_m, None)
    return best(lambda c: token_runner(x2, scale_format, fmt, rows, cols, block_m, c), cands, x2)


def token_runner(x2, scale_format, fmt, rows, cols, block_m, config):
    """run(x) -> (q or None, q^T or None) for inputs shaped as x2, in one configuration (None: the
    default) of the kernel that writes the layouts asked for."""
    if rows and cols:
        cfg = pick("both", config)
        if cfg.get("CUDA"):
            if cuda_both_ok(x2):
                return cuda_both_runner(x2, scale_format, fmt, cfg["LOADS"])
            cfg = dict(TRITON_BOTH)
        return _both_runner(x2, scale_format, fmt, cfg)
    if rows:
        return _rows_runner(x2, scale_format, fmt, block_m, pick("rows", config))
    if cols:
        return _cols_runner(x2, scale_format, fmt, pick("cols", config))
    return lambda x: (None, None)


def _outputs(M, K, dt, dev, soft):
    """Empty (q [M, K], its 1x128 scales outer-dim-major, the pointer the kernel writes q through)."""
    q = torch.empty((M, K), dtype=dt, device=dev)
    s = torch.empty_strided((M, triton.cdiv(K, TOKEN_BLOCK)), (1, M), dtype=torch.float32, device=dev)
    return q, s, (q.view(torch.uint8) if soft else q)


def _both_runner(x2, scale_format, fmt, cfg):
    (fmax, ue, out, div), dt = consts(fmt, scale_format)
    soft = kernel_policy().interpret
    M, K = x2.shape
    dev = x2.device
    n_kb, n_mb = triton.cdiv(K, TOKEN_BLOCK), triton.cdiv(M, TOKEN_BLOCK)
    nw = cfg.pop("num_warps", 4)
    fused, trans_in, grouped, bn, bm_rows = cfg["FUSED"], cfg["TRANS_IN"], cfg["GROUPED"], cfg["BN"], cfg["BM_ROWS"]
    if fused:
        n = n_mb * n_kb
    elif grouped:  # per 128x128 region: its row programs, then its column programs
        n = n_mb * n_kb * (TOKEN_BLOCK // bm_rows + TOKEN_BLOCK // bn)
    else:
        n = triton.cdiv(M, bm_rows) * n_kb + n_mb * triton.cdiv(K, bn)
    launch = Launch(_quant_token_both_kernel, grid1d(n), nw)
    tail = (M, K, x2.stride(0), fused, trans_in, grouped, bn, bm_rows, fmax, ue, out, div)

    def run(x):
        q, s, qv = _outputs(M, K, dt, dev, soft)
        qt, st, qtv = _outputs(K, M, dt, dev, soft)
        launch(dev.index, x, qv, s, qtv, st, *tail)
        return (QTensor(q, s, "token", scale_format, fmt), QTensor(qt, st, "token", scale_format, fmt))
    return run


def _rows_runner(x2, scale_format, fmt, block_m, cfg):
    (fmax, ue, out, div), dt = consts(fmt, scale_format)
    soft = kernel_policy().interpret
    M, K = x2.shape
    dev = x2.device
    launch = Launch(_quant_rows_kernel, grid1d(triton.cdiv(M, block_m) * triton.cdiv(K, TOKEN_BLOCK)), cfg["num_warps"])
    tail = (M, K, x2.stride(0), block_m, fmax, ue, out, div)

    def run(x):
        q, s, qv = _outputs(M, K, dt, dev, soft)
        launch(dev.index, x, qv, s, *tail)
        return QTensor(q, s, "token", scale_format, fmt), None
    return run


def _cols_runner(x2, scale_format, fmt, cfg):
    (fmax, ue, out, div), dt = consts(fmt, scale_format)
    soft = kernel_policy().interpret
    M, K = x2.shape
    dev = x2.device
    bn = cfg["BN"]
    launch = Launch(_quant_cols_t_kernel, grid1d(triton.cdiv(M, TOKEN_BLOCK) * triton.cdiv(K, bn)),
                    cfg.get("num_warps", 4))
    tail = (M, K, x2.stride(0), bn, fmax, ue, out, div)

    def run(x):
        qt, st, qtv = _outputs(K, M, dt, dev, soft)
        launch(dev.index, x, qtv, st, *tail)
        return None, QTensor(qt, st, "token", scale_format, fmt)
    return run


def quantize_token_triton(x2, scale_format="ue8m0", fmt="e4m3", rows=True, cols=False, block_m=32, config=None):
    """1x128 along K (rows) and/or 128x1 along M written transposed (cols). Returns (q, q_t).

    Scales come back as outer-dim-major views, the layout torch's blockwise scaled_mm takes.
    config: force one configuration of the both-layouts or cols kernel (tests); default: the one
    picked for the device (autotune). After the first call for a shape, a call costs one
    dict lookup, the output allocations and a direct launch.
    """
    if config is None:
        key = ("token", x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr() & 15 == 0,
               scale_format, fmt, rows, cols, block_m)
        run = ENTRIES.get(key)
        if run is None:
            check_device(x2)
            run = ENTRIES[key] = _tuned_runner(x2, scale_format, fmt, rows, cols, block_m)
        return run(x2)
    check_device(x2)
    return token_runner(x2, scale_format, fmt, rows, cols, block_m, config)(x2)
