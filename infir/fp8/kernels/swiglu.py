"""Triton kernels of infir.fp8.swiglu: SwiGLU forward that also writes its input in FP8, and the
backward from that FP8 copy. Twins of swiglu.swiglu / quantize_token_ref / swiglu.swiglu_backward.

Why not inductor: the reference written in torch ops, compiled inside the layer, made the backward
kernel twice as slow as BF16 SwiGLU's (H100, 1.5B: 10.4% of the FP8 step against 4.9%) and the
forward quantization two extra passes over h. Here the forward reads h once and writes y, the FP8
bytes and the 1x128 scales; the backward reads the FP8 bytes, scales and dY once and writes dh.

Programs: one per (BM rows, one 128-column block j of `gate`), handling that block of `gate` and
the same block of `up` (columns F + j*128...), so the ffn size F must be a multiple of 128 (every
Qwen2.5 size is, also per TP rank); other shapes, and CPU tensors outside the interpreter, take
the reference path (swiglu.py decides). The FP8 data and scale bits equal quantize_token_ref's (the
row quantizer's helpers); y and dh agree with the references to rounding (exp differs in ulps).

The fused pair (swiglu_quant_fwd / swiglu_quant_bwd, for infir.fp8.mlp) does the same arithmetic and
writes, instead of y and dh, their FP8 GEMM operands in both layouts (see the section below).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..quantize import TOKEN_BLOCK
from . import quant as qk

_TL_OUT = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _tile(M, F, BM: tl.constexpr):
    """This program's BM rows, its 128 columns of `gate` (the same columns + F of `up`), the column
    block's index and the number of column blocks."""
    n_fb = F // 128
    pid = tl.program_id(0)
    rm = (pid // n_fb) * BM + tl.arange(0, BM)
    rk = (pid % n_fb) * 128 + tl.arange(0, 128)
    return rm, rk, pid % n_fb, n_fb


@triton.jit
def _y_tile(h_ptr, rm, rk, M, F, Y_DTYPE: tl.constexpr):
    """gate, up and y = silu(gate) * up (rounded as torch rounds them in Y_DTYPE) at rows rm, columns rk."""
    mask = (rm[:, None] < M) & (rk[None, :] < F)
    row = rm[:, None].to(tl.int64) * (2 * F)
    g = tl.load(h_ptr + row + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row + F + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(Y_DTYPE).to(tl.float32)
    return g, u, (silu * u).to(Y_DTYPE).to(tl.float32), mask, row


@triton.jit
def _quant_store(x, q_ptr, s_ptr, rm, M, mask, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                 DIV: tl.constexpr):
    """x [BM, 128] as FP8 with one scale per row (the 1x128 rows quantizer's arithmetic); s_ptr holds
    each row's scale address (any layout)."""
    s = qk._scale_from_amax(tl.max(qk._abs_nan_inf(x), axis=1), FMAX, UE8M0)
    tl.store(q_ptr, qk._q8(x, s[:, None], qk._inv_scale(s, UE8M0)[:, None], qk._ok1(s, DIV), FMAX, OUT_DTYPE, DIV),
             mask=mask)
    tl.store(s_ptr, s, mask=rm < M)


@triton.jit
def _swiglu_fp8_fwd_kernel(h_ptr, y_ptr, q_ptr, s_ptr, M, F, BM: tl.constexpr, FMAX: tl.constexpr,
                           UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr, Y_DTYPE: tl.constexpr):
    rm, rk, j, n_fb = _tile(M, F, BM)
    g, u, y, mask, row = _y_tile(h_ptr, rm, rk, M, F, Y_DTYPE)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * F + rk[None, :], y.to(Y_DTYPE), mask=mask)
    srow = rm.to(tl.int64) * (2 * n_fb)
    _quant_store(g, q_ptr + row + rk[None, :], s_ptr + srow + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)
    _quant_store(u, q_ptr + row + F + rk[None, :], s_ptr + srow + n_fb + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _load_fp8(ptr, mask, SOFT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    if SOFT:  # interpreter: the bytes through a uint8 view, decoded in integers
        v = qk._fp8_bits_to_f32(tl.load(ptr, mask=mask, other=0), MBITS, BIAS)
    else:
        v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def _dh_tile(hq_ptr, hs_ptr, dy_ptr, rm, rk, M, F, j, n_fb, SOFT: tl.constexpr, MBITS: tl.constexpr,
             BIAS: tl.constexpr, H_DTYPE: tl.constexpr):
    """dgate, dup (rounded to H_DTYPE) at rows rm, columns rk, from h's FP8 copy and dy."""
    mask = (rm[:, None] < M) & (rk[None, :] < F)
    row = rm[:, None].to(tl.int64) * (2 * F)
    srow = rm.to(tl.int64) * (2 * n_fb)
    sg = tl.load(hs_ptr + srow + j, mask=rm < M, other=1.0)
    su = tl.load(hs_ptr + srow + n_fb + j, mask=rm < M, other=1.0)
    g = _load_fp8(hq_ptr + row + rk[None, :], mask, SOFT, MBITS, BIAS) * sg[:, None]
    u = _load_fp8(hq_ptr + row + F + rk[None, :], mask, SOFT, MBITS, BIAS) * su[:, None]
    dy = tl.load(dy_ptr + rm[:, None].to(tl.int64) * F + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    dg = (dy * u * sig * (1.0 + g * (1.0 - sig))).to(H_DTYPE).to(tl.float32)
    du = (dy * (g * sig)).to(H_DTYPE).to(tl.float32)
    return dg, du, mask, row


@triton.jit
def _swiglu_fp8_bwd_kernel(q_ptr, s_ptr, dy_ptr, dh_ptr, M, F, BM: tl.constexpr, SOFT: tl.constexpr,
                           MBITS: tl.constexpr, BIAS: tl.constexpr, H_DTYPE: tl.constexpr):
    rm, rk, j, n_fb = _tile(M, F, BM)
    dg, du, mask, row = _dh_tile(q_ptr, s_ptr, dy_ptr, rm, rk, M, F, j, n_fb, SOFT, MBITS, BIAS, H_DTYPE)
    tl.store(dh_ptr + row + rk[None, :], dg.to(H_DTYPE), mask=mask)
    tl.store(dh_ptr + row + F + rk[None, :], du.to(H_DTYPE), mask=mask)


# ---------------------------------------------------------------- SwiGLU fused with FC2's / FC1's quantizers
#
# The MLP of a token-granular FP8 recipe (infir.fp8.mlp) quantizes swiglu(h) for FC2 (1x128 along F for
# fprop, 128x1 along the tokens, transposed, for wgrad) and dh for FC1's dgrad and wgrad likewise.
# Unfused, y and dh are written in BF16 and read back (twice: the both-layouts quantizer's rows and
# columns programs). These kernels write the FP8 operands instead, and compute y or dh twice: in row
# programs ([BM_ROWS, 128] tiles: the 1x128 scales, h's FP8 copy in the forward) and in column programs
# ([128, BN] tiles: the 128x1 scales, stored transposed). The two kinds of programs of one 128x128
# region are adjacent in the grid, so that the region's second read of h (or of h's copy and dy) comes
# from L2. One program per 128x128 region doing both in two passes over its rows measured slower
# on an H100 (32-46% of copy bandwidth; bench/quant.py --swiglu).
# y and dh are rounded to the activation dtype before they are quantized, as the unfused path
# rounds them, so the FP8 bytes equal the unfused path's bit for bit.


@triton.jit
def _region(M, F, BM_ROWS: tl.constexpr, BN: tl.constexpr):
    """This program's place in the grouped grid: (128-token block, 128-column block j of `gate`,
    is a row program, its sub-tile index)."""
    n_fb = F // 128
    per = 128 // BM_ROWS + 128 // BN
    pid = tl.program_id(0)
    region, i = pid // per, pid % per
    rows = i < 128 // BM_ROWS
    return region // n_fb, region % n_fb, rows, tl.where(rows, i, i - 128 // BM_ROWS), n_fb


@triton.jit
def _cols_t_store(x, qt_ptr, st_ptr, rm, rk, M, K, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                  DIV: tl.constexpr):
    """x [128, BN] quantized along its 128 rows (one scale per column), stored transposed into qt [K, M];
    the scales go to st_ptr + rk (this token block's scale row)."""
    st = qk._scale_from_amax(tl.max(qk._abs_nan_inf(x), axis=0), FMAX, UE8M0)
    qt = tl.trans(qk._q8(x, st[None, :], qk._inv_scale(st, UE8M0)[None, :], qk._ok1(st, DIV), FMAX, OUT_DTYPE, DIV))
    tl.store(qt_ptr + rk[:, None].to(tl.int64) * M + rm[None, :], qt, mask=qk._mask_t(rm, rk, M, K))
    tl.store(st_ptr + rk, st, mask=rk < K)


@triton.jit
def _fwd_rows(h_ptr, hq_ptr, hs_ptr, q_ptr, s_ptr, M, F, pid_m, j, i, n_fb, BM_ROWS: tl.constexpr, FMAX: tl.constexpr,
              UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr, Y_DTYPE: tl.constexpr):
    rm = pid_m * 128 + i * BM_ROWS + tl.arange(0, BM_ROWS)
    rk = j * 128 + tl.arange(0, 128)
    g, u, y, mask, row = _y_tile(h_ptr, rm, rk, M, F, Y_DTYPE)
    srow = rm.to(tl.int64) * (2 * n_fb)
    _quant_store(g, hq_ptr + row + rk[None, :], hs_ptr + srow + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)
    _quant_store(u, hq_ptr + row + F + rk[None, :], hs_ptr + srow + n_fb + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)
    _quant_store(y, q_ptr + rm[:, None].to(tl.int64) * F + rk[None, :], s_ptr + j.to(tl.int64) * M + rm, rm, M,
                 mask, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _fwd_cols(h_ptr, qt_ptr, st_ptr, M, F, pid_m, j, i, BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr,
              OUT_DTYPE: tl.constexpr, DIV: tl.constexpr, Y_DTYPE: tl.constexpr):
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = j * 128 + i * BN + tl.arange(0, BN)
    g, u, y, mask, row = _y_tile(h_ptr, rm, rk, M, F, Y_DTYPE)
    _cols_t_store(y, qt_ptr, st_ptr + pid_m.to(tl.int64) * F, rm, rk, M, F, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _swiglu_quant_fwd_kernel(h_ptr, hq_ptr, hs_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, BM_ROWS: tl.constexpr,
                             BN: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                             DIV: tl.constexpr, Y_DTYPE: tl.constexpr):
    """h [M, 2F] -> h's FP8 copy (rows, scales row-major [M, 2F/128]); y = swiglu(h) as q [M, F]
    (scales outer-dim-major (M, F/128)) and qt [F, M] (scales outer-dim-major (F, M/128))."""
    pid_m, j, rows, i, n_fb = _region(M, F, BM_ROWS, BN)
    if rows:
        _fwd_rows(h_ptr, hq_ptr, hs_ptr, q_ptr, s_ptr, M, F, pid_m, j, i, n_fb, BM_ROWS, FMAX, UE8M0, OUT_DTYPE, DIV,
                  Y_DTYPE)
    else:
        _fwd_cols(h_ptr, qt_ptr, st_ptr, M, F, pid_m, j, i, BN, FMAX, UE8M0, OUT_DTYPE, DIV, Y_DTYPE)


@triton.jit
def _bwd_rows(hq_ptr, hs_ptr, dy_ptr, q_ptr, s_ptr, M, F, pid_m, j, i, n_fb, BM_ROWS: tl.constexpr, SOFT: tl.constexpr,
              MBITS: tl.constexpr, BIAS: tl.constexpr, H_DTYPE: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr,
              OUT_DTYPE: tl.constexpr, DIV: tl.constexpr):
    rm = pid_m * 128 + i * BM_ROWS + tl.arange(0, BM_ROWS)
    rk = j * 128 + tl.arange(0, 128)
    dg, du, mask, row = _dh_tile(hq_ptr, hs_ptr, dy_ptr, rm, rk, M, F, j, n_fb, SOFT, MBITS, BIAS, H_DTYPE)
    _quant_store(dg, q_ptr + row + rk[None, :], s_ptr + j.to(tl.int64) * M + rm, rm, M, mask, FMAX, UE8M0,
                 OUT_DTYPE, DIV)
    _quant_store(du, q_ptr + row + F + rk[None, :], s_ptr + (n_fb + j).to(tl.int64) * M + rm, rm, M, mask, FMAX,
                 UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _bwd_cols(hq_ptr, hs_ptr, dy_ptr, qt_ptr, st_ptr, M, F, pid_m, j, i, n_fb, BN: tl.constexpr, SOFT: tl.constexpr,
              MBITS: tl.constexpr, BIAS: tl.constexpr, H_DTYPE: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr,
              OUT_DTYPE: tl.constexpr, DIV: tl.constexpr):
    rm = pid_m * 128 + tl.arange(0, 128)
    rk = j * 128 + i * BN + tl.arange(0, BN)
    dg, du, mask, row = _dh_tile(hq_ptr, hs_ptr, dy_ptr, rm, rk, M, F, j, n_fb, SOFT, MBITS, BIAS, H_DTYPE)
    st_row = st_ptr + pid_m.to(tl.int64) * (2 * F)
    _cols_t_store(dg, qt_ptr, st_row, rm, rk, M, 2 * F, FMAX, UE8M0, OUT_DTYPE, DIV)
    _cols_t_store(du, qt_ptr, st_row, rm, rk + F, M, 2 * F, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _swiglu_quant_bwd_kernel(hq_ptr, hs_ptr, dy_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, BM_ROWS: tl.constexpr,
                             BN: tl.constexpr, SOFT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                             H_DTYPE: tl.constexpr, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                             DIV: tl.constexpr):
    """dh = swiglu's gradient at h's FP8 copy, rounded to H_DTYPE, as q [M, 2F] (scales outer-dim-major
    (M, 2F/128)) and qt [2F, M] (scales outer-dim-major (2F, M/128))."""
    pid_m, j, rows, i, n_fb = _region(M, F, BM_ROWS, BN)
    if rows:
        _bwd_rows(hq_ptr, hs_ptr, dy_ptr, q_ptr, s_ptr, M, F, pid_m, j, i, n_fb, BM_ROWS, SOFT, MBITS, BIAS, H_DTYPE,
                  FMAX, UE8M0, OUT_DTYPE, DIV)
    else:
        _bwd_cols(hq_ptr, hs_ptr, dy_ptr, qt_ptr, st_ptr, M, F, pid_m, j, i, n_fb, BN, SOFT, MBITS, BIAS, H_DTYPE,
                  FMAX, UE8M0, OUT_DTYPE, DIV)


_ENTRIES: dict = {}
_BM = 16


def supported_shape(width: int, dtype: torch.dtype, device: torch.device) -> bool:
    """The kernels take [M, width] tensors of `dtype` (h or dh) on `device` (else the reference path runs)."""
    ok_device = device.type == "cuda" or qk.SOFT_CAST
    return ok_device and width % (2 * TOKEN_BLOCK) == 0 and dtype in _TL_OUT


def supported(h2: torch.Tensor) -> bool:
    return h2.dim() == 2 and supported_shape(h2.shape[1], h2.dtype, h2.device)


def swiglu_fp8_fwd(h2: torch.Tensor, scale_format: str, fmt: str):
    """y [M, F] = swiglu(h2), and h2 [M, 2F] as FP8 data [M, 2F] with scales [M, 2F/128] (row-major)."""
    h2 = h2.contiguous()
    M, K = h2.shape
    key = ("fwd", M, K, h2.dtype, h2.device, scale_format, fmt, qk.SOFT_CAST, qk.DIV_OVERRIDE)
    entry = _ENTRIES.get(key)
    if entry is None:
        (fmax, ue, out, div), dt = qk._consts(fmt, scale_format)
        launch = Launch(_swiglu_fp8_fwd_kernel, grid1d(triton.cdiv(M, _BM) * (K // 2 // 128)), 4)
        entry = _ENTRIES[key] = (launch, dt, (M, K // 2, _BM, fmax, ue, out, div, _TL_OUT[h2.dtype]))
    launch, dt, tail = entry
    y = torch.empty((M, K // 2), dtype=h2.dtype, device=h2.device)
    q = torch.empty((M, K), dtype=dt, device=h2.device)
    s = torch.empty((M, K // TOKEN_BLOCK), dtype=torch.float32, device=h2.device)
    launch(h2.device.index, h2, y, qk._v(q), s, *tail)
    return y, q, s


def swiglu_fp8_bwd(q: torch.Tensor, s: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """dh [M, 2F] in out_dtype, from the FP8 copy of h (swiglu_fp8_fwd) and dy2 [M, F]."""
    dy2 = dy2.contiguous()
    M, K = q.shape
    key = ("bwd", M, K, q.dtype, dy2.dtype, out_dtype, q.device, qk.SOFT_CAST)
    entry = _ENTRIES.get(key)
    if entry is None:
        mbits, bias = (3, 7) if q.dtype == torch.float8_e4m3fn else (2, 15)
        launch = Launch(_swiglu_fp8_bwd_kernel, grid1d(triton.cdiv(M, _BM) * (K // 2 // 128)), 4)
        entry = _ENTRIES[key] = (launch, (M, K // 2, _BM, qk.SOFT_CAST, mbits, bias, _TL_OUT[out_dtype]))
    launch, tail = entry
    dh = torch.empty((M, K), dtype=out_dtype, device=q.device)
    launch(q.device.index, qk._v(q), s, dy2, dh, *tail)
    return dh


# Defaults from bench/quant.py --swiglu (H100, 8192 tokens, ffn 4864-9472); `config` picks another.
FUSED_CONFIGS = [{"BM_ROWS": bm, "BN": bn, "num_warps": w} for bm in (16, 32) for bn in (32, 64) for w in (4, 8)]
_FUSED_DEFAULT = {"BM_ROWS": 32, "BN": 64, "num_warps": 4}


def _fused_outputs(M, K, dt, device):
    """FP8 [M, K] with outer-dim-major 1x128 scales, and its transpose [K, M] with 128x1 scales."""
    f32 = torch.float32
    q = torch.empty((M, K), dtype=dt, device=device)
    s = torch.empty_strided((M, K // TOKEN_BLOCK), (1, M), dtype=f32, device=device)
    n_mb = triton.cdiv(M, TOKEN_BLOCK)
    qt = torch.empty((K, M), dtype=dt, device=device)
    st = torch.empty_strided((K, n_mb), (1, K), dtype=f32, device=device)
    return q, s, qt, st


def _fused_launch(kernel, M, F, cfg):
    per = 128 // cfg["BM_ROWS"] + 128 // cfg["BN"]
    return Launch(kernel, grid1d(triton.cdiv(M, 128) * (F // 128) * per), cfg["num_warps"])


def swiglu_quant_fwd(h2: torch.Tensor, scale_format: str, fmt: str, config: dict | None = None):
    """h2 [M, 2F] -> (hq, hs): h2's FP8 copy for the backward (swiglu_fp8_fwd's), and (q, s, qt, st):
    y = swiglu(h2) quantized 1x128 along F and, transposed, 128x1 along M (quantize_token_triton's
    layouts). y itself is not written."""
    h2 = h2.contiguous()
    M, K = h2.shape
    cfg = config or _FUSED_DEFAULT
    key = ("qfwd", M, K, h2.dtype, h2.device, scale_format, fmt, tuple(cfg.values()), qk.SOFT_CAST, qk.DIV_OVERRIDE)
    entry = _ENTRIES.get(key)
    if entry is None:
        (fmax, ue, out, div), dt = qk._consts(fmt, scale_format)
        entry = _ENTRIES[key] = (_fused_launch(_swiglu_quant_fwd_kernel, M, K // 2, cfg), dt,
                                 (M, K // 2, cfg["BM_ROWS"], cfg["BN"], fmax, ue, out, div, _TL_OUT[h2.dtype]))
    launch, dt, tail = entry
    hq = torch.empty((M, K), dtype=dt, device=h2.device)
    hs = torch.empty((M, K // TOKEN_BLOCK), dtype=torch.float32, device=h2.device)
    q, s, qt, st = _fused_outputs(M, K // 2, dt, h2.device)
    launch(h2.device.index, h2, qk._v(hq), hs, qk._v(q), s, qk._v(qt), st, *tail)
    return (hq, hs), (q, s, qt, st)


def swiglu_quant_bwd(hq: torch.Tensor, hs: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype, scale_format: str,
                     fmt: str, config: dict | None = None):
    """dh [M, 2F] (swiglu_fp8_bwd's, in out_dtype) quantized 1x128 along 2F and, transposed, 128x1
    along M: (q, s, qt, st) in quantize_token_triton's layouts. dh itself is not written."""
    dy2 = dy2.contiguous()
    M, K = hq.shape
    cfg = config or _FUSED_DEFAULT
    key = ("qbwd", M, K, hq.dtype, dy2.dtype, out_dtype, hq.device, scale_format, fmt, tuple(cfg.values()),
           qk.SOFT_CAST, qk.DIV_OVERRIDE)
    entry = _ENTRIES.get(key)
    if entry is None:
        (fmax, ue, out, div), dt = qk._consts(fmt, scale_format)
        mbits, bias = (3, 7) if hq.dtype == torch.float8_e4m3fn else (2, 15)
        entry = _ENTRIES[key] = (_fused_launch(_swiglu_quant_bwd_kernel, M, K // 2, cfg), dt,
                                 (M, K // 2, cfg["BM_ROWS"], cfg["BN"], qk.SOFT_CAST, mbits, bias, _TL_OUT[out_dtype],
                                  fmax, ue, out, div))
    launch, dt, tail = entry
    q, s, qt, st = _fused_outputs(M, K, dt, hq.device)
    launch(hq.device.index, qk._v(hq), hs, dy2, qk._v(q), s, qk._v(qt), st, *tail)
    return q, s, qt, st
