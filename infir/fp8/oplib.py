"""Registration of infir's opaque graph ops (the FP8 linear's quantizers and GEMMs, SwiGLU's kernels).

Why not `torch.library.custom_op`: its Python wrappers (autograd and aliasing checks, a dynamo-disable
frame) cost several times the op's own host work per call (bench/quant.py --host times both), and a compiled layer of
an FP8 recipe calls ~20 of these ops per micro-batch, which at 0.5B-1.5B made the step wait on the
host. A plain `torch.library.Library` definition dispatches straight to the Python implementation;
the ops are functional (no aliasing, no mutation) and are only ever called inside
autograd Functions' forward/backward, so they need no autograd kernel of their own.
"""
from __future__ import annotations

from typing import Callable

import torch

_LIB = torch.library.Library("infir", "FRAGMENT")


def define_op(name: str, schema: str, impl: Callable, fake: Callable):
    """infir::name with `schema` (arguments and returns, e.g. "(Tensor x, str g) -> Tensor"), run by
    `impl` on every device and by `fake` under tracing; returns the op's default overload."""
    _LIB.define(name + schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"infir::{name}", fake, lib=_LIB)
    return getattr(torch.ops.infir, name).default
