"""The few places where megatron-core 0.16 assumes CUDA, made safe on a CPU-only host.

Active only when CUDA is absent (CI, laptops): with a GPU, nothing here is touched.
- megatron asks `torch.cuda.current_device()` for the device of tensors it creates at run time:
  RotaryEmbedding.get_emb (models/common/embeddings/rotary_pos_embedding.py:162) moves `inv_freq`
  there, and DDP's _ParamAndGradBuffer (distributed/param_and_grad_buffer.py:806) allocates its
  gradient buffers there. Without CUDA the call raises; we make it answer "cpu", which every such
  `device=` argument accepts. (A per-call-site patch would fork more of megatron than this one line.)
- tensor_parallel.model_parallel_cuda_manual_seed raises without CUDA: `seed_everything` seeds the
  CPU generator alone there. Under sequence parallelism the embedding still forks megatron's CUDA RNG
  tracker around its (zero-rate) dropout (language_model_embedding.py:145); on CPU that fork is a
  no-op context, as megatron's own inference tracker makes it.
- activation recomputation (tensor_parallel.CheckpointFunction) saves and restores the CUDA RNG
  state around the recomputed forward (random.py:444-460, via _get/_set_cuda_rng_state): on CPU
  there is no CUDA generator, so those two read an empty state and restore nothing (the CPU
  generator, which megatron saves and restores beside it, is the one that matters there).
- megatron's local DotProductAttention builds its mask on "cuda": our spec uses CoreAttention instead.
- megatron's optimizer wrappers allocate on 'cuda' unconditionally (optimizer/optimizer.py:907), so
  the trainer steps a plain torch optimizer over DDP's fp32 `main_grad` buffers instead (train/loop.py).
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

_installed = False


def install() -> None:
    global _installed
    if _installed or torch.cuda.is_available():
        return
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.tensor_parallel import random as tp_random

    tp_random.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    tp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    tp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    _installed = True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)
