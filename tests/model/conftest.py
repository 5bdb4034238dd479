"""A one-process gloo group with megatron's parallel state, for tests that build models."""
from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def megatron_tp1():
    """torch.distributed (gloo, one process, an in-memory store) and megatron's parallel state at TP=1."""
    from megatron.core import parallel_state

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    yield
    parallel_state.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()
