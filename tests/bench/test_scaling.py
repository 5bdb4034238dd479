"""bench/scaling.py and bench/scaling_model.py on CPU: the bandwidth curves, collective and step times derived
by hand, and the project / validate commands on small result files written here (single-GPU steps, DP=2 steps
sharded and replicated, a bandwidth run). The measurement itself needs two GPUs (the gpu test at the end)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import scaling  # noqa: E402
from _common import markdown_table  # noqa: E402
from report import Run, is_number  # noqa: E402
from result_file import write_result  # noqa: E402
from scaling_model import (  # noqa: E402
    GB, BusBandwidth, Case, ComputeRates, Network, Overlap, comm_seconds, edge_params, predict, profiled_compute_ms,
    weight_quant_elems,
)

from infir.model.qwen import QwenSize, get_size  # noqa: E402
from infir.train.comm_volume import (  # noqa: E402
    BLOCK_SCALE_BYTES, DataParallel, Layout, cp_collectives, embedding_params, fp8_linear_params, rank_params,
)

MODEL, SEQ = "qwen2.5-1.5b", 4096
SIZE = get_size(MODEL)
P = rank_params(SIZE, 1)
EMB = embedding_params(SIZE, 1) / P  # the embedding's share of the parameters: its bucket is the last reduced, first gathered
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


def _case(layout: Layout, micro_batches: int = 4, size: QwenSize = SIZE) -> Case:
    return Case(size, SEQ, 2, micro_batches, layout)


def _rates(shares: dict | None = SHARES) -> ComputeRates:
    """One GPU, 4 micro-batches of 2 x SEQ in 700 ms."""
    return ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, 700.0, Layout(), shares, P)


def test_a_step_priced_from_itself_gives_back_its_compute():
    net = Network(BusBandwidth.flat(100.0))
    alone = predict(_case(Layout()), _rates(), net, DataParallel(), Overlap())
    assert alone["step_ms"] == pytest.approx(700.0) and alone["efficiency"] == pytest.approx(1.0)
    assert alone["tokens/s per GPU"] == pytest.approx(2 * 4 * SEQ / 0.7)
    assert predict(_case(Layout()), _rates(None), net, DataParallel(), Overlap())["step_ms"] == pytest.approx(700.0)
    # a TP=2 step whose profile gives 10% of its kernel time to collectives it waited on: compute is the rest
    shares = {"communication": 0.1, "attention": 0.2, "optimizer": 0.05, "gemm": 0.5}
    ms = profiled_compute_ms(400.0, shares)
    assert ms == pytest.approx(360.0)
    tp2 = ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, ms, Layout(tp=2), shares, rank_params(SIZE, 2))
    assert predict(_case(Layout(tp=2)), tp2, net, DataParallel(), Overlap())["compute_ms"] == pytest.approx(360.0)
    # collectives that ran beside compute: kernel time = compute + communication, the step waited only the exposed part
    assert profiled_compute_ms(400.0, {"communication": 0.3, "exposed communication": 0.05}) == pytest.approx(
        400.0 * 0.7 / 0.75)
    with pytest.raises(ValueError, match="profile"):
        ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, 400.0, Layout(tp=2), None, P)


def test_gemms_are_priced_by_flops_and_the_other_work_by_activation_elements():
    wide = QwenSize(hidden=2 * SIZE.hidden, layers=SIZE.layers, heads=SIZE.heads, kv_heads=SIZE.kv_heads,
                    ffn=2 * SIZE.ffn, vocab=SIZE.vocab, tied=SIZE.tied, max_positions=SIZE.max_positions)
    net = Network(BusBandwidth.flat(100.0))

    def compute(shares, size):
        return predict(_case(Layout(), size=size), _rates(shares), net, DataParallel(), Overlap())["compute_ms"]

    others = {"elementwise/other": 1.0, "gemm": 0.0}  # norms, activations, copies: twice the hidden, twice the time
    assert compute(others, wide) == pytest.approx(2 * compute(others, SIZE))
    from infir.train.flops import matmul_params

    gemms = {"gemm": 1.0}
    assert compute(gemms, wide) / compute(gemms, SIZE) == pytest.approx(matmul_params(wide) / matmul_params(SIZE))


def test_fp8_weight_quantization_is_priced_per_weight_element_quantized():
    """Where the profile names it, the weights' quantization is charged to the elements quantized: a step that
    quantizes them once (kept for the step) priced as one that does so at every forward and recompute of
    4 micro-batches pays it 8 times; the FP8 parameter gather's quantizes a rank's share once."""
    net = Network(BusBandwidth.flat(100.0))
    shares = {"gemm": 0.6, "attention": 0.2, "weight quantize": 0.1, "elementwise/other": 0.1}
    F = fp8_linear_params(SIZE, 1)
    kept = Case(SIZE, SEQ, 2, 4, Layout(), weight_passes=1)
    rates = ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, 700.0, Layout(), shares, P, weight_elems=F)
    assert rates.weight_quant_s_per_elem * F == pytest.approx(0.070)
    assert predict(kept, rates, net, DataParallel(), Overlap())["compute_ms"] == pytest.approx(700.0)
    per_forward = replace(kept, layout=Layout(recompute="full"), weight_passes=8)
    extra = predict(per_forward, rates, net, DataParallel(), Overlap())["compute_ms"] - 700.0
    assert extra == pytest.approx(7 * 70.0)
    gathered = DataParallel("zero1", fp8_params="amax")
    dp4 = replace(kept, layout=Layout(dp=4))
    assert weight_quant_elems(dp4, gathered) == pytest.approx(F / 4) and weight_quant_elems(dp4, DataParallel("zero1")) == F
    # without the count the class stays with the rest, priced per activation element as before
    assert ComputeRates.from_step(SIZE, SEQ, 2 * 4 * SEQ, 700.0, Layout(), shares, P).weight_quant_s_per_elem == 0


def _zero1(buckets: int = 10) -> DataParallel:
    return DataParallel("zero1", grad_bytes=4, param_bytes=4, bucket_elems=math.ceil(P / buckets), overlap=True)


def test_data_parallel_time_is_exposed_unless_it_overlaps_and_then_its_excess_and_contention():
    mb = 0.95 * 700.0 / 4  # one micro-batch of the step's compute (the optimizer's 5% aside)
    for gbs in (1000.0, 10.0):  # the gradient all-reduce well under, then well over, a micro-batch's backward
        net = Network(BusBandwidth.flat(gbs))
        total = 1e3 * 4 * P / (gbs * GB)  # all-reduce at n=2: 2(n-1)/n = 1
        ddp = DataParallel("ddp", grad_bytes=4, bucket_elems=math.ceil(P / 10))  # ten buckets, not overlapped
        exposed = predict(_case(Layout(dp=2)), _rates(), net, ddp, Overlap())
        assert exposed["dp_cost_ms"] == pytest.approx(total) and exposed["dp_hidden_ms"] == 0
        overlapped = DataParallel("ddp", grad_bytes=4, bucket_elems=math.ceil(P / 10), overlap=True)
        hidden = predict(_case(Layout(dp=2)), _rates(), net, overlapped, Overlap())
        shown = max(total * EMB, total - 2 / 3 * mb)  # at least the embedding's bucket, after the backward ends
        assert hidden["dp_cost_ms"] == pytest.approx(shown) and hidden["dp_hidden_ms"] == pytest.approx(total - shown)
        assert hidden["efficiency"] == pytest.approx(hidden["compute_ms"] / hidden["step_ms"])
        # what the hidden part takes from the compute beside it
        busy = predict(_case(Layout(dp=2)), _rates(), net, overlapped, Overlap(dp_contention=0.5))
        assert busy["dp_cost_ms"] == pytest.approx(shown + 0.5 * (total - shown))
    # ZeRO-1: reduce-scatter and all-gather, each (n-1)/n = 1/2 of the buffer; the gathers beside the step and next forward
    net = Network(BusBandwidth.flat(10.0))
    half = 1e3 * 4 * P / 2 / (10 * GB)
    zero1 = predict(_case(Layout(dp=2)), _rates(), net, _zero1(), Overlap())
    optimizer = 0.05 * 700 / 2
    assert zero1["compute_ms"] == pytest.approx(0.95 * 700 + optimizer)  # each rank steps half of the states
    assert zero1["dp_comm_ms"] == pytest.approx(2 * half)
    # the embedding's gather, its bucket stepped first, has the other buckets' steps beside it
    first = max(0.0, half * EMB - optimizer * (1 - EMB))
    assert zero1["dp_cost_ms"] == pytest.approx(max(half * EMB, half - 2 / 3 * mb) + max(first, half - optimizer - mb / 3))
    # the FP8 parameter gather starts once every bucket has stepped: the embedding's gather has nothing beside it
    fp8 = replace(_zero1(), fp8_params="amax")
    windows = predict(_case(Layout(dp=2), micro_batches=1000), _rates(), Network(BusBandwidth.flat(1000.0)), fp8, Overlap())
    edge = 1e3 * 4 * embedding_params(SIZE, 1) / 2 / (1000 * GB)  # its FP32 parameters, gathered as FP32 gradients go
    assert windows["dp_cost_ms"] == pytest.approx(2 * edge)


def test_the_bucket_no_overlap_hides_is_the_embeddings_or_a_larger_megatron_bucket():
    case = _case(Layout(dp=2))
    assert EMB > 1 / 10 and edge_params(case, _zero1(10)) == embedding_params(SIZE, 1)  # a bucket of its own
    assert edge_params(case, _zero1(2)) == pytest.approx(P / 2)  # buckets of 1M x DP elements outgrow it at scale
    assert edge_params(case, DataParallel("zero1")) == P  # one bucket: all of it
    assert edge_params(_case(Layout(tp=2, dp=2)), _zero1(20)) == embedding_params(SIZE, 2)  # vocab-parallel


def test_overlapped_collectives_across_nodes_contend_for_their_intra_node_time():
    net = Network(BusBandwidth.flat(400.0), inter_gbs=50.0, gpus_per_node=8)
    layout = Layout(dp=16)
    big = _case(layout, micro_batches=1000)  # windows far longer than the communication: all but a bucket hidden
    out = predict(big, _rates(), net, _zero1(), Overlap(dp_contention=1.0))
    B = 4 * P  # each phase's buffer: FP32 gradients, FP32 parameters
    wire = B * 7 / 8 / (400 * GB) + B / 8 * 1 / 2 / (50 * GB)  # eight a node over NVLink, then an eighth a rank across
    in_node = B * 15 / 16 / (400 * GB)  # the same bytes were the sixteen ranks in one node
    assert out["dp_comm_ms"] == pytest.approx(1e3 * 2 * wire)
    optimizer = 0.05 * 0.700 / 16  # s: each rank steps a sixteenth of the states
    shown = (wire * EMB, max(0.0, wire * EMB - optimizer * (1 - EMB)))  # the embedding's bucket, each way
    hidden = sum(in_node * (1 - s / wire) for s in shown)
    assert out["dp_hidden_ms"] == pytest.approx(1e3 * hidden)
    assert out["dp_cost_ms"] == pytest.approx(1e3 * (sum(shown) + hidden))


# ---------------------------------------------------------------------------------- the commands, on files
def _header(device: str, command: str) -> str:
    return (f"- device: {device}\n- torch 2.11.0+cu130, CUDA 13.0, triton 3.6.0, python 3.12.3\n"
            f"- command: `{command}`\n- date: 2026-01-01 10:00 UTC")


def _write(folder: Path, kind: str, title: str, device: str, sections: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join([f"## {title}", _header(device, f"python bench/x.py --out {kind}.md"), *sections]) + "\n"
    (folder / f"{kind}.md").write_text(text)
    write_result(folder / f"{kind}.md", text, commit=folder.name[-7:])


def _step(folder: Path, kind: str, ranks: int, cases: dict[str, tuple[float, dict]], parallel: str = "single") -> None:
    """bench/step.py's result: each case (precision: (step_ms, profile shares)) at 4 micro-batches of 2 x SEQ a
    rank (`accum`, as bench/step.py now counts it)."""
    tp = 2 if parallel == "tp2" else 1
    rows = [{"model": MODEL, "precision": prec, "seq": SEQ, "mbs": 2, "accum": 4, "recompute": "none", "step_ms": ms,
             "tokens/s": round(2 * 4 * ranks // tp * SEQ / ms * 1e3)} for prec, (ms, _) in cases.items()]
    prof = [{"case": f"{MODEL} {prec} s{SEQ} none", **{k: f"{100 * v:.1f}%" for k, v in shares.items()}}
            for prec, (_, shares) in cases.items()]
    _write(folder, kind, "Training step", "NVIDIA H100 80GB HBM3",
           [f"parallel: {parallel}, {ranks} rank(s); TFLOP/s and MFU per GPU", markdown_table(rows),
            "GPU time by kernel class (one step):\n\n" + markdown_table(prof)])


def _bandwidth(folder: Path, gbs: float) -> None:
    rows = [scaling.bandwidth_row(op, 2, mib * 2**20, mib * 2**20 * scaling.ring_factor(op, 2) / (gbs * GB))
            for op in ("all_gather", "reduce_scatter", "all_reduce") for mib in (1, 4, 16, 64, 256, 1024)]
    _write(folder, "scaling_bw_2gpu", "Collective bus bandwidth", "NVIDIA H100 80GB HBM3", ["2 GPUs", markdown_table(rows)])


REPLICATED = "+optimizer.distributed=false,optimizer.overlap_grad_reduce=false"
WIRE_MS = 1e3 * 4 * P / (200.0 * GB)  # the FP32 gradients' all-reduce at 200 GB/s (2(n-1)/n = 1 at n=2); ZeRO-1's
CONTENTION = 0.5  # reduce-scatter and all-gather (n-1)/n = 1/2 each


def _zero1_ms(contention: float) -> float:
    """The DP=2 ZeRO-1 step, by hand: the compute less half the optimizer; the embedding's gradient bucket
    exposed, and its parameters' gather less the other buckets' steps beside it; the rest of both phases
    hidden, at `contention` of its time."""
    optimizer = 0.05 * 700 / 2
    grads = WIRE_MS / 2 * EMB
    params = max(0.0, grads - optimizer * (1 - EMB))
    return 0.95 * 700 + optimizer + grads + params + contention * (WIRE_MS - grads - params)


def _kernel_shares(compute: dict, comm: float, exposed: float) -> dict:
    """A profile's shares of kernel time: the compute's fractions beside `comm` of collectives."""
    return {**{k: v * (1 - comm) for k, v in compute.items()}, "communication": comm, "exposed communication": exposed}


@pytest.fixture()
def results(tmp_path) -> Path:
    """One GPU: 4 micro-batches in 700 ms, BF16 and FP8; DP=2 at 4 micro-batches a rank in the model's own time
    for each (sharded: _zero1_ms at CONTENTION; replicated: the same compute, then the gradient all-reduce), so
    validate finds no error; and 200 GB/s measured at every size."""
    root = tmp_path / "results" / "2026-01-01-aaaaaaa"
    _step(root, "step_1.5b", 1, {"bf16": (700.0, SHARES), "fp8_blockwise_ue8m0": (700.0, SHARES)})
    sharded = {k: v * 700 / (0.95 * 700 + 0.05 * 350) for k, v in {**SHARES, "optimizer": 0.025}.items()}
    z1 = (_zero1_ms(CONTENTION), _kernel_shares(sharded, 0.2, 0.01))
    _step(root, "step_1.5b_dp2", 2, {"bf16": z1, "fp8_blockwise_ue8m0": z1,
                                     "bf16" + REPLICATED: (700.0 + WIRE_MS, _kernel_shares(SHARES, 0.04, 0.04))})
    _bandwidth(root, 200.0)
    return root.parent


def test_micro_batches_come_from_each_rows_own_figures():
    run = Run("step", Path("x"), {"device": "H100"}, [], [])
    row = {"model": MODEL, "precision": "bf16", "seq": SEQ, "mbs": 2, "recompute": "none", "step_ms": 700.0,
           "tokens/s": round(2 * 2 * 4 * SEQ / 0.7)}  # DP=2, 4 micro-batches of 2 x SEQ on each rank
    for accum in (8, 4):  # bench/step.py's accum: all ranks' micro-batches before, each rank's now
        assert scaling.Measured(run, {**row, "accum": accum}, Layout(dp=2), "bf16", None).micro_batches == 4
    assert scaling.Measured(run, {**row, "tokens/s": round(2 * 2 * 4.5 * SEQ / 0.7)}, Layout(dp=2), "bf16",
                            None).micro_batches is None  # no whole number: not priced


def test_a_case_is_what_a_gpu_computes():
    """Overrides that pick the layout, the data-parallel communication or the default optimizer compute the
    same step: a measured case with them prices, and is priced by, the plain one."""
    assert scaling.default_optimizer() == "adamw"
    assert scaling.case_of("bf16+optimizer=adamw,parallel.cp=2") == "bf16"
    assert scaling.case_of("fp8_blockwise_ue8m0+optimizer.distributed=false") == "fp8_blockwise_ue8m0"
    assert scaling.case_of("fp8_blockwise_ue8m0+optimizer.fp8_param_gather=true") != "fp8_blockwise_ue8m0"  # its quantizing
    assert scaling.case_of("bf16+optimizer=flash_adamw") == "bf16+optimizer=flash_adamw"


def test_an_fp8_step_is_priced_from_a_profile_that_times_its_weight_quantizers_apart():
    """A profile that counts the FP8 weights' quantizers with the per-token ones would price them per token at
    another length: an FP8 case takes a source that times them apart before one of a nearer length; BF16,
    which quantizes no weights, keeps the nearest length."""
    run = Run("step", Path("x"), {"device": "H100", "date": "2026-01-01 10:00"}, [], [])

    def source(precision: str, seq: int, shares: dict) -> scaling.Measured:
        row = {"model": MODEL, "precision": precision, "seq": seq, "mbs": 1, "accum": 2, "recompute": "none",
               "step_ms": 500.0, "tokens/s": round(2 * seq / 0.5)}
        return scaling.Measured(run, row, Layout(), precision, shares)

    old = {**SHARES, "quantize": 0.05}
    new = {**old, "weight quantize": 0.01}
    for precision, want in (("fp8_blockwise_ue8m0", 8192), ("bf16", SEQ)):
        pool = [source(precision, SEQ, old), source(precision, 8192, new)]
        assert scaling.pick_source(pool, MODEL, SEQ, Layout(), precision, "H100").row["seq"] == want


def test_bandwidth_rows_follow_nccl_tests():
    row = scaling.bandwidth_row("all_reduce", 4, 2**30, 0.01)
    assert row["algbw_GB/s"] == pytest.approx(2**30 / 0.01 / 1e9)
    assert row["busbw_GB/s"] == pytest.approx(row["algbw_GB/s"] * 2 * 3 / 4) and row["size_MiB"] == 1024
    assert scaling.group_sizes(4) == [2, 4] and scaling.group_sizes(6) == [2, 4, 6]


def _validate(results: Path, tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "out" / "scaling_validate.md"
    out.parent.mkdir(exist_ok=True)
    scaling.main(["validate", "--results", str(results), "--out", str(out), *argv])
    return json.loads(out.with_suffix(".json").read_text())


def test_validate_prices_each_dp2_step_by_its_own_data_parallelism_from_the_single_gpu_one(results, tmp_path):
    data = _validate(results, tmp_path)
    rows = {(r["GPUs"], r["precision"]): r for r in data["tables"][0]["rows"]}
    sharded, replicated = rows[(2, "bf16")], rows[(2, "bf16" + REPLICATED)]
    assert sharded["data parallel"].startswith("ZeRO-1 (FP32 gradients reduce-scattered, FP32 parameters all-gathered")
    assert replicated["data parallel"] == "DDP (FP32 gradients all-reduced, not overlapped)"
    for r in (sharded, replicated, rows[(2, "fp8_blockwise_ue8m0")]):
        assert r["layout"] == "tp1xdp2" and r["mbs x micro-batches"] == "2x4" and r["inputs on its device"] == "yes"
        assert "step_1.5b)" in r["source"]  # the one-GPU twin
        assert abs(r["error_%"]) < 0.5  # printed to 3 digits: the model's own number comes back
    # each ZeRO-1 step's contention is the other's: measured without the step it prices
    assert sharded["dp_contention"] == pytest.approx(CONTENTION, abs=0.03) and replicated["dp_contention"] is None
    assert any(n.startswith("prediction error: 2+ GPUs") and "over 3 " in n for n in data["notes"])


def test_a_dp2_step_prices_the_single_gpu_one_with_its_communication_taken_out(results, tmp_path):
    rows = {(r["GPUs"], r["precision"]): r for r in _validate(results, tmp_path)["tables"][0]["rows"]}
    one = rows[(1, "bf16")]
    assert "step_1.5b_dp2)" in one["source"] and one["source"].startswith(f"{MODEL} s{SEQ} bf16 (")  # ZeRO-1, the default
    assert abs(one["error_%"]) < 0.5 and one["dp_cost_ms"] == 0
    # priced with its communication left in, the single-GPU step would come out slower by the DP=2 step's excess
    assert one["predicted_ms"] < 700 + 0.5 * (_zero1_ms(CONTENTION) - 0.95 * 700 - 0.05 * 350)


def test_contention_comes_from_the_steps_that_accumulate_as_the_priced_one_does():
    """Steps of one micro-batch per rank a step show more contention than those that accumulate: each is priced
    from its kind, or from every pair where none of its kind was measured."""
    from types import SimpleNamespace

    def pair(micro: int, figure: float) -> tuple:
        step = SimpleNamespace(micro_batches=micro, device="NVIDIA H200", row={"precision": f"bf16 a{micro}"})
        return step, SimpleNamespace(), figure

    pairs = [pair(1, 0.8), pair(1, 0.6), pair(4, 0.2)]
    one, line = scaling.measured_contention(pairs, "H200", micro_batches=1)
    assert one == pytest.approx(0.7) and "DP steps of one micro-batch per rank a step" in line
    several, line = scaling.measured_contention(pairs, "H200", micro_batches=8)
    assert several == pytest.approx(0.2) and "DP steps of several micro-batches" in line
    left, line = scaling.measured_contention(pairs, "H200", leave_out=pairs[2][0], micro_batches=4)
    assert left == pytest.approx(0.7) and line.startswith("measured: DP steps against")  # none of its kind left
    assert scaling.measured_contention(pairs, "H200")[0] == pytest.approx(1.6 / 3)


def test_without_a_second_measured_pair_the_overlap_is_free(results, tmp_path):
    data = _validate(results, tmp_path, "--dp-contention", "0")
    rows = {(r["GPUs"], r["precision"]): r for r in data["tables"][0]["rows"]}
    expected = 100 * (_zero1_ms(0.0) - _zero1_ms(CONTENTION)) / _zero1_ms(CONTENTION)
    assert rows[(2, "bf16")]["error_%"] == pytest.approx(expected, abs=0.3)
    assert any("contention with compute: --dp-contention" in n for n in data["notes"])


def test_tp_overlap_takes_its_share_of_tp_communication_only():
    net = Network(_curves(200.0, 200.0, ranks=(2, 4)), 50.0, 8)
    ms = {h: predict(_case(Layout(tp=2, cp=2)), _rates(), net, DataParallel(), Overlap(tp_hidden=h))["tp_cp_comm_ms"]
          for h in (0.0, 0.5, 1.0)}
    cp_ms = 1e3 * 4 * comm_seconds(cp_collectives(SIZE, SEQ, 2, Layout(tp=2, cp=2)), Layout(tp=2, cp=2), net)
    assert cp_ms > 0 and ms[1.0] == pytest.approx(cp_ms)  # all of TP's hidden, none of CP's
    assert ms[0.0] > ms[1.0] and ms[0.5] == pytest.approx((ms[0.0] + ms[1.0]) / 2)


def test_validate_prices_an_overlapped_tp_step_with_the_hidden_share_of_the_other_pairs(results, tmp_path):
    """Two TP=2 pairs, with and without parallel.tp_comm_overlap: each overlapped step gives back the share of
    the model's TP communication its twin's time exceeds it by, and validate prices each with the other's."""
    off, on = "+parallel.tp_comm_overlap=false", "+parallel.tp_comm_overlap=true"
    root = results / "2026-01-01-aaaaaaa"
    comm = 40.0  # ms; the overlaps take a half and a quarter of it off (whole ms: the steps print to 3 digits)
    _step(root, "step_tp2", 2, {"bf16" + on: (800.0 - 0.5 * comm, SHARES), "bf16" + off: (800.0, SHARES),
                                "fp8_blockwise_ue8m0" + on: (800.0 - 0.25 * comm, SHARES),
                                "fp8_blockwise_ue8m0" + off: (800.0, SHARES)}, parallel="tp2")
    runs = scaling.model_runs(scaling.parser().parse_args(["validate", "--results", str(results)]))
    records = scaling.step_records(runs)
    nets = scaling.device_networks(scaling.parser().parse_args(["validate", "--results", str(results)]), runs, records)
    pairs = scaling.tp_overlap_pairs(records, nets)
    assert sorted(m.row["precision"] for m, _, _ in pairs) == ["bf16" + on, "fp8_blockwise_ue8m0" + on]
    model_ms = {m.row["precision"]: predict(m.priced(), twin.rates(nets[m.device][0], 0.0), nets[m.device][0], m.dp,
                                            Overlap())["tp_cp_comm_ms"] for m, twin, _ in pairs}
    shares = {m.row["precision"]: h for m, _, h in pairs}
    assert shares["bf16" + on] == pytest.approx(min(1.0, 0.5 * comm / model_ms["bf16" + on]))
    assert shares["fp8_blockwise_ue8m0" + on] == pytest.approx(min(1.0, 0.25 * comm / model_ms["fp8_blockwise_ue8m0" + on]))
    data = _validate(results, tmp_path)
    rows = {r["precision"]: r for r in data["tables"][0]["rows"] if r["layout"] == "tp2xdp1"}
    assert rows["bf16" + on]["tp_hidden"] == pytest.approx(shares["fp8_blockwise_ue8m0" + on], abs=1e-3)
    assert rows["fp8_blockwise_ue8m0" + on]["tp_hidden"] == pytest.approx(shares["bf16" + on], abs=1e-3)
    assert rows["bf16" + off]["tp_hidden"] is None  # the twins ran without the overlap
    one_gpu = next(r for r in data["tables"][0]["rows"] if r["GPUs"] == 1 and r["precision"] == "bf16")
    assert f"bf16{off} (" in one_gpu["source"]  # the TP=2 twin, never the overlapped step: its profile hides its wait
    assert any("TP communication: each overlapped step's hidden share" in n for n in data["notes"])


def _measured(seq: int, recompute: str = "none", device: str = "NVIDIA H200", shares: dict | None = SHARES):
    """A one-GPU step of 4 micro-batches of 2 x seq in 700 ms."""
    run = Run("step", Path("x"), {"device": device}, [], [])
    row = {"model": MODEL, "precision": "bf16", "seq": seq, "mbs": 2, "accum": 4, "recompute": recompute,
           "step_ms": 700.0, "tokens/s": 2 * 4 * seq / 0.7}
    return scaling.Measured(run, row, Layout(recompute=recompute), "bf16", shares)


def test_attention_runs_at_the_flop_rate_its_profile_shows_a_recomputed_forward_included():
    from scaling_model import attention_flops

    plain, full = scaling.attention_rates([_measured(SEQ), _measured(SEQ, "full")])
    assert plain[1] == pytest.approx(2 * 4 * SEQ * attention_flops(SIZE, SEQ) / (0.7 * SHARES["attention"]))
    assert full[1] == pytest.approx(plain[1] * 4.5 / 3.5)  # the same time did one more attention forward
    assert scaling.attention_rates([_measured(SEQ, shares=None)]) == []  # no profile: no attention time
    packed = _measured(SEQ)
    packed.row["precision"] = "bf16+data.synthetic_doc_median=2048"  # documents: less than causal attention
    assert scaling.attention_rates([packed]) == []


def test_attention_is_priced_at_the_flop_rate_measured_at_the_length_it_runs():
    short, long, other = _measured(4096), _measured(32768), _measured(8192, device="NVIDIA H100 80GB HBM3")
    rates = [(short, 350.0), (long, 460.0), (other, 999.0)]
    assert scaling.attention_rate_at(rates, 4096, "H200") == 350.0
    assert scaling.attention_rate_at(rates, 8192, "H200") == pytest.approx(350.0 + 110.0 / 3)  # log-linear: a third
    assert scaling.attention_rate_at(rates, 65536, "H200") == 460.0 and scaling.attention_rate_at(rates, 2048, "H200") == 350.0
    assert scaling.attention_rate_at(rates, 8192, "H100") == 999.0  # its own device's, where measured
    assert scaling.attention_rate_at(rates, 32768, "H200", leave_out=long) == 350.0
    base = _rates()
    priced = scaling.at_length(base, short, 32768, "H200", rates)
    assert priced.attention_s_per_flop == pytest.approx(base.attention_s_per_flop * 350.0 / 460.0)
    assert priced.dense_s_per_flop == base.dense_s_per_flop
    assert scaling.at_length(base, short, 4096, "H200", rates) is base


def test_a_steps_tp_overlap_is_its_own_record_else_its_override():
    run = Run("step", Path("x"), {"device": "H100"}, [], [])

    def overlapped(row: dict) -> bool:
        return scaling.Measured(run, {"precision": "bf16", **row}, Layout(tp=2), "bf16", None).tp_overlap

    assert overlapped({"tp_comm_overlap": "True"}) and not overlapped({"tp_comm_overlap": "False"})
    assert overlapped({"precision": "bf16+parallel.tp_comm_overlap=true"}) and not overlapped({})
    assert not overlapped({"precision": "bf16+parallel.tp_comm_overlap=true", "tp_comm_overlap": "False"})  # TP=1


def _project(results: Path, tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "out" / "scaling.md"
    out.parent.mkdir(exist_ok=True)
    scaling.main(["project", "--results", str(results), "--out", str(out), "--global-tokens", str(64 * SEQ), *argv])
    return json.loads(out.with_suffix(".json").read_text())


def test_project_writes_rows_and_a_figure(results, tmp_path):
    data = _project(results, tmp_path, "--layouts", f"{MODEL}:{SEQ}:tp1:none", "qwen2.5-7b:4096:tp2:full",
                    "--precisions", "bf16", "--gpus", "8", "16")
    rows = data["tables"][0]["rows"]
    assert [(r["model"], r["GPUs"], r["micro-batches"]) for r in rows[:2]] == [(MODEL, 8, 8), (MODEL, 16, 4)]
    assert all(0 < r["efficiency"] <= 1 and r["dp_cost_ms"] > 0 for r in rows[:2])
    assert all("step_1.5b)" in r["source"] for r in rows[:2])  # the one-GPU step, not the DP=2 ones
    assert rows[2]["step_ms"].startswith("no measured step")  # nothing measured at recompute=full
    assumed = next(n for n in data["notes"] if n.startswith("assumed: intra-node bus bandwidth measured in "
                                                            "2026-01-01-aaaaaaa/scaling_bw_2gpu"))
    assert "inter-node 50 GB/s per GPU" in assumed
    assert "bf16: ZeRO-1 (FP32 gradients reduce-scattered, BF16 parameters all-gathered, overlapped)" in assumed
    # both DP=2 ZeRO-1 steps, at 3 printed digits; they accumulate, so a step of one micro-batch takes theirs too
    several = re.search(r"at several ([\d.]+) \(measured: DP steps of several micro-batches per rank a step against "
                        r"their one-GPU twins", assumed)
    one = re.search(r"at one micro-batch per rank a step ([\d.]+) \(measured: DP steps against their one-GPU twins",
                    assumed)
    assert float(several.group(1)) == float(one.group(1)) == pytest.approx(CONTENTION, abs=0.03)
    assert (tmp_path / "out" / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_a_batch_that_does_not_split_over_the_ranks_rounds_up_to_whole_micro_batches_per_rank(results, tmp_path):
    assert scaling.micro_batches(128 * 32768, 32768, 256) == 1  # 128 rows for 256 ranks: one each, 256 rows
    assert scaling.micro_batches(64 * SEQ, SEQ, 24) == 3 and scaling.micro_batches(64 * SEQ, SEQ, 8) == 8
    data = _project(results, tmp_path, "--layouts", f"{MODEL}:{SEQ}:tp1:none", "--precisions", "bf16",
                    "--gpus", "8", "24", "128")
    rows = data["tables"][0]["rows"]
    assert [(r["micro-batches"], r["tokens a step"]) for r in rows] == [(8, 64 * SEQ), (3, 72 * SEQ), (1, 128 * SEQ)]
    assert all(is_number(r["step_ms"]) for r in rows)
    assert any(n.startswith("batch: ") and "rounds up to the next whole one per rank" in n for n in data["notes"])


def test_project_takes_each_cases_optimizer_and_fp8_parameter_gather_as_an_option(results, tmp_path):
    argv = ["--layouts", f"{MODEL}:{SEQ}:tp1:none", "--gpus", "8"]
    notes = _project(results, tmp_path, *argv, "--precisions", "fp8_blockwise_ue8m0", "bf16+optimizer=flash_adamw",
                     "bf16" + REPLICATED)["notes"]
    # FP32 masters under BF16 autocast cross as BF16, but the FP8 linears' weights, quantized from FP32 on each rank
    assert "fp8_blockwise_ue8m0: ZeRO-1 (FP32 gradients reduce-scattered, BF16 (FP8 linear weights 32-bit) parameters" \
        in notes[0]
    assert "bf16+optimizer=flash_adamw: ZeRO-1 (FP32 gradients reduce-scattered, BF16 parameters" in notes[0]
    assert f"bf16{REPLICATED}: DDP (FP32 gradients all-reduced, not overlapped)" in notes[0]
    data = _project(results, tmp_path, *argv, "--precisions", "fp8_blockwise_ue8m0", "bf16", "--fp8-param-gather", "scales")
    fp8_row, bf16_row = data["tables"][0]["rows"]
    assert any(n.startswith("FP8 param gather") and "E4M3 bytes with one FP32 scale per 128x128 block" in n
               for n in data["notes"])
    # eight ranks: each sends 7/8 of the FP32 gradients, then of the parameters: the FP8 linears' E4M3 bytes and
    # block scales, the rest (FP32 masters, BF16 autocast) as BF16
    F = fp8_linear_params(SIZE, 1)
    gathered = F * (1 + BLOCK_SCALE_BYTES) + 2 * (P - F)
    assert fp8_row["dp_comm_ms, FP8 param gather"] == pytest.approx(1e3 * (4 * P + gathered) * 7 / 8 / (200 * GB), rel=0.01)
    assert fp8_row["dp_comm_ms"] == pytest.approx(1e3 * (4 * P + 4 * F + 2 * (P - F)) * 7 / 8 / (200 * GB), rel=0.01)
    assert fp8_row["efficiency, FP8 param gather"] >= fp8_row["efficiency"]
    assert bf16_row.get("step_ms, FP8 param gather") is None  # BF16 weights: nothing to gather in FP8
    row = _project(results, tmp_path, *argv, "--precisions", "fp8_blockwise_ue8m0")[  # the trainer's: amax
        "tables"][0]["rows"][0]
    amax = F * BLOCK_SCALE_BYTES * 2  # all-reduced: 2(n-1)/n of the buffer
    assert row["dp_comm_ms, FP8 param gather"] == pytest.approx(
        1e3 * (4 * P + F + 2 * (P - F) + amax) * 7 / 8 / (200 * GB), rel=0.01)


@pytest.mark.parametrize("argv, says", [
    (["project", "--results", "/nonexistent"], "--results /nonexistent: no such folder"),
    (["project", "--layouts", "qwen2.5-1.5b:8k:tp2:full"], "write MODEL:SEQ:tpN[cpM]:RECOMPUTE"),
    (["project", "--layouts", "qwen9:8192:tp2:full"], "model.name='qwen9' is not a known size"),
    (["validate", "--bandwidth", "/nonexistent.json"], "--bandwidth /nonexistent.json: no such file"),
    (["project", "--precisions", "bf16+optimizer.grad_reduce_dtype=fp16"], "optimizer.grad_reduce_dtype='fp16' is not valid"),
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
