"""Shared test setup: `gpu` tests are skipped where CUDA is absent (CI), and run on a GPU host; without a GPU
the Triton kernels run in Triton's interpreter. That must be set before any `triton.jit` runs, so here, before
any test module (whichever of them first imports a kernel module) is collected."""
import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run `pytest -m gpu` on a GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
