"""bench/report.py on CPU: the page it builds from result files (newest run per row, ratios from the run that
printed them, each row's command), its --check, and the result files bench/_common.emit writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import report  # noqa: E402
from _common import emit, markdown_table  # noqa: E402
from result_file import write_result  # noqa: E402

STEP_TITLE = "Training step, infir trainer (megatron-core GPTModel, SDPA attention)"


def _header(date: str, command: str) -> str:
    return (f"- device: NVIDIA H100 80GB HBM3\n- torch 2.11.0+cu130, CUDA 13.0, triton 3.6.0, python 3.12.3\n"
            f"- command: `{command}`\n- date: {date} UTC")


def _step_row(precision: str, step_ms: float, tokens: int, mfu: float, mem: float, held: float | None = None) -> dict:
    """A step row; `held`: the reserved peak newer runs record beside the allocated one (`mem`)."""
    return {"model": "qwen2.5-1.5b", "precision": precision, "seq": 4096, "mbs": 2, "accum": 4, "recompute": "none",
            "step_ms": step_ms, "tokens/s": tokens, "TFLOP/s": 461.0, "MFU(spec)": mfu, "peak_mem_GiB": mem,
            **({"peak_reserved_GiB": held} if held is not None else {})}


def _write_step(folder: Path, date: str, rows: list[dict], ratios: list[dict], peers: list[dict],
                layout: str = "single, 1 rank(s)") -> None:
    sections = [f"parallel: {layout}; TFLOP/s and MFU per GPU", markdown_table(rows),
                "FP8 vs BF16, same run:\n\n" + markdown_table(ratios)]
    if peers:
        sections.append("infir vs the HF transformers peers (bench/hf_peer.py), same run:\n\n" + markdown_table(peers))
    text = "\n\n".join([f"## {STEP_TITLE}", _header(date, f"python bench/step.py --seq 4096 --tag {date[-5:]}"),
                        *sections]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step_1.5b.md").write_text(text)
    write_result(folder / "step_1.5b.md", text, commit=folder.name.rsplit("-", 1)[-1])


def _ratio(precision: str, speedup: float, memory: float = 0.619) -> dict:
    return {"model": "qwen2.5-1.5b", "seq": 4096, "recompute": "none", "precision": precision, "bf16 base": "bf16",
            "speedup vs bf16": speedup, "Amdahl ceiling": 1.19, "% of ceiling": 100 * speedup / 1.19,
            "memory vs bf16": memory}


def _results(root: Path) -> Path:
    """An older run (every recipe, an HF peer) and a newer one (BF16 and one FP8 recipe), plus a kernel kind
    measured twice and a parity run with its figure."""
    old = root / "2026-01-01-aaaaaaa"
    _write_step(old, "2026-01-01 10:00", [_step_row("bf16", 750.0, 43700, 0.45, 46.2),
                                          _step_row("fp8_blockwise_ue8m0", 700.0, 46800, 0.48, 40.1),
                                          _step_row("fp8_blockwise_fp32", 770.0, 42400, 0.44, 29.1),
                                          _step_row("moss", 820.0, 39900, 0.41, 42.7),
                                          _step_row("hf_bf16", 790.0, 41500, 0.43, 56.3)],
                [_ratio("fp8_blockwise_ue8m0", 1.07), _ratio("fp8_blockwise_fp32", 0.95, 0.63), _ratio("moss", 0.915)],
                [{"model": "qwen2.5-1.5b", "seq": 4096, "recompute": "none", "infir precision": "bf16",
                  "HF peer": "hf_bf16", "tokens/s vs peer": 1.05}])
    new = root / "2026-01-02-bbbbbbb"
    _write_step(new, "2026-01-02 10:00", [_step_row("bf16", 745.0, 44000, 0.459, 46.2, 47.3),
                                          _step_row("fp8_blockwise_ue8m0", 614.0, 53333, 0.556, 28.6, 40.3)],
                [_ratio("fp8_blockwise_ue8m0", 1.21, 0.852)], [])
    for folder, date, ms in ((old, "2026-01-01 11:00", 0.5), (new, "2026-01-02 11:00", 0.25)):
        text = "\n\n".join(["## FP8 linear fwd+bwd", _header(date, "python bench/linear.py --cuda-graph"),
                            "### summed over the shapes", markdown_table([{"recipe": "fp8", "summed ms": ms}])]) + "\n"
        write_result(folder / "linear_graph.md", text, commit=folder.name[-7:])
    text = "\n\n".join(["## Loss parity, FP8 recipes vs BF16", _header("2026-01-02 12:00", "python bench/parity.py"),
                        markdown_table([{"recipe": "moss", "gap vs bf16 (%)": -0.25}])]) + "\n"
    write_result(new / "parity.md", text, commit="bbbbbbb")
    (new / "parity.png").write_bytes(b"\x89PNG")
    return root


def test_a_table_has_every_rows_columns_when_the_first_row_failed():
    rows = [{"precision": "bf16", "step_ms": "OOM", "left_allocated_GiB": 56.9},
            {"precision": "fp8_blockwise_ue8m0", "step_ms": 7860.0, "tokens/s": 8335}]
    header, _, first, second = markdown_table(rows).splitlines()
    assert header == "| precision | step_ms | left_allocated_GiB | tokens/s |"
    assert first == "| bf16 | OOM | 56.9 |  |" and second == "| fp8_blockwise_ue8m0 | 7.86e+03 |  | 8335 |"


def test_page_takes_each_row_from_its_newest_run(tmp_path):
    page = report.render(_results(tmp_path / "results"), tmp_path / "BENCHMARKS.md")
    lines = page.splitlines()
    assert "### qwen2.5-1.5b, one GPU, NVIDIA H100 80GB HBM3" in lines
    runs = {ln.split("**")[1]: ln for ln in lines if ln.startswith("- **")}
    new = next(k for k, ln in runs.items() if "2026-01-02 10:00 UTC, commit bbbbbbb" in ln)
    old = next(k for k, ln in runs.items() if "2026-01-01 10:00 UTC, commit aaaaaaa" in ln)
    assert "`python bench/step.py --seq 4096 --tag 10:00`" in runs[new]  # the command that reproduces the rows
    # BF16 and ue8m0 from the newer run, with that run's ratio (1.21) and MFU in percent, and the peaks the GPU
    # held; moss and the peer only in the older run, with the ratio that run printed and its allocated peak, which
    # fp8_blockwise_fp32 (CUDA-graphed layers, whose pool that peak misses) is not shown with
    assert f"| 4096 | none | bf16 | 745 | 44000 | 461 |  | 45.9% |  |  |  | 47.3 | {new} |" in lines
    assert f"| 4096 | none | fp8_blockwise_ue8m0 | 614 | 53333 | 461 |  | 55.6% | 1.21 | 102 | 0.852 | 40.3 | {new} |" in lines
    assert f"| 4096 | none | moss | 820 | 39900 | 461 |  | 41.0% | 0.915 | 76.9 | 0.619 | 42.7 | {old} |" in lines
    assert f"| 4096 | none | fp8_blockwise_fp32 | 770 | 42400 | 461 |  | 44.0% | 0.95 | 79.8 |  |  | {old} |" in lines
    assert f"| 4096 | bf16 | hf_bf16 | 1.05 | {old} |" in lines
    assert not any("| 700 |" in ln for ln in lines)  # the older ue8m0 row is replaced
    assert "| fp8 | 0.25 |" in lines and "| fp8 | 0.5 |" not in lines  # the newest linear_graph run only
    assert "![parity](results/2026-01-02-bbbbbbb/parity.png)" in lines
    assert "| moss | -0.25 |" in lines


def test_no_ratio_against_a_bf16_base_its_run_says_a_later_fix_changed(tmp_path):
    folder = tmp_path / "results" / "2026-01-01-aaaaaaa"
    base = "bf16+parallel.tp_comm_overlap=true"
    fp8 = "fp8_blockwise_ue8m0+parallel.tp_comm_overlap=true"
    _write_step(folder, "2026-01-01 10:00", [_step_row(base, 800.0, 41000, 0.45, 46.2), _step_row(fp8, 650.0, 50400, 0.5, 40.1)],
                [{**_ratio(fp8, 1.23), "bf16 base": base}], [])
    data = json.loads((folder / "step_1.5b.json").read_text())
    lines = report.render(folder.parent, tmp_path / "BENCHMARKS.md").splitlines()
    assert any(f"| {fp8} | 650 |" in ln and "| 1.23 |" in ln for ln in lines)
    data["notes"].append(f"caveat: measured before commit bbbbbbb, case {base}: why")
    (folder / "step_1.5b.json").write_text(json.dumps(data))
    lines = report.render(folder.parent, tmp_path / "BENCHMARKS.md").splitlines()
    row = next(ln for ln in lines if f"| {fp8} | 650 |" in ln)
    assert "1.23" not in row and "103" not in row


def test_a_tp_row_that_ran_without_the_overlap_tp2_now_turns_on_says_so():
    tp2 = report.Run("step_7b_tp2", Path("."), {}, ["parallel: tp2, 2 rank(s); TFLOP/s and MFU per GPU"], [])
    single = report.Run("step_1.5b", Path("."), {}, ["parallel: single, 1 rank(s); TFLOP/s and MFU per GPU"], [])
    assert report.shown_precision(tp2, {"precision": "bf16"}) == "bf16+parallel.tp_comm_overlap=false"
    assert report.shown_precision(tp2, {"precision": "fp8_blockwise_ue8m0+model.compile=false"}) == \
        "fp8_blockwise_ue8m0+model.compile=false,parallel.tp_comm_overlap=false"
    for row in ({"precision": "bf16", "tp_comm_overlap": "True"}, {"precision": "bf16+parallel.tp_comm_overlap=true"},
                {"precision": "bf16+parallel.sequence_parallel=false"}):  # ran it, or had nothing to split
        assert report.shown_precision(tp2, row) == row["precision"]
    assert report.shown_precision(single, {"precision": "bf16"}) == "bf16"


def test_a_row_that_named_no_overlap_gives_way_to_a_newer_one_naming_it_off(tmp_path):
    """tp2 turns the overlap on: an old run's plain `bf16` ran without it, as a new run's named case did, and only
    the newer of the two is shown."""
    results = tmp_path / "results"
    _write_step(results / "2026-01-01-aaaaaaa", "2026-01-01 10:00", [_step_row("bf16", 800.0, 41000, 0.45, 46.2)], [],
                [], layout="tp2, 2 rank(s)")
    _write_step(results / "2026-01-02-bbbbbbb", "2026-01-02 10:00",
                [_step_row("bf16+parallel.tp_comm_overlap=false", 790.0, 41500, 0.46, 46.2)], [], [],
                layout="tp2, 2 rank(s)")
    lines = report.render(results, tmp_path / "BENCHMARKS.md").splitlines()
    shown = [ln for ln in lines if ln.startswith("| 4096 | none | bf16+parallel.tp_comm_overlap=false |")]
    assert len(shown) == 1 and "| 790 |" in shown[0]


def test_check_detects_a_stale_page(tmp_path):
    results, page = _results(tmp_path / "results"), tmp_path / "BENCHMARKS.md"
    cmd = [sys.executable, str(REPO / "bench" / "report.py"), "--results", str(results), "--page", str(page)]
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode != 0  # no page yet
    subprocess.run(cmd, check=True, capture_output=True)
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 0
    _write_step(results / "2026-01-03-ccccccc", "2026-01-03 10:00", [_step_row("bf16", 740.0, 44300, 0.46, 46.2)], [], [])
    stale = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert stale.returncode != 0 and "python3 bench/report.py" in stale.stderr


def test_committed_page_is_what_the_results_generate():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "report.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # one page: kernels, steps, attention, optimizers, parity, data-parallel scaling and the scaling model,
    # their longer tables left to the result files
    assert len((REPO / "BENCHMARKS.md").read_text().splitlines()) < 450


def test_emit_writes_the_result_file_beside_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_MAX_CTAS", "8")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setenv("NCCL_VERSION", "2.28.9")  # an image's label, not a setting
    monkeypatch.setenv("TORCH_NCCL_HIGH_PRIORITY", "1")
    out = tmp_path / "quant.md"
    emit("FP8 quantization kernels", ["measured copy bandwidth (read+write): 3005 GB/s",
                                      markdown_table([{"kernel": "1x128", "ms": 0.139, "GB/s": 2920.0}])], str(out))
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["title"] == "FP8 quantization kernels"
    assert {"device", "torch", "cuda", "triton", "python", "command", "date", "commit"} <= set(result["env"])
    assert result["notes"] == ["measured copy bandwidth (read+write): 3005 GB/s"]
    # the launch settings it ran under, shown before its command on the page
    assert result["env"]["environment"] == "CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_MAX_CTAS=8 TORCH_NCCL_HIGH_PRIORITY=1"
    run = report.load_run(out.with_suffix(".json"))
    assert report.command(run).startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_MAX_CTAS=8 TORCH_NCCL_HIGH_PRIORITY=1 python ")
    assert result["tables"][0]["rows"] == [{"kernel": "1x128", "ms": 0.139, "GB/s": 2920.0}]
    assert result["tables"][0]["printed"] == [["1x128", "0.139", "2.92e+03"]]


def _scaling_results(root: Path) -> Path:
    """A bandwidth run (two sizes a collective), a projection with its figure and a validation, as
    bench/scaling.py prints them; an older projection that the page must not show."""
    folder = root / "2026-01-03-ccccccc"
    folder.mkdir(parents=True)
    bw = [{"op": op, "ranks": 2, "size_MiB": mib, "time_us": 10.0, "algbw_GB/s": 1.0, "busbw_GB/s": gbs}
          for op in ("all_gather", "all_reduce") for mib, gbs in ((1, 50.0), (4, 120.0), (16, 300.0))]
    proj = [{"model": "qwen2.5-7b", "seq": 32768, "replica": "tp4", "recompute": "full", "precision": "bf16", "GPUs": g,
             "dp": g // 4, "tokens a step": 4194304, "step_ms": ms, "compute_ms": 2000.0, "tokens/s per GPU": 6000.0,
             "efficiency": eff, "efficiency, DP not overlapped": eff - 0.1, "step_ms, FP8 param gather": ms - 100,
             "efficiency, FP8 param gather": eff + 0.05, "source": "qwen2.5-7b s32768 bf16 (x/step_7b)"}
            for g, ms, eff in ((8, 2400.0, 0.833), (512, 2500.0, 0.8))]
    val = [{"model": "qwen2.5-1.5b", "seq": 4096, "recompute": "none", "precision": "bf16", "layout": "tp1xdp2",
            "GPUs": 2, "mbs x accum": "2x8", "device": "NVIDIA H100 80GB HBM3", "measured_ms": 760.0,
            "predicted_ms": 745.0, "error_%": -1.97, "inputs on its device": "yes", "source": "qwen2.5-1.5b s4096"}]
    reports = {"scaling_bw_2gpu": ("Collective bus bandwidth", ["2 GPUs; bf16", markdown_table(bw)]),
               "scaling": ("Scaling model: projected step", ["assumed: 50 GB/s a GPU between nodes", "batch: 4M tokens",
                                                           "efficiency = compute / step time", "Projected step:\n\n"
                                                           + markdown_table(proj)]),
               "scaling_validate": ("Scaling model vs measured steps", ["prediction error: max |error| 2.0% over 1",
                                                                        "Predicted vs measured step:\n\n" + markdown_table(val)])}
    for kind, (title, sections) in reports.items():
        text = "\n\n".join([f"## {title}", _header("2026-01-03 10:00", f"python bench/scaling.py --out {kind}.md"),
                            *sections]) + "\n"
        write_result(folder / f"{kind}.md", text, commit="ccccccc")
    (folder / "scaling.png").write_bytes(b"\x89PNG")
    older = root / "2026-01-02-bbbbbbb"
    older.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(["## Scaling model: projected step", _header("2026-01-02 10:00", "python bench/scaling.py"),
                        "Projected step:\n\n" + markdown_table([{**proj[0], "step_ms": 9999.0}])]) + "\n"
    write_result(older / "scaling.md", text, commit="bbbbbbb")
    return root


def test_page_shows_the_newest_scaling_runs_as_short_tables(tmp_path):
    lines = report.render(_scaling_results(tmp_path / "results"), tmp_path / "BENCHMARKS.md").splitlines()
    at = lines.index("## Scaling model (bench/scaling.py)")
    section = lines[at:]
    # bandwidth: a row per collective and group size, at the largest size and every other one below it
    assert "| op | ranks | 1 MiB | 16 MiB |" in section and "| all_reduce | 2 | 50 | 300 |" in section
    # the projection: its assumptions and a few columns, the newest run only, then its figure
    assert "assumed: 50 GB/s a GPU between nodes" in section and "batch: 4M tokens" in section
    assert ("| model | seq | replica | precision | GPUs | tokens a step | step_ms | tokens/s per GPU | efficiency | "
            "efficiency, DP not overlapped | step_ms, FP8 param gather | efficiency, FP8 param gather |") in section
    assert "| qwen2.5-7b | 32768 | tp4 | bf16 | 512 | 4194304 | 2.5e+03 | 6e+03 | 0.8 | 0.7 | 2.4e+03 | 0.85 |" in section
    assert not any("9.999e+03" in ln or "| 1e+04 |" in ln for ln in section)
    assert "![scaling](results/2026-01-03-ccccccc/scaling.png)" in section
    # the validation: its error summary on the page, its rows in the result file
    assert "prediction error: max |error| 2.0% over 1" in section
    assert not any("| tp1xdp2 |" in ln for ln in section)
    order = [next(i for i, ln in enumerate(section) if key in ln) for key in ("| op | ranks", "| model | seq | replica",
                                                                             "prediction error:")]
    assert order == sorted(order)  # bandwidth, then the projection, then the validation


def _dp_run(folder: Path, date: str, dp: int, pct: float, notes: list[str] = ()) -> None:
    row = {"model": "qwen2.5-1.5b", "seq": 4096, "case": "bf16", "accum": 1, "DP": dp, "tokens/s per GPU": 40000,
           "% of DP=1": pct}
    text = "\n\n".join(["## Data-parallel scaling", _header(date, f"python bench/dp_scaling.py --tag {dp}"), *notes,
                        markdown_table([row])]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dp_scaling_a1.md").write_text(text)
    write_result(folder / "dp_scaling_a1.md", text, commit=folder.name.rsplit("-", 1)[-1])


def test_the_dp_table_keeps_the_newest_run_of_each_size_and_leaves_out_withdrawn_runs(tmp_path):
    """A newer 2-GPU run does not hide the last 4-GPU one (the lent machines differ from day to day), an older
    run of a size measured again is not shown, and a run noted "withdrawn: ..." is on no page."""
    _dp_run(tmp_path / "2026-01-01-aaaaaaa", "2026-01-01 10:00", 4, 86.8)
    _dp_run(tmp_path / "2026-01-02-bbbbbbb", "2026-01-02 10:00", 2, 91.0)
    _dp_run(tmp_path / "2026-01-03-ccccccc", "2026-01-03 10:00", 2, 94.3)
    _dp_run(tmp_path / "2026-01-04-ddddddd", "2026-01-04 10:00", 2, 99.9, ["withdrawn: measured wrong"])
    page = report.render(tmp_path, tmp_path / "BENCHMARKS.md")
    section = page.split("## Data-parallel scaling")[1]
    assert "| 4 | bf16 | 40000 | 86.8 |" in section and "| 2 | bf16 | 40000 | 94.3 |" in section
    assert "91" not in section and "99.9" not in section and "ddddddd" not in page


def test_a_caveat_naming_a_case_holds_for_that_case_only():
    """A run measured before a fix is left out of what models the code as it is; a caveat that names a case
    leaves out that case's rows, and the run's other cases stand."""
    fp8pg = "fp8_blockwise_ue8m0+optimizer.fp8_param_gather=true"
    scoped = report.Run("step_dp2_a1", Path("."), {}, [f"caveat: measured before commit abc1234, case {fp8pg}: why"], [])
    whole = report.Run("step_dp2_a1", Path("."), {}, ["caveat: measured before commit abc1234: why"], [])
    plain = report.Run("step_dp2_a1", Path("."), {}, ["caveat: no NVML on this host"], [])
    assert report.measured_before_a_fix(scoped, {"precision": fp8pg})
    assert not report.measured_before_a_fix(scoped, {"precision": "bf16"}) and not report.measured_before_a_fix(scoped)
    assert report.measured_before_a_fix(whole) and report.measured_before_a_fix(whole, {"precision": "bf16"})
    assert not report.measured_before_a_fix(plain, {"precision": fp8pg})


def test_a_bandwidth_run_a_newer_one_covers_is_left_to_its_result_file(tmp_path):
    """A 4-GPU bandwidth run measures groups of 2 as well: the older 2-GPU run of the same device leaves the page."""
    root = _scaling_results(tmp_path / "results")
    newer = root / "2026-01-04-ddddddd"
    newer.mkdir()
    bw = [{"op": "all_gather", "ranks": ranks, "size_MiB": mib, "time_us": 10.0, "algbw_GB/s": 1.0, "busbw_GB/s": 77.0}
          for ranks in (2, 4) for mib in (1, 4)]
    text = "\n\n".join(["## Collective bus bandwidth", _header("2026-01-04 10:00", "python bench/scaling.py measure"),
                        "4 GPUs; bf16", markdown_table(bw)]) + "\n"
    write_result(newer / "scaling_bw_4gpu.md", text, commit="ddddddd")
    section = report.render(root, tmp_path / "BENCHMARKS.md").split("## Scaling model (bench/scaling.py)")[1]
    assert "| all_gather | 4 | 77 |" in section and "| all_gather | 2 | 77 |" in section
    assert "| all_reduce | 2 | 50 |" not in section and "2026-01-03-ccccccc/scaling_bw_2gpu" not in section


def test_dp_rows_show_peaks_as_held_and_leave_out_allocated_peaks_of_graphed_cases():
    def shown(printed: dict) -> dict:
        return dict(zip(report.DP_COLUMNS, report.dp_row(printed)))

    old_bf16 = shown({"case": "bf16", "peak GiB": "40.4", "DP=1 peak GiB": "46.2"})
    old_fp8 = shown({"case": "fp8_blockwise_ue8m0", "peak GiB": "27.6", "DP=1 peak GiB": "28.5"})
    new_fp8 = shown({"case": "fp8_blockwise_ue8m0", "peak GiB held": "40.1", "DP=1 peak GiB held": "40.3"})
    assert (old_bf16["peak GiB"], old_bf16["DP=1 peak GiB"]) == ("40.4", "46.2")
    assert (old_fp8["peak GiB"], old_fp8["DP=1 peak GiB"]) == ("", "")
    assert (new_fp8["peak GiB"], new_fp8["DP=1 peak GiB"]) == ("40.1", "40.3")
