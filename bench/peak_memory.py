"""A timed case's peak memory as the GPU held it, from its result row, for the reports that show it.

bench/step.py records two peaks: of allocated tensors (`peak_mem_GiB`) and of what the caching allocator held
(`peak_reserved_GiB`). Only the second counts CUDA-graphed layers' activations: graph replays write into the
graphs' memory pool without allocating, so once the graphs are captured the allocated peak no longer sees them.
Results written before the reserved peak was recorded have only the allocated one, which without graphs is
the held peak less the allocator's slack, and under graphs misses the pool: no figure is shown for those.
"""
from __future__ import annotations


def graphs_by_default(precision: str, recompute: str) -> bool:
    """Whether a case of an older result ran CUDA-graphed layers (newer rows say so: `cuda_graphs`):
    model.compile_mode=auto takes them for the block-scaled FP8 recipes without recomputation, an override
    where it names a mode."""
    overrides = precision.partition("+")[2]
    if "compile_mode=" in overrides:
        return "compile_mode=reduce-overhead" in overrides
    return precision.startswith("fp8_blockwise") and recompute == "none"


def held_peak_GiB(row: dict, precision_key: str = "precision") -> float | None:
    """The row's held peak (GiB); None where only an allocated peak that misses graph pools was recorded."""
    if "peak_reserved_GiB" in row:
        return row["peak_reserved_GiB"]
    graphed = graphs_by_default(str(row.get(precision_key, "")), str(row.get("recompute", "none")))
    return None if graphed else row.get("peak_mem_GiB")
