"""infir.fp8.sp_overlap's split gathers give what one all-gather gives (sp_overlap_worker.py under torchrun): the
all-to-all exchanges on CPU (gloo, two and four ranks), and on two and four GPUs also the copy engines' pulls over
symmetric memory, back to back, growing and replayed from a CUDA graph; reduce-scatters likewise."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from trainrun import worker_rows  # noqa: E402

WORKER = str(Path(__file__).resolve().parent / "sp_overlap_worker.py")


@pytest.mark.parametrize("nproc", [2, 4])
def test_exchanges_gather_what_an_all_gather_does(nproc):
    rows = worker_rows(WORKER, nproc=nproc)
    for r in rows:
        assert r["exchange"] == r["exchange_reduce_scatter"] == [True] * 4 and r["shares_memory"] is False, r
        assert r["exchange_one_block"] is True, r


@pytest.mark.gpu
@pytest.mark.parametrize("nproc", [2, 4])
def test_copy_engines_gather_what_an_all_gather_does(nproc):
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    for r in worker_rows(WORKER, "cuda", nproc=nproc):
        assert r["shares_memory"] is True, r
        assert r["exchange"] == r["copy_engine"] == [True] * 4, r
        assert r["exchange_one_block"] is r["copy_engine_one_block"] is True, r
        assert r["exchange_reduce_scatter"] == r["copy_engine_reduce_scatter"] == [True] * 4, r
        assert r["reduce_scatter_transports_equal"] == [True] * 4, r
        assert r["graphed"] == r["graphed_reduce_scatter"] == [True, True], r


def test_gpus_that_cannot_map_each_others_memory_stop_with_the_switch_that_avoids_it():
    """The trainer turns this error into its one line (infir.train.loop.build_model); a CPU cannot map at all."""
    from infir.fp8 import sp_overlap

    with pytest.raises(sp_overlap.MappingUnavailable, match=r"group tp0 could not map .*parallel\.tp_comm_overlap=false"):
        sp_overlap.reserve("tp0", 1 << 20, torch.device("cpu"))
    assert "tp0" not in sp_overlap._MAPPED and "tp0" not in sp_overlap._RESERVED


def test_a_reserved_buffer_grows_only_by_reserve(monkeypatch):
    """Inside the schedules a reserved group's buffer never grows (the compiled layers' graphs could not take a
    new mapping); a later reserve grows it (a second model of longer micro-batches in one process), keeping the
    outgrown one for graphs that replay it. Mapping stubbed: a CPU has no symmetric memory."""
    from torch.distributed import _symmetric_memory as symm_mem

    from infir.fp8 import sp_overlap

    monkeypatch.setattr(symm_mem, "empty", lambda size, dtype, device: torch.empty(size, dtype=dtype))
    monkeypatch.setattr(symm_mem, "rendezvous", lambda buf, group: ("handle", buf.numel()))
    monkeypatch.setattr(sp_overlap, "_MAPPED", {})
    monkeypatch.setattr(sp_overlap, "_RESERVED", set())
    monkeypatch.setattr(sp_overlap, "_OUTGROWN", [])
    cpu = torch.device("cpu")
    sp_overlap.reserve("tp0", 1000, cpu)
    assert sp_overlap._mapped_buffer("tp0", 1 << 20, cpu) == ("handle", 1 << 20)  # at least 1 MiB, a power of two
    with pytest.raises(RuntimeError, match="undercounted"):
        sp_overlap._mapped_buffer("tp0", (1 << 20) + 1, cpu)
    sp_overlap.reserve("tp0", 3 << 20, cpu)
    assert sp_overlap._mapped_buffer("tp0", 3 << 20, cpu) == ("handle", 4 << 20)
    assert [held[1] for held in sp_overlap._OUTGROWN] == [("handle", 1 << 20)]


def test_a_group_is_on_one_host_only_inside_one_hosts_block_of_ranks():
    """torchrun numbers each host's processes consecutively: a TP=4 group of ranks 4-7 lies on one 8-GPU host
    but straddles two 6-GPU ones; without torchrun's count nothing is known to share memory."""
    from infir.fp8 import sp_overlap

    assert sp_overlap.on_one_host([4, 5, 6, 7], 8)
    assert not sp_overlap.on_one_host([4, 5, 6, 7], 6)
    assert sp_overlap.on_one_host([6, 7, 8, 9], 6) and not sp_overlap.on_one_host([10, 11, 12, 13], 6)
    assert not sp_overlap.on_one_host([0, 1], 0)
