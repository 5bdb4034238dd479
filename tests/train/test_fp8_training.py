"""FP8 recipes inside the megatron trainer on CPU (emulated FP8 GEMMs): TP/SP parity, weight reuse, health."""
from __future__ import annotations

import json

import pytest
import torch

from infir.train.metrics import read_metrics
from trainrun import in_process_losses, losses, run_train, summary, worker_rows

FAST = ["logger=none", "train.log_interval=1", "train.eval_interval=0"]


def _gather_worker(recipe: str, *device: str, nproc: int = 2):
    for r in worker_rows("fp8_gather_worker.py", recipe, *device, nproc=nproc, timeout=300):
        assert r["takes"], r
        for case in ("column", "column_overlap", "row_overlap"):
            c = r[case]
            # Quantize-then-gather equals gather-then-quantize: the same FP8 operands, so results agree up to
            # float summation order; compiled (collectives inside the graph or inside the ops), bit for bit.
            assert c["y"] < 1e-6 and c["dw"] < 1e-6 and c["dx"] < 1e-6, (case, r)
            assert c["compiled_equal"] == [True, True, True], (case, r)
        # FP8 bytes and their FP32 scales, never the BF16/FP32 activation itself (the overlapped paths move
        # theirs by all-to-all exchanges inside their ops, which this recording does not see)
        c = r["column"]
        assert any("float8" in d for d in c["gathered"]) and set(c["gathered"]) <= {
            "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float32"}, r


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "fp8_blockwise_e5m2_grad"])
def test_sequence_parallel_all_gather_moves_fp8_and_matches_gathering_bf16(recipe):
    _gather_worker(recipe)


def test_sequence_parallel_split_schedules_on_four_ranks():
    """Four ranks: three exchanges per split collective, each with its own pair of ranks."""
    _gather_worker("fp8_blockwise_ue8m0", nproc=4)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")
@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "fp8_blockwise_fp32"])
def test_gpu_sequence_parallel_fp8_all_gather_over_nccl(recipe):
    """The same checks on two GPUs: Triton quantizers, scaled_mm, NCCL, and the core compiled by inductor."""
    _gather_worker(recipe, "cuda")


@pytest.mark.gpu
def test_gpu_cuda_graphs_train_on_the_same_losses(demo_root, tmp_path):
    """compile_mode=reduce-overhead replays each compiled layer as a CUDA graph; the FP8 weights are
    refreshed in place between steps, so the replays read each step's weights: same losses. Steps
    2+ (after the first update) are where a graph reading stale weights would drift. Every third
    step is an FP8 health step, whose hooks break each layer's graph to read the operands.
    Validation after steps 3 and 6 runs the graphed layers without a backward (eagerly, see
    Trainer.validate): validation losses within bf16 rounding of the compiled run's (2e-4 apart on
    an H100), and training goes on after the first."""
    common = [*(o for o in FAST if not o.startswith("train.eval_interval")), f"data.root={demo_root}",
              "model=small-180m", "precision=fp8_blockwise_ue8m0", "stage.iters=6", "stage.seq_length=512",
              "stage.micro_batch=2", "stage.global_batch=4", "train.fp8_health_interval=3", "train.eval_interval=3",
              "train.eval_iters=2"]
    run_train([*common, f"run_dir={tmp_path / 'eager'}", "model.compile_mode=default"])  # auto would take graphs too
    run_train([*common, f"run_dir={tmp_path / 'graphs'}", "model.compile_mode=reduce-overhead"])
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "graphs")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert a[6] < a[1], "the loss should fall over 6 steps"
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-4 * abs(a[step]), (step, a[step], b[step])
    rows = [json.loads(line) for line in (tmp_path / "graphs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "fp8/swiglu_amax_max" in r] == [3, 6]
    val = {d: {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / d / "metrics.jsonl") if "val_loss" in r}
           for d in ("eager", "graphs")}
    assert sorted(val["graphs"]) == sorted(val["eager"]) == [3, 6]
    for step in (3, 6):  # eager kernels against the reference run's compiled (fused) ones: bf16 rounding apart
        assert abs(val["eager"][step] - val["graphs"][step]) <= 1e-3 * val["eager"][step], (step, val)


@pytest.mark.gpu
def test_gpu_full_recompute_with_per_forward_weights_trains_on_the_kept_weights_losses(demo_root, tmp_path):
    """Compiled layers under full recomputation: FP8 weights quantized per layer forward (the default there)
    take the same steps as weights kept for the step (the same FP8 values, from the same kernels), and use
    less memory at the peak: the kept copies (1 byte per parameter) are gone."""
    common = [*FAST, f"data.root={demo_root}", "model=small-180m", "precision=fp8_blockwise_ue8m0",
              "model.recompute=full", "stage.iters=4", "stage.seq_length=512", "stage.micro_batch=2",
              "stage.global_batch=4"]
    runs = {cache: tmp_path / cache for cache in ("true", "auto")}
    for cache, run_dir in runs.items():
        run_train([*common, f"run_dir={run_dir}", f"model.fp8_weight_cache={cache}"])
    kept, per_forward = losses(runs["true"]), losses(runs["auto"])
    assert sorted(kept) == list(range(1, 5)) and kept == per_forward, (kept, per_forward)
    peaks = {cache: summary(run_dir)["peak_alloc_gib"] for cache, run_dir in runs.items()}
    assert peaks["auto"] < peaks["true"], peaks


def test_the_start_line_says_where_the_overlap_cannot_split_an_fp8_recipes_collectives():
    """Per-tensor and two-level scales, or shards that cut a 128-token group, keep megatron's order (the linears'
    SequenceParallel.takes); BF16 always splits."""
    from types import SimpleNamespace

    from infir.fp8 import get_recipe
    from infir.model.fp8_linears import splits_around_gemms
    from infir.model.linears import sequence_parallel_schedule

    assert splits_around_gemms(get_recipe("bf16"), 100) and splits_around_gemms(get_recipe("fp8_blockwise_ue8m0"), 2048)
    assert not splits_around_gemms(get_recipe("fp8_blockwise_ue8m0"), 2048 + 64)
    for whole_tensor_or_two_level in ("fp8_tensorwise", "moss"):
        assert not splits_around_gemms(get_recipe(whole_tensor_or_two_level), 2048)
    tp2, tp1 = SimpleNamespace(size=lambda: 2, group_name="tp"), SimpleNamespace(size=lambda: 1, group_name="tp")
    assert "scaled per token" in sequence_parallel_schedule(True, True, False, tp2)
    assert sequence_parallel_schedule(True, True, True, tp1) is None
    assert sequence_parallel_schedule(False, True, True, tp2) is None


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_fp8_tp2_sequence_parallel_matches_tp1(demo_root, tmp_path, overlap):
    common = [*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", "stage.iters=6"]
    run_train([*common, f"run_dir={tmp_path / 'tp1'}"])
    proc = run_train([*common, f"run_dir={tmp_path / 'tp2'}", "parallel=tp2", f"parallel.tp_comm_overlap={overlap}"],
                     nproc=2)
    # the start line says how the collectives ran: gloo's ranks exchange, never map memory
    said = ("split per rank around their GEMMs, rows moved by all-to-all exchanges" if overlap
            else "before and after their GEMMs (parallel.tp_comm_overlap=false)")
    assert f"tensor parallel: sequence-parallel collectives {said}" in proc.stdout + proc.stderr, proc.stdout[-2000:]
    a, b = losses(tmp_path / "tp1"), losses(tmp_path / "tp2")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert abs(a[step] - b[step]) <= 2e-3 * abs(a[step]), (step, a[step], b[step])


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_compiled_fp8_tp2_sequence_parallel_matches_tp1(demo_root, tmp_path, overlap):
    """model.compile=true on CPU compiles every layer: the FP8 core inside each layer's graph and, under SP,
    QKV's and FC1's FP8 all-gather (functional collectives inside the graph), or with overlap the split
    schedules (opaque ops inside the graph)."""
    common = [*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", "stage.iters=4", "model.compile=true"]
    run_train([*common, f"run_dir={tmp_path / 'tp1'}"])
    run_train([*common, f"run_dir={tmp_path / 'tp2'}", "parallel=tp2", f"parallel.tp_comm_overlap={overlap}"], nproc=2)
    a, b = losses(tmp_path / "tp1"), losses(tmp_path / "tp2")
    assert sorted(a) == sorted(b) == list(range(1, 5))
    assert a[4] < a[1]
    for step in a:
        assert abs(a[step] - b[step]) <= 2e-3 * abs(a[step]), (step, a[step], b[step])


def test_weights_are_quantized_once_per_optimizer_step(demo_root, tmp_path, monkeypatch):
    """Two micro-batches per step and dgrad all reuse one FP8 copy of each weight."""
    from infir.fp8 import WeightCache
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    calls = []
    real = WeightCache._quantized
    monkeypatch.setattr(WeightCache, "_quantized", lambda self, w, recipe: (calls.append(id(self)), real(self, w, recipe))[1])
    cfg = compose([*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", f"run_dir={tmp_path}",
                   "stage.iters=2", "stage.micro_batch=4", "stage.global_batch=8", "stage.seq_length=128"])
    trainer = Trainer(cfg)
    layers = 4 * trainer.size.layers  # qkv, proj, fc1, fc2
    assert trainer.accum == 2
    for step in range(2):
        calls.clear()
        trainer.train_step(step)
        assert len(calls) == layers and len(set(calls)) == layers
    from infir.train import dist as distributed

    distributed.shutdown()


def test_fp8_export_of_a_trained_checkpoint_holds_the_trainers_fp8_weights(demo_root, tmp_path):
    """`infir-convert mcore-to-hf --fp8` on the trainer's own checkpoint: every block the export could take
    from training (see fp8_export) holds the FP8 bytes and scale the trainer's layers quantize the saved
    weights to, for the step after it."""
    import warnings

    from safetensors.torch import load_file

    from infir.fp8 import dequantize
    from infir.fp8.quantize import quantize_reference
    from infir.model.convert import mcore_to_hf, mcore_to_hf_state
    from infir.model.ckpt_format import model_state
    from infir.model.fp8_linears import fp8_linears_of
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    cfg = compose([*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", f"run_dir={tmp_path / 'run'}",
                   "stage.iters=2", "stage.seq_length=128"])
    trainer = Trainer(cfg)
    for step in range(2):
        trainer.train_step(step)
    trainer.save()
    ckpt = trainer.wait_save()
    model = trainer.model.module
    names = {id(m): n for n, m in model.named_modules()}
    fp8 = {f"{names[id(m)]}.weight": dequantize(m.weight_cache.get(m.weight, m.recipe)) for m in fp8_linears_of(model)}
    distributed.shutdown()
    state = model_state(model)
    want, weights = mcore_to_hf_state([{**state, **fp8}], trainer.size), mcore_to_hf_state([state], trainer.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny model's head_dim of 32 puts two query groups in a block
        out = load_file(str(mcore_to_hf(ckpt, tmp_path / "hf", fp8=True) / "model.safetensors"))
    training = fresh = 0
    for name in (k.removesuffix("_scale_inv") for k in out if k.endswith("weight_scale_inv")):
        rows, cols = out[name].shape
        got = out[name].float() * out[name + "_scale_inv"].repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        for block in ((slice(r, r + 128), slice(c, c + 128)) for r in range(0, rows, 128) for c in range(0, cols, 128)):
            if torch.equal(got[block], want[name][block]):
                training += 1
            else:  # a block holding parts of two of training's blocks: quantized from the weight itself
                assert torch.equal(got[block], dequantize(quantize_reference(weights[name][block], "block", "ue8m0")))
                fresh += 1
    assert training > fresh


def test_health_monitor_logs_every_fp8_layer_and_the_swiglu_output(demo_root, tmp_path):
    """Every operand of every FP8 linear, read by the monitor's forward hooks. With SwiGLU as FC1's epilogue
    (moss.yaml keeps its input in FP8), FC2's input arrives already in FP8: its amax and saturation are of
    those values (their re-quantization is exact: no SNR), and FC1's output gradient is SwiGLU's, not read."""
    run_dir = tmp_path / "health"
    run_train([*FAST, f"data.root={demo_root}", "precision=moss", f"run_dir={run_dir}", "stage.iters=2",
               "train.fp8_health_interval=2"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    health = next(r for r in rows if "fp8/swiglu_amax_max" in r)
    assert health["step"] == 2
    for operand in ("x", "w", "dy"):
        for layer in ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"):
            key = f"fp8/L3.{layer}/{operand}/snr_db"
            if (layer, operand) == ("linear_fc1", "dy"):
                assert key not in health
            elif (layer, operand) == ("linear_fc2", "x"):
                assert health[key] is None and health[f"fp8/L3.{layer}/{operand}/amax"] > 0, key  # inf in JSON
            else:
                assert key in health and health[key] > 10, key
    assert health["fp8/swiglu_amax_max"] == max(health[f"fp8/L{i}.linear_fc2/x/amax"] for i in range(4))


def test_fp8_swiglu_input_switch_builds_the_activation_and_trains(demo_root, tmp_path):
    """precision.fp8_swiglu_input (on in the FP8 configs) puts infir's SwiGLU into every FC1 (and the
    identity in megatron's activation submodule); off, megatron's own. Both train to nearly the same losses."""
    import torch

    from infir.fp8 import OperandFormat
    from infir.model.fp8_swiglu import SwiGLUInFc1
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    losses = {}
    for swiglu_fp8 in (True, False):
        cfg = compose([*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", f"run_dir={tmp_path / str(swiglu_fp8)}",
                       "stage.iters=4", f"precision.fp8_swiglu_input={swiglu_fp8}"])
        try:
            trainer = Trainer(cfg)
            acts = [m.activation_func for m in trainer.model.modules() if type(m).__name__ == "MLP"]
            assert len(acts) == trainer.size.layers
            assert all(isinstance(a, SwiGLUInFc1) for a in acts) == swiglu_fp8
            assert all(a is torch.nn.functional.silu for a in acts) != swiglu_fp8
            fc1s = [m.linear_fc1 for m in trainer.model.modules() if type(m).__name__ == "MLP"]
            assert all(f.swiglu == (OperandFormat("token", "ue8m0", "e4m3") if swiglu_fp8 else None) for f in fc1s)
            losses[swiglu_fp8] = [trainer.train_step(i)["loss"] for i in range(4)]
        finally:
            distributed.shutdown()
    assert losses[True][0] == losses[False][0], "the forward is exact; only gradients see the FP8 copy"
    assert losses[True] != losses[False]
    for a, b in zip(losses[True], losses[False]):
        assert abs(a - b) <= 2e-2 * abs(b), losses


def test_fp8_swiglu_input_needs_an_fp8_recipe(tmp_path):
    from infir.train.cli import compose
    from infir.train.config import ConfigError, validate

    with pytest.raises(ConfigError, match="precision.fp8_swiglu_input"):
        validate(compose(["precision=bf16", "precision.fp8_swiglu_input=true", f"run_dir={tmp_path}"]))


def test_compiled_fp8_full_recompute_gives_the_same_steps(demo_root, tmp_path):
    """Full recomputation re-runs each compiled layer in the backward: FC1 then hands SwiGLU's output to FC2
    in FP8 again (an Fp8SwiGLUOutput) inside megatron's checkpoint. The losses equal the plain run's."""
    results = in_process_losses({
        recompute: [*FAST, f"data.root={demo_root}", f"run_dir={tmp_path / recompute}", "stage.iters=3",
                    "precision=fp8_blockwise_ue8m0", "model.compile=true", f"model.recompute={recompute}"]
        for recompute in ("none", "full")}, steps=3)
    assert results["full"] == results["none"], results


def test_full_recompute_quantizes_weights_per_layer_forward_and_keeps_no_copy(demo_root, tmp_path, monkeypatch):
    """model.fp8_weight_cache=auto under full recomputation: each layer quantizes its weights as its forward and
    its recompute begin (4 times a step at two micro-batches) and keeps no FP8 copy between them, and the run
    takes the same steps as one that keeps the copies."""
    from infir.fp8 import WeightCache
    from infir.model.fp8_linears import fp8_linears_of
    from infir.train import dist as distributed
    from infir.train.cli import compose
    from infir.train.loop import Trainer

    common = [*FAST, f"data.root={demo_root}", "precision=fp8_blockwise_ue8m0", "model.recompute=full",
              "stage.micro_batch=4", "stage.global_batch=8", "stage.seq_length=128"]
    calls = []
    real = WeightCache._quantized
    monkeypatch.setattr(WeightCache, "_quantized", lambda self, w, recipe: (calls.append(id(self)), real(self, w, recipe))[1])
    trainer = Trainer(compose([*common, f"run_dir={tmp_path / 'transient'}", "stage.iters=2"]))
    linears = fp8_linears_of(trainer.model.module)
    try:
        for step in range(2):
            calls.clear()
            trainer.train_step(step)
            assert len(calls) == 4 * len(linears) and len(set(calls)) == len(linears)
            assert all(m.weight_cache.q is None for m in linears)
    finally:
        trainer.close()
        distributed.shutdown()
    monkeypatch.undo()
    got = in_process_losses({cache: [*common, f"run_dir={tmp_path / str(cache)}", "stage.iters=3",
                                     f"model.fp8_weight_cache={cache}"] for cache in ("auto", "true")}, 3)
    assert got["auto"] == got["true"], got


@pytest.mark.parametrize("overrides, message", [
    (["precision=moss"], "automatic weight scaling advances once a step"),
    (["precision=fp8_blockwise_ue8m0", "optimizer.fp8_param_gather=true"], "gathers the weights into the kept copies"),
])
def test_per_forward_weights_are_refused_where_the_copy_must_persist(demo_root, tmp_path, overrides, message):
    proc = run_train([*FAST, f"data.root={demo_root}", f"run_dir={tmp_path}", "stage.iters=1",
                      "model.fp8_weight_cache=false", *overrides], check=False)
    assert proc.returncode != 0 and message in proc.stderr + proc.stdout, proc.stderr[-2000:]
