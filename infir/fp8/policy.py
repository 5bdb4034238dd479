"""Which fast kernels infir.fp8 may run and how it picks their configurations, read once from the
environment.

- INFIR_CUDA_KERNELS=0 (`cuda_kernels`): never build or pick the CUDA C++ kernels (quant_both.cu,
  quant_two_level.cu, lt_wgrad.cu); the Triton kernels and torch's scaled_mm stand in, same bits.
- INFIR_FP8_AUTOTUNE=0 (`autotune`): each kernel runs its default configuration instead of the
  fastest of its candidates, timed on the first call for a shape.
- TRITON_INTERPRET=1 (`interpret`): Triton runs the kernels on the CPU (the tests). They then write
  FP8 through uint8 views rounded in integer arithmetic (the interpreter's own float8 cast rounds
  differently from the GPU and from torch), divide with div_rn and take small configurations.

Read on first use rather than at import, so that a test setting TRITON_INTERPRET before its first
kernel call (Triton reads it when a kernel is decorated) gets the interpreter's policy. A module of
its own, not part of dispatch.py: the kernels consult it and dispatch.py imports the kernels.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelPolicy:
    cuda_kernels: bool = True
    autotune: bool = True
    interpret: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "KernelPolicy":
        return cls(cuda_kernels=env.get("INFIR_CUDA_KERNELS", "1") != "0",
                   autotune=env.get("INFIR_FP8_AUTOTUNE", "1") != "0",
                   interpret=env.get("TRITON_INTERPRET") == "1")


_current: KernelPolicy | None = None


def kernel_policy() -> KernelPolicy:
    """The process's policy: read from the environment on the first call, then kept."""
    global _current
    if _current is None:
        _current = KernelPolicy.from_env()
    return _current


@contextlib.contextmanager
def policy_override(**changes) -> Iterator[KernelPolicy]:
    """The current policy with some fields changed, inside the block (tests and benches: the CUDA
    kernels off, configurations timed as set). Kernels already set up for a shape keep their
    choice: clear kernels.autotune's launch cache where that matters."""
    global _current
    saved = kernel_policy()
    _current = dataclasses.replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved
