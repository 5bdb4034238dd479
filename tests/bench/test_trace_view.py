"""bench/trace_view.py on a GPU timeline written here: the middle step's phases and each collective's exposed
time, and one line for a trace without two steps."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from trace_view import view  # noqa: E402

MARK = "bench_profiled_step_"


def _trace(path: Path, events: list) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump({"window_mark": MARK, "events": events}, f)
    return path


def test_the_middle_step_shows_the_gather_that_ran_with_nothing_beside_it(tmp_path):
    step = lambda i: [[f"{MARK}{i}", 7, 1000 * i, 1000 * i + 900]]  # noqa: E731
    events = [*step(0), *step(1), *step(2),
              ["nvjet_sm90_gemm", 7, 1000, 1300],                          # forward
              ["multi_tensor_apply_kernel<CopyFunctor>", 7, 1300, 1320],   # a copy in it, not the optimizer's
              ["nvjet_sm90_gemm", 7, 1320, 1700],                          # backward
              ["ncclDevKernel_ReduceScatter_Sum_f32", 23, 1600, 1750],     # 100 us of it past the GEMM
              ["multi_tensor_apply_kernel<FusedAdamW>", 7, 1750, 1800],    # the optimizer
              ["ncclDevKernel_AllGather_RING_LL", 23, 1800, 1950],         # nothing beside it
              ["nccl:_all_gather_base", 23, 1800, 1950],                   # the profiler's row over it: skipped
              ["nvjet_sm90_gemm", 7, 2000, 2600]]
    text = view(_trace(tmp_path / "t.json.gz", events), None, 0.0)
    assert "step 1, 1.0 ms" in text
    assert "forward+backward: 0.00 .. 0.70 ms" in text and "optimizer: 0.75 .. 0.80 ms" in text
    assert "0.80     0.95   0.15   0.15  s23  ncclDevKernel_AllGather" in text
    assert "0.60     0.75   0.15   0.05  s23  ncclDevKernel_ReduceScatter" in text
    assert "exposed collective time: 0.2 ms" in text and text.count("AllGather") == 1
    assert "after the last GEMM: 0.3 ms to the next step, the GPU idle 0.05 ms of it" in text  # 1.95 .. 2.00


def test_a_trace_of_one_step_is_refused_in_one_line(tmp_path):
    path = _trace(tmp_path / "one.json.gz", [[f"{MARK}0", 7, 0, 10], ["gemm", 7, 0, 10]])
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "trace_view.py"), str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip() == (f"trace_view: {path} holds 1 step annotation(s): it needs two or more steps "
                                   "(bench/step.py --profile --trace writes three)")
