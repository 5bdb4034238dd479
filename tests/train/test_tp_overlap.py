"""parallel.tp_comm_overlap: the FP8 core's sequence-parallel gathers and reduce-scatters pipelined with its GEMMs
give the same outputs and gradients as the un-pipelined layers (tp_overlap_worker.py), and the trainer takes
the setting."""
from __future__ import annotations

import pytest
import torch

from trainrun import losses, run_train, worker_rows

FP8_ON_WIRE = {"torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float32"}


def _check(rows: list[dict], tol: float) -> None:
    for r in rows:
        # the column pipeline runs the same GEMMs on the same FP8 operands, row block by row block
        assert r["column_eager_rel"] == [0.0, 0.0, 0.0] or max(r["column_eager_rel"]) <= tol, r
        assert max(r["column_compiled_rel"]) <= tol, r
        # the row pipeline sums two partials (commutative) and quantizes dY's shard before its gather,
        # which per-token groups along N and 128-token groups along the shard's tokens make exact
        assert r["row_takes"] and r["row_eager_shape"] and r["row_compiled_shape"], r
        assert max(r["row_eager_rel"]) <= tol and max(r["row_compiled_rel"]) <= tol, r
        assert any("float8" in d for d in r["row_wire"]) and set(r["row_wire"]) <= FP8_ON_WIRE, r
        assert r["no_bias"], r
        for kind, ops in (("model", ("fp8.fp8_gather_mm", "fp8.fp8_mm_scatter")),
                          ("bf16_model", ("bf16.gather_mm_whole", "bf16.mm_scatter"))):
            plain, piped = r[f"{kind}_calls"]
            assert set(plain.values()) == {0}, r
            gather, scatter = (piped.pop(op) for op in ops)
            assert set(piped.values()) == {0}, r       # the other precision's pipelines never ran
            layers = scatter // 2                       # proj and FC2 of every layer, forward
            assert layers >= 1 and gather == 4 * layers, r   # QKV, FC1 fprop; proj, FC2 dgrad
            assert r[f"{kind}_grad_names"] and r[f"{kind}_grads_rel"] <= tol, r
            a, b = r[f"{kind}_loss"]
            assert abs(a - b) <= tol * abs(a), r


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "fp8_blockwise_e5m2_grad"])
def test_pipelined_sequence_parallel_fp8_linears_match_the_unpipelined_ones(recipe):
    """gloo, FP32 activations, emulated FP8 GEMMs: bit for bit."""
    _check(worker_rows("tp_overlap_worker.py", recipe), 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")
def test_gpu_pipelined_sequence_parallel_fp8_linears_over_nccl():
    """NCCL, scaled_mm writing each rank's block of rows in place, inductor: within BF16 summation order."""
    _check(worker_rows("tp_overlap_worker.py", "fp8_blockwise_ue8m0", "cuda"), 2e-3)


@pytest.mark.parametrize("precision", ["fp8_blockwise_ue8m0", "bf16"])
def test_trainer_takes_tp_comm_overlap(demo_root, tmp_path, precision):
    """TP=2 + SP training with the pipelines on the same losses as without them: bit for bit under FP8; under
    BF16 autocast the QKV bias gradient is summed outside F.linear's backward, a rounding apart (1e-6)."""
    common = ["logger=none", "train.log_interval=1", "train.eval_interval=0", f"data.root={demo_root}",
              f"precision={precision}", "parallel=tp2", "stage.iters=3"]
    run_train([*common, f"run_dir={tmp_path / 'plain'}"], nproc=2)
    run_train([*common, f"run_dir={tmp_path / 'piped'}", "parallel.tp_comm_overlap=true"], nproc=2)
    a, b = losses(tmp_path / "plain"), losses(tmp_path / "piped")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    tol = 0.0 if precision.startswith("fp8") else 1e-5
    for step in a:
        assert abs(a[step] - b[step]) <= tol * abs(a[step]), (step, a, b)
