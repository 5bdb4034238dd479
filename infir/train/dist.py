"""Process-group setup for torchrun (or a single process): NCCL on GPUs, gloo on CPU, megatron's TP/CP/DP groups."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    device: torch.device
    cp: int = 1
    cp_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda but CUDA is not available here; use device=cpu or device=auto")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if choice != "cpu":
        raise ValueError(f"device={choice!r}; valid: auto, cpu, cuda")
    return torch.device("cpu")


def init(tp: int, device_choice: str = "auto", timeout_s: int = 600, cp: int = 1) -> DistInfo:
    from megatron.core import parallel_state as ps

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_choice, local_rank)
    if world % (tp * cp):
        from infir.train.config import ConfigError

        fits = [n for n in range(1, world + 1) if world % n == 0]
        raise ConfigError(f"parallel.tp x parallel.cp = {tp} x {cp} = {tp * cp} does not divide the {world} processes: "
                          f"launch a multiple of {tp * cp} processes (tp x cp x dp), or make tp x cp one of {fits}")
    if not dist.is_initialized():
        # A single process without torchrun rendezvous in memory: no port, and nothing written to
        # os.environ that a later child process would inherit.
        rendezvous = {"store": dist.HashStore()} if world == 1 and "MASTER_ADDR" not in os.environ else {}
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            **rendezvous,
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    return DistInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        tp=tp,
        dp=world // (tp * cp),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        device=device,
        cp=cp,
        cp_rank=ps.get_context_parallel_rank(),
    )


def shutdown() -> None:
    from megatron.core import parallel_state as ps

    if dist.is_initialized() and torch.cuda.is_initialized():
        # CUDA graphs that captured NCCL collectives (compiled layers under reduce-overhead at TP or CP > 1)
        # must be freed before their groups are destroyed, or torch's destroy_process_group never returns and
        # a finished run holds its GPUs until the scheduler's time limit. torch.compiler.reset() frees
        # inductor's CUDA graph trees.
        torch.cuda.synchronize()
        torch.compiler.reset()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()

