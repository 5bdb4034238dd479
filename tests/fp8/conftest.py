"""Without a GPU, run the Triton kernels in Triton's interpreter (must be set before triton.jit runs)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
