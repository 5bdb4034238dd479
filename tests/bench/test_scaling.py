"""bench/scaling.py and bench/scaling_model.py on CPU: the bandwidth curves, collective and step times derived
by hand, and the project / validate commands on small result files written here (a single-GPU step, a DP=2
step, a bandwidth run). The measurement itself needs two GPUs (the gpu test at the end)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import scaling  # noqa: E402
from _common import markdown_table  # noqa: E402
from result_file import write_result  # noqa: E402
from scaling_model import GB, BusBandwidth, Case, ComputeRates, Network, Overlap, predict  # noqa: E402

from infir.model.qwen import get_size  # noqa: E402
from infir.train.comm_volume import DataParallel, Layout, rank_params  # noqa: E402

MODEL, SEQ = "qwen2.5-1.5b", 4096
SIZE = get_size(MODEL)
SHARES = {"attention": 0.2, "optimizer": 0.05, "gemm": 0.6, "elementwise/other": 0.15}


def _curves(gbs_small: float, gbs_large: float, ranks=(2,)) -> BusBandwidth:
    return BusBandwidth({(op, n): [(2**20, gbs_small), (2**30, gbs_large)]
                         for op in ("all_gather", "reduce_scatter", "all_reduce") for n in ranks})


def test_bus_bandwidth_interpolates_in_log_size_and_holds_its_ends():
    bw = _curves(100.0, 300.0, ranks=(2, 4))
    assert bw.gbs("all_reduce", 2, 2**25) == pytest.approx(200.0)  # halfway between 1 MiB and 1 GiB in log(size)
    assert bw.gbs("all_reduce", 2, 1) == 100.0 and bw.gbs("all_reduce", 2, 2**34) == 300.0
    bw = BusBandwidth({("all_gather", 2): [(1.0, 10.0)], ("all_gather", 4): [(1.0, 40.0)]})
    assert bw.gbs("all_gather", 8, 1e6) == 40.0 and bw.gbs("all_gather", 3, 1e6) == 10.0  # nearest group size below
    with pytest.raises(ValueError, match="all_reduce"):
        bw.gbs("all_reduce", 2, 1e6)


def test_collectives_inside_a_node_and_across_nodes():
    net = Network(BusBandwidth.flat(400.0), inter_gbs=50.0, gpus_per_node=8)
    S = 2**30
    assert net.seconds("all_reduce", S, 8, 1) == pytest.approx(S * 2 * 7 / 8 / (400 * GB))
    # 16 ranks on two nodes: each node's eight over NVLink, then each rank's eighth over its NIC to the other node
    assert net.seconds("all_gather", S, 16, 1) == pytest.approx(S * 7 / 8 / (400 * GB) + S / 8 * 1 / 2 / (50 * GB))
    # a DP group at TP=8 holds one rank a node: all of it crosses the network
    assert net.seconds("reduce_scatter", S, 4, 8) == pytest.approx(S * 3 / 4 / (50 * GB))
    assert net.seconds("all_reduce", S, 1, 1) == 0


def _case(layout: Layout, micro_batches: int = 4) -> Case:
    return Case(SIZE, SEQ, 2, micro_batches, layout)


def test_a_step_priced_from_itself_gives_back_its_compute():
    tokens = 2 * 4 * SEQ
    rates = ComputeRates.from_step(SIZE, SEQ, tokens, 700.0, Layout(), SHARES)
    net = Network(BusBandwidth.flat(100.0))
    alone = predict(_case(Layout()), rates, net, DataParallel(), Overlap())
    assert alone["step_ms"] == pytest.approx(700.0) and alone["efficiency"] == pytest.approx(1.0)
    assert alone["tokens/s per GPU"] == pytest.approx(tokens / 0.7)
    # a TP=2 step whose profile gives 10% to its collectives: compute is the other 90% of it
    shares = {"communication": 0.1, "attention": 0.2, "optimizer": 0.05}
    tp2 = ComputeRates.from_step(SIZE, SEQ, tokens, 400.0, Layout(tp=2), shares)
    assert predict(_case(Layout(tp=2)), tp2, net, DataParallel(), Overlap())["compute_ms"] == pytest.approx(360.0)
    with pytest.raises(ValueError, match="profile"):
        ComputeRates.from_step(SIZE, SEQ, tokens, 400.0, Layout(tp=2), None)


def test_data_parallel_time_is_exposed_unless_it_overlaps_and_then_only_its_excess():
    rates = ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, 700.0, Layout(), SHARES)
    P = rank_params(SIZE, 1)
    for gbs in (1000.0, 10.0):  # the gradient all-reduce well under, then well over, a micro-batch's backward
        net = Network(BusBandwidth.flat(gbs))
        ddp = DataParallel("ddp", grad_bytes=4, bucket_elems=math.ceil(P / 10))  # ten buckets
        exposed = predict(_case(Layout(dp=2)), rates, net, ddp, Overlap())
        assert exposed["dp_exposed_ms"] == pytest.approx(1e3 * 4 * P / (gbs * GB))  # 2(n-1)/n = 1 at n=2
        mb = 0.95 * 700.0 / 4  # one micro-batch of the step's compute (the optimizer's 5% aside)
        hidden = predict(_case(Layout(dp=2)), rates, net, ddp, Overlap(dp=True))
        last_bucket = exposed["dp_exposed_ms"] / 10
        assert hidden["dp_exposed_ms"] == pytest.approx(max(last_bucket, exposed["dp_exposed_ms"] - 2 / 3 * mb))
        assert hidden["efficiency"] == pytest.approx(hidden["compute_ms"] / hidden["step_ms"])
    one_bucket = DataParallel("ddp", bucket_elems=None)  # nothing to overlap: the one bucket is ready at the end
    assert predict(_case(Layout(dp=2)), rates, net, one_bucket, Overlap(dp=True))["dp_exposed_ms"] == pytest.approx(
        predict(_case(Layout(dp=2)), rates, net, one_bucket, Overlap())["dp_exposed_ms"])
    zero1 = predict(_case(Layout(dp=4)), rates, net, DataParallel("zero1"), Overlap())
    assert zero1["compute_ms"] == pytest.approx(0.95 * 700 + 0.05 * 700 / 4)  # each rank steps a quarter of the states


# ---------------------------------------------------------------------------------- the commands, on files
def _header(device: str, command: str) -> str:
    return (f"- device: {device}\n- torch 2.11.0+cu130, CUDA 13.0, triton 3.6.0, python 3.12.3\n"
            f"- command: `{command}`\n- date: 2026-01-01 10:00 UTC")


def _write(folder: Path, kind: str, title: str, device: str, sections: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join([f"## {title}", _header(device, f"python bench/x.py --out {kind}.md"), *sections]) + "\n"
    (folder / f"{kind}.md").write_text(text)
    write_result(folder / f"{kind}.md", text, commit=folder.name[-7:])


def _step(folder: Path, kind: str, ranks: int, accum: int, step_ms: float, shares: dict) -> None:
    row = {"model": MODEL, "precision": "bf16", "seq": SEQ, "mbs": 2, "accum": accum, "recompute": "none",
           "step_ms": step_ms, "tokens/s": round(2 * accum * SEQ / step_ms * 1e3)}
    prof = {"case": f"{MODEL} bf16 s{SEQ} none", **{k: f"{100 * v:.1f}%" for k, v in shares.items()}}
    _write(folder, kind, "Training step", "NVIDIA H100 80GB HBM3",
           [f"parallel: single, {ranks} rank(s); TFLOP/s and MFU per GPU", markdown_table([row]),
            "GPU time by kernel class (one step):\n\n" + markdown_table([prof])])


def _bandwidth(folder: Path, gbs: float) -> None:
    rows = [scaling.bandwidth_row(op, 2, mib * 2**20, mib * 2**20 * scaling.ring_factor(op, 2) / (gbs * GB))
            for op in ("all_gather", "reduce_scatter", "all_reduce") for mib in (1, 4, 16, 64, 256, 1024)]
    _write(folder, "scaling_bw_2gpu", "Collective bus bandwidth", "NVIDIA H100 80GB HBM3", ["2 GPUs", markdown_table(rows)])


@pytest.fixture()
def results(tmp_path) -> Path:
    """One GPU: 4 micro-batches in 700 ms; DP=2 at 8 micro-batches (4 a rank) in the model's own time for it
    (the same compute, then the FP32 gradient all-reduce at 200 GB/s, 2(n-1)/n = 1), so validate finds no
    error; and 200 GB/s measured at every size."""
    root = tmp_path / "results"
    _step(root / "2026-01-01-aaaaaaa", "step_1.5b", 1, 4, 700.0, SHARES)
    dp2_ms = 700.0 + 1e3 * 4 * rank_params(SIZE, 1) / (200.0 * GB)
    _step(root / "2026-01-01-aaaaaaa", "step_1.5b_dp2", 2, 8, dp2_ms, {**SHARES, "communication": 0.04})
    _bandwidth(root / "2026-01-01-aaaaaaa", 200.0)
    return root


def test_bandwidth_rows_follow_nccl_tests():
    row = scaling.bandwidth_row("all_reduce", 4, 2**30, 0.01)
    assert row["algbw_GB/s"] == pytest.approx(2**30 / 0.01 / 1e9)
    assert row["busbw_GB/s"] == pytest.approx(row["algbw_GB/s"] * 2 * 3 / 4) and row["size_MiB"] == 1024
    assert scaling.group_sizes(4) == [2, 4] and scaling.group_sizes(6) == [2, 4, 6]


def test_validate_prices_the_dp2_step_from_the_single_gpu_one(results, tmp_path):
    out = tmp_path / "out" / "scaling_validate.md"
    out.parent.mkdir()
    scaling.main(["validate", "--results", str(results), "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    rows = {r["GPUs"]: r for r in data["tables"][0]["rows"]}
    dp2 = rows[2]
    assert dp2["layout"] == "tp1xdp2" and dp2["inputs on its device"] == "yes"
    assert "step_1.5b)" in dp2["source"]
    assert abs(dp2["error_%"]) < 0.5  # printed to 3 digits: the model's own number comes back
    assert any(n.startswith("prediction error: 2+ GPUs") and "over 1 " in n for n in data["notes"])


def test_project_writes_rows_and_a_figure(results, tmp_path):
    out = tmp_path / "out" / "scaling.md"
    out.parent.mkdir()
    scaling.main(["project", "--results", str(results), "--out", str(out), "--layouts", f"{MODEL}:{SEQ}:tp1:none",
                  "qwen2.5-7b:4096:tp2:full", "--precisions", "bf16", "--gpus", "8", "16", "--global-tokens", str(64 * SEQ)])
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["tables"][0]["rows"]
    assert [(r["model"], r["GPUs"], r["micro-batches"]) for r in rows[:2]] == [(MODEL, 8, 8), (MODEL, 16, 4)]
    assert all(0 < r["efficiency"] <= 1 and r["efficiency, DP not overlapped"] <= r["efficiency"] for r in rows[:2])
    assert rows[2]["step_ms"].startswith("no measured step")  # nothing measured at recompute=full
    assert any(n.startswith("assumed: intra-node bus bandwidth measured in 2026-01-01-aaaaaaa/scaling_bw_2gpu")
               and "inter-node 50 GB/s per GPU" in n for n in data["notes"])
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, says", [
    (["project", "--results", "/nonexistent"], "--results /nonexistent: no such folder"),
    (["project", "--layouts", "qwen2.5-1.5b:8k:tp2:full"], "write MODEL:SEQ:tpN[cpM]:RECOMPUTE"),
    (["project", "--layouts", "qwen9:8192:tp2:full"], "model.name='qwen9' is not a known size"),
    (["validate", "--bandwidth", "/nonexistent.json"], "--bandwidth /nonexistent.json: no such file"),
])
def test_bad_input_fails_with_one_line(results, argv, says):
    argv = [*argv[:1], "--results", str(results), *argv[1:]] if "--results" not in argv else argv
    with pytest.raises(SystemExit) as e:
        scaling.main(argv)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_no_bandwidth_result_says_how_to_measure_one(results):
    (results / "2026-01-01-aaaaaaa" / "scaling_bw_2gpu.json").unlink()
    with pytest.raises(SystemExit, match="bench/scaling.py measure"):
        scaling.main(["validate", "--results", str(results)])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_measure_under_torchrun_writes_the_bandwidth_result(tmp_path):
    out = tmp_path / "scaling_bw_2gpu.md"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    str(REPO / "bench" / "scaling.py"), "measure", "--max-mib", "16", "--iters", "3", "--out", str(out)],
                   check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
                   timeout=600)
    rows = json.loads(out.with_suffix(".json").read_text())["tables"][0]["rows"]
    assert {(r["op"], r["ranks"]) for r in rows} == {(op, 2) for op in ("all_gather", "reduce_scatter", "all_reduce")}
    assert all(r["busbw_GB/s"] > 1 for r in rows) and sorted({r["size_MiB"] for r in rows}) == [1, 2, 4, 8, 16]
