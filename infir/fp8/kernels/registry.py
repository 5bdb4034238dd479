"""Every fast kernel of infir.fp8 beside its plain-PyTorch reference, with an input maker and how the two
must agree: the table that tests/fp8/test_kernel_pairs.py runs, one test per pair.

A pair's kernel runs on the test's device (a GPU, or Triton's interpreter on the CPU), its reference on
the CPU: the reference's IEEE division there is the source of truth (torch's CUDA division is not always
bit-identical to it). Agreement is Exact (every byte and scale: the quantizers, the transpose), or a
tolerance that names why the two may differ (transcendentals, summation order).
"""
from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..block_range import block_range_amax_reference, quantize_block_range_reference
from ..formats import FORMATS, SCALE_FORMATS, amax_with_nan_as_inf, get_format, scale_from_amax
from ..gemm_reference import emulated_gemm
from ..lm_loss_reference import chunk_grad_torch, chunk_stats_torch
from ..quantize import (QTensor, dequantize, fold_two_level, quantize_reference, quantize_tensor_ref,
                        transposed_reference)
from ..swiglu_reference import (swiglu_fp8_backward_quantized_reference, swiglu_fp8_backward_reference,
                                swiglu_fp8_forward_quantized_reference, swiglu_fp8_forward_reference)
from .cuda_lib import cuda_both_ok, cuda_two_level_ok
from .gemm_two_level import two_level_gemm_triton
from .lm_loss import chunk_grad_triton, chunk_stats_triton
from .lt_wgrad import lt_wgrad
from .quant_any import quantize_triton
from .quant_block import quantize_block_triton
from .quant_block_range import block_range_amax_triton, quantize_block_range_triton
from .quant_tensor import amax_triton, quantize_tensor_triton
from .quant_token import quantize_token_triton
from .quant_two_level import quantize_two_level_triton
from .swiglu import swiglu_fp8_bwd, swiglu_fp8_bwd_quant, swiglu_fp8_fwd, swiglu_fp8_fwd_quant
from .transpose import transpose_2d


@dataclass(frozen=True)
class Exact:
    """The same bytes: FP8 data, scales (NaN where the reference has NaN), every output."""


@dataclass(frozen=True)
class Close:
    """Elementwise, torch.testing.assert_close(rtol, atol)."""
    rtol: float
    atol: float
    reason: str


@dataclass(frozen=True)
class NormClose:
    """||got - want|| / ||want|| below tol."""
    tol: float
    reason: str


Match = Exact | Close | NormClose


@dataclass(frozen=True)
class KernelPair:
    """kernel(*inputs(device)) against reference(*the same inputs on the CPU). match: one Match for every
    output, or one per output of a tuple. needs: "triton" (a GPU, or the interpreter on the CPU), "cuda"
    (a GPU with the CUDA C++ library built) or "sm90" (cuBLASLt's blockwise FP8, Hopper)."""
    name: str
    kernel: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: Callable[[torch.device], tuple]
    match: Match | tuple[Match, ...]
    needs: str = "triton"


def awkward(shape, device, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Heavy-tailed values (magnitudes spread over many binades), made on the CPU so that every device
    gets the same ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    return x.to(dtype).to(device)


def _matrix(cpu_shape, gpu_shape, dtype=torch.bfloat16, seed=0):
    """An input maker: one awkward matrix, small in the interpreter, with partial tiles either way."""
    return lambda dev: (awkward(cpu_shape if dev.type == "cpu" else gpu_shape, dev, seed, dtype),)


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


_ODD = ((130, 257), (4097, 3583))  # no dim a multiple of 128 or 32
_WHOLE = ((256, 384), (4096, 3584))  # whole 128-blocks (the CUDA C++ quantizers and the fused SwiGLU)


def _quantizer_pairs(sf: str, fmt: str) -> list[KernelPair]:
    ref = functools.partial(quantize_reference, scale_format=sf, fmt=fmt)
    x = _matrix(*_ODD, seed=_seed(sf + fmt))
    tag = f"{sf}/{fmt}"
    return [
        KernelPair(f"token_rows/{tag}", lambda t: quantize_token_triton(t, sf, fmt)[0],
                   lambda t: ref(t, "token"), x, Exact()),
        KernelPair(f"token_cols/{tag}", lambda t: quantize_token_triton(t, sf, fmt, rows=False, cols=True)[1],
                   lambda t: ref(t.t(), "token"), x, Exact()),
        KernelPair(f"token_both/{tag}", lambda t: quantize_token_triton(t, sf, fmt, rows=True, cols=True),
                   lambda t: (ref(t, "token"), ref(t.t(), "token")), x, Exact()),
        KernelPair(f"block/{tag}", lambda t: quantize_block_triton(t, sf, fmt), lambda t: ref(t, "block"), x, Exact()),
        KernelPair(f"block_transposed/{tag}", lambda t: quantize_block_triton(t, sf, fmt).t(transpose_2d),
                   lambda t: ref(t, "block").t(), x, Exact()),
        KernelPair(f"tensor_both/{tag}", lambda t: quantize_tensor_triton(t, sf, fmt, transpose=True),
                   lambda t: (ref(t, "tensor"), ref(t, "tensor").t()), x, Exact()),
        KernelPair(f"two_level/{tag}", lambda t: quantize_two_level_triton(t, sf, fmt, impl="triton"),
                   lambda t: ref(t, "two_level"), x, Exact()),
        KernelPair(f"two_level_folded/{tag}", lambda t: quantize_two_level_triton(t, sf, fmt, fold=True, impl="triton"),
                   lambda t: fold_two_level(ref(t, "two_level")), x, Exact()),
    ]


def _given_scale(dev):
    return awkward((70, 100), dev, 7, torch.float32), torch.tensor(0.37, device=dev)


def _batched(dev):
    return (awkward((3, 37, 160), dev, 8),)


def _sharded_block(sf: str, fmt: str, cuts: int, fast: bool):
    """A weight cut into `cuts` element ranges that straddle blocks, as ZeRO-1 shards are: each range's
    block amax, their MAX, the whole weight's scales, each range quantized; the weight's QTensor."""
    amax_fn = block_range_amax_triton if fast else block_range_amax_reference

    def run(w):
        shape, n = tuple(w.shape), w.numel()
        edges = [0, *sorted({(n * i) // cuts + 37 * i for i in range(1, cuts)}), n]
        ranges = [(a, w.view(-1)[a:b]) for a, b in zip(edges, edges[1:])]
        blocks = (-(-shape[0] // 128), -(-shape[1] // 128))
        amax = torch.stack([amax_fn(flat, a, shape, w.new_zeros(blocks, dtype=torch.float32)) for a, flat in ranges]).amax(0)
        scale = scale_from_amax(amax, get_format(fmt), sf)
        parts = [quantize_block_range_triton(flat, a, shape, scale, sf, fmt) if fast
                 else quantize_block_range_reference(flat, a, shape, scale, fmt) for a, flat in ranges]
        return QTensor(torch.cat([q.view(torch.uint8) for q in parts]).view(get_format(fmt).dtype).view(shape), scale,
                       "block", sf, fmt)
    return run


def _block_range_pairs() -> list[KernelPair]:
    """The ZeRO-1 shard quantizer against its reference and against the whole weight's quantizer."""
    pairs = []
    for sf in SCALE_FORMATS:
        x = _matrix(*_ODD, seed=_seed("range" + sf))
        pairs += [
            KernelPair(f"block_range/{sf}", _sharded_block(sf, "e4m3", 3, True), _sharded_block(sf, "e4m3", 3, False),
                       x, Exact()),
            KernelPair(f"block_range_vs_whole/{sf}", _sharded_block(sf, "e4m3", 4, True),
                       functools.partial(quantize_reference, granularity="block", scale_format=sf), x, Exact()),
        ]
    return pairs


def _more_quantizer_pairs() -> list[KernelPair]:
    pairs = [
        KernelPair("amax", amax_triton, amax_with_nan_as_inf, _matrix(*_ODD, dtype=torch.float32, seed=5), Exact()),
        KernelPair("tensor_given_scale", lambda t, s: quantize_tensor_triton(t, "fp32", scale=s)[0],
                   lambda t, s: quantize_tensor_ref(t, get_format("e4m3"), "fp32", scale=s), _given_scale, Exact()),
    ]
    for gran in ("tensor", "token", "two_level"):  # any leading dims, flattened to rows and back
        pairs.append(KernelPair(f"quantize_batched/{gran}", functools.partial(quantize_triton, granularity=gran),
                                functools.partial(quantize_reference, granularity=gran), _batched, Exact()))
    for name, dtype in (("fp8", torch.float8_e4m3fn), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        pairs.append(KernelPair(f"transpose/{name}", transpose_2d, transposed_reference,
                                _matrix((130, 257), (1536, 8960), dtype=dtype, seed=6), Exact()))
    return pairs


def _cuda_quantizer_pairs(sf: str, fmt: str) -> list[KernelPair]:
    """quant_both.cu and quant_two_level.cu, where nvcc built them (else the test fails: it would
    compare the Triton fallback instead)."""
    def both(t):
        assert cuda_both_ok(t), "quant_both.cu is not built here (is nvcc on PATH or CUDA_HOME set?)"
        return quantize_token_triton(t, sf, fmt, rows=True, cols=True, config={"CUDA": True, "LOADS": 4})

    def two_level(t, fold):
        assert cuda_two_level_ok(t), "quant_two_level.cu is not built here (is nvcc on PATH or CUDA_HOME set?)"
        return quantize_two_level_triton(t, sf, fmt, fold=fold, impl="cuda")

    ref = functools.partial(quantize_reference, scale_format=sf, fmt=fmt)
    x = _matrix(*_WHOLE, seed=_seed("cuda" + sf + fmt))
    return [
        KernelPair(f"cuda_token_both/{sf}/{fmt}", both, lambda t: (ref(t, "token"), ref(t.t(), "token")), x, Exact(),
                   "cuda"),
        KernelPair(f"cuda_two_level/{sf}/{fmt}", lambda t: two_level(t, False), lambda t: ref(t, "two_level"), x,
                   Exact(), "cuda"),
        KernelPair(f"cuda_two_level_folded/{sf}/{fmt}", lambda t: two_level(t, True),
                   lambda t: fold_two_level(ref(t, "two_level")), x, Exact(), "cuda"),
    ]


_Y_TOL = Close(1.6e-2, 1e-6, "Triton's exp is not torch's, and the output is rounded to bf16 after it: two bf16 ulps")
_FUSED_TOL = NormClose(1e-2, "the fused kernel's sigmoid takes the fast exp and division (2 ulps): after the bf16 and "
                             "FP8 roundings a rare byte is one FP8 step off (tests/fp8/test_swiglu.py bounds how rare)")


def _h(dev):
    return (awkward((37, 512) if dev.type == "cpu" else (4104, 3584), dev, 11),)


def _h_whole(dev):
    return (awkward((256, 768) if dev.type == "cpu" else (4096, 3584), dev, 12),)


def _fp8_copy_and_dy(make_h, sf):
    """(h's FP8 data, its 1x128 scales, dy) for the SwiGLU backward kernels."""
    def inputs(dev):
        (h,) = make_h(dev)
        _, q, s = swiglu_fp8_forward_reference(h, sf, "e4m3")
        return q, s, awkward((h.shape[0], h.shape[1] // 2), dev, 13)
    return inputs


def _dequantized(q, s, qt, st, sf, fmt):
    """The values of a fused kernel's two token layouts (a rare scale may differ, so not raw bytes)."""
    return dequantize(QTensor(q, s, "token", sf, fmt)), dequantize(QTensor(qt, st, "token", sf, fmt))


def _swiglu_pairs(sf: str) -> list[KernelPair]:
    fwd_q = lambda out: (out[0], out[1], *_dequantized(*out[2:], sf, "e4m3"))
    bwd_q = lambda out: _dequantized(*out, sf, "e4m3")
    return [
        KernelPair(f"swiglu_fwd/{sf}", lambda h: swiglu_fp8_fwd(h, sf, "e4m3"),
                   lambda h: swiglu_fp8_forward_reference(h, sf, "e4m3"), _h, (_Y_TOL, Exact(), Exact())),
        KernelPair(f"swiglu_bwd/{sf}", lambda q, s, dy: swiglu_fp8_bwd(q, s, dy, torch.bfloat16),
                   lambda q, s, dy: swiglu_fp8_backward_reference(q, s, dy, torch.bfloat16, sf, "e4m3"),
                   _fp8_copy_and_dy(_h, sf), _Y_TOL),
        KernelPair(f"cuda_swiglu_fwd_quantized/{sf}",
                   lambda h: fwd_q(swiglu_fp8_fwd_quant(h, "ue8m0", "e4m3", sf, "e4m3")),
                   lambda h: fwd_q(swiglu_fp8_forward_quantized_reference(h, "ue8m0", "e4m3", sf, "e4m3")),
                   _h_whole, (Exact(), Exact(), _FUSED_TOL, _FUSED_TOL), "cuda"),
        KernelPair(f"cuda_swiglu_bwd_quantized/{sf}",
                   lambda q, s, dy: bwd_q(swiglu_fp8_bwd_quant(q, s, dy, sf, "e4m3")),
                   lambda q, s, dy: bwd_q(swiglu_fp8_backward_quantized_reference(q, s, dy, "ue8m0", "e4m3", sf,
                                                                                  "e4m3")),
                   _fp8_copy_and_dy(_h_whole, "ue8m0"), _FUSED_TOL, "cuda"),
    ]


def _two_level_operands(b_granularity):
    def inputs(dev):
        (m, n, k) = (40, 24, 96) if dev.type == "cpu" else (4096, 4608, 3584)
        a = awkward((m, k), dev, 21, torch.float32)
        b = awkward((n, k), dev, 22, torch.float32)
        return quantize_reference(a, "two_level", "fp32"), quantize_reference(b, b_granularity, "fp32")
    return inputs


def _two_level_gemm(a, b):
    small = {"block_m": 16, "block_n": 16, "block_k": 64} if a.data.device.type == "cpu" else {}
    return two_level_gemm_triton(a, b, torch.float32, **small)


def _wgrad_operands(dev):
    """dY^T [N, tokens] and X^T [K, tokens], each along the tokens (the wgrad product's operands)."""
    x, dy = awkward((384, 640), dev, 23), awkward((384, 1024), dev, 24)
    return quantize_reference(dy.t().contiguous(), "token"), quantize_reference(x.t().contiguous(), "token")


def _lt_wgrad(a, b):
    outer = lambda s: s.t().contiguous().t()  # the outer-dim-major scales cuBLASLt reads
    out = lt_wgrad(a.data, outer(a.scale), b.data, outer(b.scale), torch.float32)
    assert out is not None, "lt_wgrad.cu is not built here, or declined these operands"
    return out


def _gemm_pairs() -> list[KernelPair]:
    tol = NormClose(1e-3, "FP32 sums in another order; on a GPU the FP8 tensor cores' accumulation inside a "
                          "block is not a full FP32 one")
    return [
        KernelPair("two_level_gemm/two_level", _two_level_gemm, emulated_gemm, _two_level_operands("two_level"), tol),
        KernelPair("two_level_gemm/tensor", _two_level_gemm, emulated_gemm, _two_level_operands("tensor"), tol),
        KernelPair("lt_wgrad", _lt_wgrad, emulated_gemm, _wgrad_operands, tol, "sm90"),
    ]


def _chunk(dev):
    """A chunk of bf16 logits (V not a multiple of the kernels' block), targets some of which live on
    another vocabulary shard, and loss weights."""
    n, v = (9, 1000) if dev.type == "cpu" else (256, 32768 + 77)
    g = torch.Generator().manual_seed(31)
    logits = (torch.randn(n, v, generator=g) * 4).bfloat16()
    target = torch.randint(-200, v + 200, (n,), generator=g)
    return logits.to(dev), target.to(dev), torch.rand(n, generator=g).to(dev)


def _in_place(fn, block=None):
    """fn writes the logits' gradient over them: run it on a copy and return that."""
    def run(z, t, w):
        m, s, _ = chunk_stats_torch(z, t)
        out = z.clone()
        fn(out, t, m, s, w, **({} if block is None else {"block": block}))
        return out
    return run


def _lm_loss_pairs() -> list[KernelPair]:
    small = lambda z: {"block": 256} if z.device.type == "cpu" else {}  # several blocks a row in the interpreter
    return [
        KernelPair("lm_loss_stats", lambda z, t, w: chunk_stats_triton(z, t, **small(z)),
                   lambda z, t, w: chunk_stats_torch(z, t), _chunk,
                   Close(1e-5, 1e-6, "an online max and sum of exponentials, summed in another order than torch's")),
        KernelPair("lm_loss_grad", lambda z, t, w: _in_place(chunk_grad_triton, small(z).get("block"))(z, t, w),
                   _in_place(chunk_grad_torch), _chunk,
                   Close(2**-7, 1e-9, "the same FP32 value up to exp and division rounding, then rounded to bf16: "
                                      "one bf16 ulp apart")),
    ]


def _all_pairs() -> list[KernelPair]:
    pairs = []
    for sf in SCALE_FORMATS:
        for fmt in FORMATS:
            pairs += _quantizer_pairs(sf, fmt) + _cuda_quantizer_pairs(sf, fmt)
        pairs += _swiglu_pairs(sf)
    return pairs + _more_quantizer_pairs() + _block_range_pairs() + _gemm_pairs() + _lm_loss_pairs()


PAIRS: tuple[KernelPair, ...] = tuple(_all_pairs())
