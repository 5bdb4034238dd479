"""The CUDA C++ kernels behind ctypes: which inputs they take, and their entry points set up for a device.

quant_both.cu (1x128 token scales in both layouts at once, and SwiGLU fused with them) and
quant_two_level.cu (MOSS rows) are built by nvcc on first use (cuda_build.py); they take raw pointers,
so the wrappers here pass data_ptr()s and the current stream. Each predicate below says whether a
kernel takes an input; where none is built (no nvcc, policy.cuda_kernels off, an older GPU) they
say no, and the Triton kernels run instead, with the same bits.
"""
from __future__ import annotations

import ctypes

import torch

from ..formats import get_format
from ..policy import kernel_policy
from ..quantize import MICRO_GROUP, TOKEN_BLOCK
from . import cuda_build


def cuda_takes(x2: torch.Tensor, name: str) -> bool:
    """What both CUDA C++ quantizers need: bf16 on a GPU, rows of 16-byte aligned vectors, the
    hardware cast (not the interpreter's software one), and kernels/<name>.cu built for the GPU."""
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and not kernel_policy().interpret and x2.stride(1) == 1
            and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0 and cuda_build.load(name, x2.device) is not None)


def cuda_both_ok(x2: torch.Tensor) -> bool:
    """Whether quant_both.cu takes x2: M and K whole 128-blocks, and cuda_takes."""
    M, K = x2.shape
    return M % TOKEN_BLOCK == 0 and K % TOKEN_BLOCK == 0 and cuda_takes(x2, "quant_both")


_CUDA_READY: set = set()
_VP, _I32, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
# entry point -> (its .cu, that library's once-per-device setup, the argument types)
_X_ARGS = [_VP, _I64, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32, _VP]  # x, ldx, 4 outputs, M, K, 3 options, stream
CUDA_ENTRY = {
    "infir_quant_token_both": ("quant_both", "infir_quant_token_both_init", _X_ARGS),
    "infir_quant_two_level": ("quant_two_level", "infir_quant_two_level_init", _X_ARGS),
    # qh, sh, h_e5m2, dy, ldy, 4 outputs, M, F, 3 options, stream
    "infir_swiglu_bwd_quant_both": ("quant_both", "infir_quant_token_both_init",
                                    [_VP, _VP, _I32, _VP, _I64, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32, _VP]),
    # h, ldh, qh, sh, h_ue8m0, h_e5m2, 4 outputs, M, F, 3 options, stream
    "infir_swiglu_fwd_quant_both": ("quant_both", "infir_quant_token_both_init",
                                    [_VP, _I64, _VP, _VP, _I32, _I32, _VP, _VP, _VP, _VP, _I32, _I32, _I32, _I32, _I32,
                                     _VP]),
}


def cuda_fn(entry: str, device: torch.device):
    """The ctypes function `entry` of its kernels/<name>.cu, that library's kernels set up on `device`."""
    name, init, argtypes = CUDA_ENTRY[entry]
    lib = cuda_build.load(name, device)
    if (name, device) not in _CUDA_READY:
        with torch.cuda.device(device):
            err = getattr(lib, init)()
        if err:
            raise RuntimeError(f"{name}.cu: setting up its kernels failed with cudaError {err}")
        _CUDA_READY.add((name, device))
    fn = getattr(lib, entry)
    fn.restype = _I32
    fn.argtypes = argtypes
    return fn


def both_layouts_outputs(M: int, K: int, fmt: str, device: torch.device):
    """Empty (q [M, K], its scales, q^T [K, M], its scales) for quant_both.cu's kernels to write, each
    scale tensor outer-dim-major as scaled_mm reads it (s[kb * M + m], st[mb * K + k])."""
    dt, f32 = get_format(fmt).dtype, torch.float32
    return (torch.empty((M, K), dtype=dt, device=device),
            torch.empty_strided((M, K // TOKEN_BLOCK), (1, M), dtype=f32, device=device),
            torch.empty((K, M), dtype=dt, device=device),
            torch.empty_strided((K, M // TOKEN_BLOCK), (1, K), dtype=f32, device=device))


TWO_LEVEL_MAX_K = 49152  # quant_two_level.cu keeps a row in (at most 96 KB of) shared memory


def cuda_two_level_ok(x2: torch.Tensor) -> bool:
    """Whether quant_two_level.cu takes x2: whole groups of 32, at most TWO_LEVEL_MAX_K elements
    per row, and cuda_takes."""
    K = x2.shape[1]
    return K % MICRO_GROUP == 0 and K <= TWO_LEVEL_MAX_K and cuda_takes(x2, "quant_two_level")
