"""The compiled layers' inductor options: a collective's wait comes after the GEMMs issued between its start
and its wait (as the FP8 core's backward issues dX's reduce-scatter around wgrad), not right after the start,
where inductor puts it by default and the collective runs with nothing beside it."""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from infir.train.loop import OVERLAP_COLLECTIVES


def _scheduled(options: dict) -> list[str]:
    """The order of the reduce-scatter, its wait and the two GEMMs in inductor's code for a start-GEMM-wait
    graph compiled with `options`, over the default group."""
    from torch._inductor.utils import run_and_get_code

    group = dist.group.WORLD.group_name

    def layer(a, b, c):
        partial = torch.ops._c10d_functional.reduce_scatter_tensor((a @ b).contiguous(), "sum", 1, group)
        other = c @ b  # a GEMM that does not read the reduce-scatter's result
        return torch.ops._c10d_functional.wait_tensor(partial) + 1, other

    torch._dynamo.reset()
    x = torch.randn(32, 32)
    _, code = run_and_get_code(torch.compile(layer, options=options), x, x, x)
    calls = re.findall(r"(reduce_scatter_tensor\.default\(|wait_tensor\.default\(|extern_kernels\.mm\()", code[0])
    return [c.split(".")[0].split("(")[0] for c in calls]


def test_a_collectives_wait_moves_past_the_gemm_issued_before_it():
    own = not dist.is_initialized()  # a one-rank group of this test's own, unless the process has one
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        default = _scheduled(torch._inductor.list_mode_options("default"))
        overlapped = _scheduled({**torch._inductor.list_mode_options("default"), **OVERLAP_COLLECTIVES})
    finally:
        if own:
            dist.destroy_process_group()
        torch._dynamo.reset()
    assert default == ["extern_kernels", "reduce_scatter_tensor", "wait_tensor", "extern_kernels"], default
    assert overlapped == ["extern_kernels", "reduce_scatter_tensor", "extern_kernels", "wait_tensor"], overlapped
