"""Triton kernels of infir.fp8.swiglu: SwiGLU forward that also writes its input in FP8, and the
backward from that FP8 copy; and both fused with the token quantizer of FC2's input and FC1's
gradient (quant_both.cu). References: swiglu_reference.py (swiglu_fp8_forward_reference,
swiglu_fp8_backward_reference) and quantize.quantize_token_ref.

Why not inductor: the reference written in torch ops, compiled inside the layer, made the backward
kernel twice as slow as BF16 SwiGLU's (an H100 profile of the 1.5B step) and the
forward quantization two extra passes over h. Here the forward reads h once and writes y, the FP8
bytes and the 1x128 scales; the backward reads the FP8 bytes, scales and dY once and writes dh.

Programs: one per (BM rows, one 128-column block j of `gate`), handling that block of `gate` and
the same block of `up` (columns F + j*128...), so the ffn size F must be a multiple of 128 (every
Qwen2.5 size is, also per TP rank); other shapes, and CPU tensors outside the interpreter, take
the reference path (infir.fp8.swiglu decides). The FP8 data and scale bits equal quantize_token_ref's (the
row quantizer's helpers); y and dh agree with the references to rounding (exp differs in ulps).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..formats import get_format
from ..policy import kernel_policy
from ..quantize import TOKEN_BLOCK
from . import cuda_build
from .cuda_lib import both_layouts_outputs, cuda_fn
from .quant_token import quantize_token_triton
from .triton_fp8 import abs_nan_inf, consts, fp8_bits_to_f32, fp8_view, inv_scale, q8, quot_ok, scale_from_amax

_TL_OUT = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _tile(M, F, BM: tl.constexpr):
    """This program's rows, its 128 columns of `gate` (the same columns + F of `up`), their bounds
    mask and the rows' offsets into a [M, 2F] tensor."""
    n_fb = F // 128
    pid = tl.program_id(0)
    rm = (pid // n_fb) * BM + tl.arange(0, BM)
    rk = (pid % n_fb) * 128 + tl.arange(0, 128)
    mask = (rm[:, None] < M) & (rk[None, :] < F)
    return rm, rk, mask, rm[:, None].to(tl.int64) * (2 * F), pid % n_fb, n_fb


@triton.jit
def _quant_store(x, q_ptr, s_ptr, rm, M, mask, FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr,
                 DIV: tl.constexpr):
    """x [BM, 128] as FP8 with one scale per row (the 1x128 rows quantizer's arithmetic)."""
    s = scale_from_amax(tl.max(abs_nan_inf(x), axis=1), FMAX, UE8M0)
    tl.store(q_ptr, q8(x, s[:, None], inv_scale(s, UE8M0)[:, None], quot_ok(s, DIV), FMAX, OUT_DTYPE, DIV), mask=mask)
    tl.store(s_ptr, s, mask=rm < M)


@triton.jit
def _swiglu_fp8_fwd_kernel(h_ptr, y_ptr, q_ptr, s_ptr, M, F, BM: tl.constexpr, FMAX: tl.constexpr,
                           UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr, Y_DTYPE: tl.constexpr):
    rm, rk, mask, row, j, n_fb = _tile(M, F, BM)
    g = tl.load(h_ptr + row + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row + F + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    # as torch in the activation dtype: silu rounded to it, then the product rounded
    silu = (g / (1.0 + tl.exp(-g))).to(Y_DTYPE).to(tl.float32)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * F + rk[None, :], (silu * u).to(Y_DTYPE), mask=mask)
    srow = rm.to(tl.int64) * (2 * n_fb)
    _quant_store(g, q_ptr + row + rk[None, :], s_ptr + srow + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)
    _quant_store(u, q_ptr + row + F + rk[None, :], s_ptr + srow + n_fb + j, rm, M, mask, FMAX, UE8M0, OUT_DTYPE, DIV)


@triton.jit
def _load_fp8(ptr, mask, SOFT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    if SOFT:  # interpreter: the bytes through a uint8 view, decoded in integers
        v = fp8_bits_to_f32(tl.load(ptr, mask=mask, other=0), MBITS, BIAS)
    else:
        v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def _swiglu_fp8_bwd_kernel(q_ptr, s_ptr, dy_ptr, dh_ptr, M, F, BM: tl.constexpr, SOFT: tl.constexpr,
                           MBITS: tl.constexpr, BIAS: tl.constexpr, H_DTYPE: tl.constexpr):
    rm, rk, mask, row, j, n_fb = _tile(M, F, BM)
    srow = rm.to(tl.int64) * (2 * n_fb)
    sg = tl.load(s_ptr + srow + j, mask=rm < M, other=1.0)
    su = tl.load(s_ptr + srow + n_fb + j, mask=rm < M, other=1.0)
    g = _load_fp8(q_ptr + row + rk[None, :], mask, SOFT, MBITS, BIAS) * sg[:, None]
    u = _load_fp8(q_ptr + row + F + rk[None, :], mask, SOFT, MBITS, BIAS) * su[:, None]
    dy = tl.load(dy_ptr + rm[:, None].to(tl.int64) * F + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    du = dy * (g * sig)
    tl.store(dh_ptr + row + rk[None, :], dg.to(H_DTYPE), mask=mask)
    tl.store(dh_ptr + row + F + rk[None, :], du.to(H_DTYPE), mask=mask)


_ENTRIES: dict = {}
_BM = 16


def supported(h2: torch.Tensor) -> bool:
    """The kernels' shapes and devices (else the reference path runs)."""
    ok_device = h2.is_cuda or kernel_policy().interpret
    return ok_device and h2.dim() == 2 and h2.shape[1] % (2 * TOKEN_BLOCK) == 0 and h2.dtype in _TL_OUT


def swiglu_fp8_fwd(h2: torch.Tensor, scale_format: str, fmt: str):
    """y [M, F] = swiglu(h2), and h2 [M, 2F] as FP8 data [M, 2F] with scales [M, 2F/128] (row-major)."""
    h2 = h2.contiguous()
    M, K = h2.shape
    key = ("fwd", M, K, h2.dtype, h2.device, scale_format, fmt)
    entry = _ENTRIES.get(key)
    if entry is None:
        (fmax, ue, out, div), dt = consts(fmt, scale_format)
        launch = Launch(_swiglu_fp8_fwd_kernel, grid1d(triton.cdiv(M, _BM) * (K // 2 // 128)), 4)
        entry = _ENTRIES[key] = (launch, dt, (M, K // 2, _BM, fmax, ue, out, div, _TL_OUT[h2.dtype]))
    launch, dt, tail = entry
    y = torch.empty((M, K // 2), dtype=h2.dtype, device=h2.device)
    q = torch.empty((M, K), dtype=dt, device=h2.device)
    s = torch.empty((M, K // TOKEN_BLOCK), dtype=torch.float32, device=h2.device)
    launch(h2.device.index, h2, y, fp8_view(q), s, *tail)
    return y, q, s


def swiglu_fp8_bwd(q: torch.Tensor, s: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """dh [M, 2F] in out_dtype, from the FP8 copy of h (swiglu_fp8_fwd) and dy2 [M, F]."""
    dy2 = dy2.contiguous()
    M, K = q.shape
    key = ("bwd", M, K, q.dtype, dy2.dtype, out_dtype, q.device)
    entry = _ENTRIES.get(key)
    if entry is None:
        mbits, bias = (3, 7) if q.dtype == torch.float8_e4m3fn else (2, 15)
        launch = Launch(_swiglu_fp8_bwd_kernel, grid1d(triton.cdiv(M, _BM) * (K // 2 // 128)), 4)
        entry = _ENTRIES[key] = (launch, (M, K // 2, _BM, kernel_policy().interpret, mbits, bias, _TL_OUT[out_dtype]))
    launch, tail = entry
    dh = torch.empty((M, K), dtype=out_dtype, device=q.device)
    launch(q.device.index, fp8_view(q), s, dy2, dh, *tail)
    return dh


def bwd_quant_ok(q: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether swiglu_fp8_bwd_quant takes these operands: bf16 dh and dY on a GPU with the hardware
    cast, M and F whole 128-blocks. Shapes, dtypes and devices only, so that a compiled backward
    can decide while it is traced (a file check there, for the built library, broke the graph)."""
    M, K = q.shape
    return (q.is_cuda and out_dtype == torch.bfloat16 and dy2.dtype == torch.bfloat16 and not kernel_policy().interpret
            and q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and M % TOKEN_BLOCK == 0
            and K % (2 * TOKEN_BLOCK) == 0)


def swiglu_fp8_bwd_quant(q: torch.Tensor, s: torch.Tensor, dy2: torch.Tensor, scale_format: str, fmt: str,
                         loads: int = 4):
    """swiglu_fp8_bwd(q, s, dy2, bf16) quantized per token in both layouts, dh never written: (q [M, 2F],
    scales, q^T [2F, M], scales), the layouts of quantize_token_triton(rows=True, cols=True), by
    quant_both.cu; where that library is not built (no nvcc, INFIR_CUDA_KERNELS=0), by the unfused pair.
    loads: rows loaded ahead per thread, 2 or 4 (4 is the faster at the Qwen2.5 ffn sizes, bench/quant.py
    --swiglu; its FP32-scale variant spills 4 bytes)."""
    if cuda_build.load("quant_both", q.device) is None:
        a, b = quantize_token_triton(swiglu_fp8_bwd(q, s, dy2, torch.bfloat16), scale_format, fmt, rows=True, cols=True)
        return a.data, a.scale, b.data, b.scale
    fn = cuda_fn("infir_swiglu_bwd_quant_both", q.device)
    if dy2.stride(1) != 1 or dy2.stride(0) % 8 or dy2.data_ptr() % 16:
        dy2 = dy2.contiguous()
    q, s = q.contiguous(), s.contiguous()
    M, K = q.shape
    out, so, qt, st = both_layouts_outputs(M, K, fmt, q.device)
    err = fn(q.data_ptr(), s.data_ptr(), int(q.dtype == torch.float8_e5m2), dy2.data_ptr(), dy2.stride(0),
             out.data_ptr(), so.data_ptr(), qt.data_ptr(), st.data_ptr(), M, K // 2, int(scale_format == "ue8m0"),
             int(fmt == "e5m2"), loads, torch._C._cuda_getCurrentRawStream(q.device.index))
    if err:
        raise RuntimeError(f"quant_both.cu's SwiGLU backward failed with cudaError {err} at h {tuple(q.shape)}; "
                           "INFIR_CUDA_KERNELS=0 runs the unfused Triton pair instead")
    return out, so, qt, st


def fwd_quant_ok(h2: torch.Tensor) -> bool:
    """Whether swiglu_fp8_fwd_quant takes h2: bf16 on a GPU with the hardware cast, M and F whole
    128-blocks. Trace-safe, as bwd_quant_ok."""
    M, K = h2.shape
    return (h2.is_cuda and h2.dtype == torch.bfloat16 and not kernel_policy().interpret and M % TOKEN_BLOCK == 0
            and K % (2 * TOKEN_BLOCK) == 0)


def swiglu_fp8_fwd_quant(h2: torch.Tensor, h_scale_format: str, h_fmt: str, scale_format: str, fmt: str,
                         loads: int = 2):
    """swiglu_fp8_fwd(h2, h_scale_format, h_fmt) with y quantized per token in both layouts, y never
    written: (h2's FP8 data [M, 2F], its scales [M, 2F/128] row-major, y's q [M, F], scales, q^T
    [F, M], scales), y's in the layouts of quantize_token_triton(rows=True, cols=True), by
    quant_both.cu; where that library is not built, by the unfused pair. loads: 2 or 4 rows ahead (about
    even at the Qwen2.5 ffn sizes, bench/quant.py --swiglu)."""
    if cuda_build.load("quant_both", h2.device) is None:
        y, qh, sh = swiglu_fp8_fwd(h2, h_scale_format, h_fmt)
        a, b = quantize_token_triton(y, scale_format, fmt, rows=True, cols=True)
        return qh, sh, a.data, a.scale, b.data, b.scale
    fn = cuda_fn("infir_swiglu_fwd_quant_both", h2.device)
    if h2.stride(1) != 1 or h2.stride(0) % 8 or h2.data_ptr() % 16:
        h2 = h2.contiguous()
    M, K = h2.shape
    F, dev = K // 2, h2.device
    qh = torch.empty((M, K), dtype=get_format(h_fmt).dtype, device=dev)
    sh = torch.empty((M, K // TOKEN_BLOCK), dtype=torch.float32, device=dev)
    q, s, qt, st = both_layouts_outputs(M, F, fmt, dev)
    err = fn(h2.data_ptr(), h2.stride(0), qh.data_ptr(), sh.data_ptr(), int(h_scale_format == "ue8m0"),
             int(h_fmt == "e5m2"), q.data_ptr(), s.data_ptr(), qt.data_ptr(), st.data_ptr(), M, F,
             int(scale_format == "ue8m0"), int(fmt == "e5m2"), loads, torch._C._cuda_getCurrentRawStream(dev.index))
    if err:
        raise RuntimeError(f"quant_both.cu's SwiGLU forward failed with cudaError {err} at h {tuple(h2.shape)}; "
                           "INFIR_CUDA_KERNELS=0 runs the unfused Triton pair instead")
    return qh, sh, q, s, qt, st
