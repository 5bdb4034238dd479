"""Fixtures for the optimizer tests (Triton's interpreter on CPU is set in tests/conftest.py)."""
import types

import numpy as np
import pytest
import torch


@pytest.fixture
def flashoptim_kernels(monkeypatch):
    """The `flashoptim` package's own Triton kernels, run on CPU tensors by Triton's interpreter
    with the semantics they have compiled on a GPU. Three interpreter gaps are patched:
    - Python-float kernel arguments stay fp64 in the interpreter (``1.0 - beta1`` is computed
      in fp64) where the compiled kernel receives fp32: they are converted to fp32;
    - the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even: it rounds;
    - libdevice.pow / copysign have no interpreter version: numpy ones stand in. pow is taken
      in fp64 and rounded once, i.e. correctly rounded, as ours (adam_math.AdamScalars); the
      GPU's libdevice powf and numpy's float32 pow may differ from it by an ulp for some steps
      (0.9**4 does), which then moves a few corrections by one level."""
    if torch.cuda.is_available():
        pytest.fail("flashoptim_kernels is the CPU stand-in for the GPU; on a GPU host compare "
                    "against flashoptim directly")
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton.runtime.interpreter import TensorHandle

    import flashoptim.optimizers as fo

    def wrap(array, ty):
        return tl.tensor(TensorHandle(array, ty), ty)

    def as_f32(x):
        return np.float32(x) if isinstance(x, float) else x.handle.data.astype(np.float32)

    libdevice = types.SimpleNamespace(
        pow=lambda base, exp: wrap(np.asarray(np.power(np.float64(as_f32(base)), as_f32(exp)),
                                              dtype=np.float32).reshape(-1), tl.float32),
        copysign=lambda mag, sign: wrap(np.copysign(as_f32(mag), as_f32(sign)), tl.float32))

    convert_arg = interp._implicit_cvt

    def convert_arg_fp32(arg):
        if isinstance(arg, float):
            return wrap(np.array([arg], dtype=np.float32), tl.float32)
        return convert_arg(arg)

    cast = interp.InterpreterBuilder.cast_impl

    def cast_rounding(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = rounded.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return TensorHandle(bits, tl.bfloat16)
        return cast(self, src, dst_type)

    monkeypatch.setattr(interp, "_implicit_cvt", convert_arg_fp32)
    monkeypatch.setattr(interp.InterpreterBuilder, "cast_impl", cast_rounding)
    monkeypatch.setitem(fo._triton_adam_kernel.fn.__globals__, "libdevice", libdevice)
    monkeypatch.setattr(fo, "_get_sm_count", lambda device=None: 4)
    return fo
