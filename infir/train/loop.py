"""The training loop, read top to bottom: `Trainer.__init__` builds everything in order (processes,
then `build_model`, `build_optimizer`, `build_data`, then resume), `train_step` runs one optimizer
step over its micro-batches, `train` loops, validates, logs and checkpoints. What an optimizer needs
of the loop (param dtype, `.grad` or `main_grad`, fused clipping) is its entry in infir.optim's registry.

Precision: master weights, gradients (megatron DDP's fp32 `main_grad` buffers) and optimizer states
are FP32; the forward/backward compute dtype is the recipe's (BF16 autocast, or FP8 linears).

Data parallel: DDP reduces each gradient bucket while the last micro-batch's backward computes the
next; the optimizer states are replicated on every rank, or sharded over them (optimizer.py).
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from infir.model import build_gpt, check_parallel, get_size, transformer_config
from infir.model.cpu_shims import seed_everything
from infir.model.fp8_linears import splits_around_gemms
from infir.model.linears import reserve_overlap_buffers, sequence_parallel_schedule
from infir.train import batch as batching
from infir.train import checkpoint, data, dist as distributed
from infir.train.flops import flops_per_token, peak_tflops
from infir.train.gc_control import StepGC
from infir.train import precision
from infir.train.config import ConfigError
from infir.train.embedding_rows import DeferredRows, defers_rows, separate_bucket
from infir.train.metrics import RunLogger, format_duration, format_si
from infir.train.optimizer import (DataParallelOptimizer, bf16_param_gather, fp8_param_gather, overlap_gathers_with_forward,
                                  sharded_optimizer)
from infir.train.schedule import lr_at, resolve_warmup
from infir.train.spike import SpikePolicy


def _on_gpu(choice, device: torch.device) -> bool:
    """A true/false/auto switch where auto means: on CUDA devices."""
    return device.type == "cuda" if choice == "auto" else bool(choice)


# A compiled layer's sequence-parallel collectives are functional ops, each a start and a wait. Inductor
# places the wait right after the start, before GEMMs that do not need its result, which the FP8 core
# issues between them so that they overlap (dX's reduce-scatter around wgrad, X^T's gather around dgrad):
# every collective of a layer then ran with no GEMM beside it. These passes move each wait down to the first
# use of its result and each start up to where its input is ready.
OVERLAP_COLLECTIVES = {"reorder_for_compute_comm_overlap": True,
                       "reorder_for_compute_comm_overlap_passes": ["sink_waits", "raise_comms"]}


def compile_mode(choice: str, recipe, recompute: str, device: torch.device) -> str:
    """torch.compile's mode for each layer; auto: CUDA graphs (reduce-overhead) where the recipe asks for
    them (the blockwise FP8 recipes: their layers issue more kernels than BF16's around shorter GEMMs, so
    their step waits on the host, bench/step.py's graphs rows), on a GPU and without recomputation (no
    run has used graphs with it), the default mode otherwise."""
    if choice != "auto":
        return choice
    graphs = device.type == "cuda" and recipe.cuda_graphs and recompute == "none"
    return "reduce-overhead" if graphs else "default"


def transient_fp8_weights(choice, recipe, recompute: str, param_gather: bool) -> bool:
    """Whether each layer quantizes its FP8 weights as its forward begins and drops them after it
    (model.fp8_weight_cache=false) instead of keeping one copy for the whole step (true). auto: per forward
    under full recomputation, where the kept copy is the memory FP8 adds (1 byte per parameter) and a second
    quantization a micro-batch costs little beside a layer's recompute; kept otherwise, and wherever the copy
    must persist: MOSS's automatic scaling advances once a step, and the FP8 parameter gather fills it."""
    if not recipe.fp8:
        return False
    if choice == "auto":
        return recompute == "full" and not recipe.autoscale_weights and not param_gather
    if choice is False:
        why = ("its automatic weight scaling advances once a step" if recipe.autoscale_weights else
               "optimizer.fp8_param_gather=true gathers the weights into the kept copies" if param_gather else None)
        if why:
            raise ConfigError(f"model.fp8_weight_cache=false quantizes each layer's weights per forward, but under "
                              f"precision.recipe={recipe.name} {why}: set model.fp8_weight_cache=auto or true")
    return choice is False


class NonFiniteError(RuntimeError):
    """A NaN/Inf loss or gradient norm stopped the run (the last good checkpoint is kept)."""


class SpikeError(RuntimeError):
    """train.max_skips gradient-norm spikes in a row stopped the run (the last good checkpoint is kept)."""


def build_model(cfg, info, size, recipe, param_dtype: torch.dtype):
    """megatron's GPTModel from infir's spec with the recipe's linears, its layers compiled as
    `model.compile` says, wrapped in megatron's DDP (FP32 `main_grad` buffers).

    Returns (the DDP model, whether its compiled layers replay CUDA graphs)."""
    device = info.device
    tcfg = transformer_config(
        size,
        tp=info.tp,
        cp=info.cp,
        sequence_parallel=cfg.parallel.sequence_parallel,
        tp_comm_overlap=cfg.parallel.tp_comm_overlap,
        params_dtype=param_dtype,
        init_std=cfg.model.init_std,
        recompute=cfg.model.recompute,
        cpu_init=cfg.model.cpu_init,
        fusions=_on_gpu(cfg.model.fusions, device),
        autocast_dtype=None if recipe.compute_dtype == torch.float32 else recipe.compute_dtype,
    )
    model = build_gpt(
        size, tcfg, recipe, seq_length=cfg.stage.seq_length,
        chunked_loss=_on_gpu(cfg.model.chunked_loss, device), loss_chunk_tokens=cfg.model.loss_chunk_tokens,
        attention=cfg.model.attention,
        transient_fp8_weights=transient_fp8_weights(cfg.model.fp8_weight_cache, recipe, cfg.model.recompute,
                                                    cfg.optimizer.fp8_param_gather),
    ).to(device)
    if tcfg.tp_comm_overlap and device.type == "cuda":
        from megatron.core import parallel_state

        from infir.fp8.sp_overlap import MappingUnavailable

        try:
            reserve_overlap_buffers(parallel_state.get_tensor_model_parallel_group(), rank_tokens(cfg.stage, info),
                                    size.hidden, recipe.compute_dtype, device)
        except MappingUnavailable as e:
            raise ConfigError(f"parallel.tp_comm_overlap: {e}") from e
    graphed = False
    if _on_gpu(cfg.model.compile, device):
        # Per-layer compile fuses norms, RoPE, SwiGLU and residual adds around the GEMMs;
        # Module.compile() works in place, so parameter names and checkpoints are unchanged.
        # reduce-overhead adds CUDA graphs: for steps where issuing a layer's kernels from
        # Python takes longer than running them (compile_mode above)
        mode = compile_mode(cfg.model.compile_mode, recipe, cfg.model.recompute, device)
        # the mode's inductor options, as torch itself lists them, and where the layers hold collectives
        # (tensor or context parallel) their overlap
        overlap = OVERLAP_COLLECTIVES if info.tp > 1 or info.cp > 1 else {}
        options = {**torch._inductor.list_mode_options(mode), **overlap}
        for layer in model.decoder.layers:
            layer.compile(options=options)
        graphed = bool(options.get("triton.cudagraphs"))  # validate needs it
    if cfg.optimizer.grad_release:
        return NoDataParallel(model), graphed
    if defers_rows(model, cfg.optimizer, info.dp * info.cp, rank_tokens(cfg.stage, info)):
        separate_bucket(model)
    from megatron.core.distributed import DistributedDataParallel

    return DistributedDataParallel(tcfg, ddp_config(cfg.optimizer, info), model), graphed


class NoDataParallel(torch.nn.Module):
    """The model on one rank without megatron's DDP (optimizer.grad_release): DDP's calls the loop makes, with
    nothing to reduce, and no gradient buffers. Gradients go to each parameter's .grad, which the optimizer's
    backward hook steps on and frees."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def zero_grad_buffer(self) -> None:
        """Nothing to zero: every gradient was freed once its parameter stepped."""

    def no_sync(self):
        return contextlib.nullcontext()


def ddp_config(oc, info):
    """megatron DDP's settings from `optimizer.`: gradient buckets reduced during backward, reduce-scattered
    instead of all-reduced when the optimizer is sharded."""
    from megatron.core.distributed import DistributedDataParallelConfig

    sharded = sharded_optimizer(oc, info.dp * info.cp)
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=oc.grad_reduce_dtype == "fp32",
        overlap_grad_reduce=oc.overlap_grad_reduce,
        bucket_size=oc.bucket_size,
        use_distributed_optimizer=sharded,
        # Buckets padded to a multiple of 2**16 x DP elements: each rank's share then starts at a
        # multiple of FlashAdamW's 32-element groups in every parameter (megatron pads to 128 only).
        pad_buckets_for_high_nccl_busbw=sharded,
        # NCCL averages inside the reduce (ReduceOp.AVG): megatron otherwise scales every gradient bucket by
        # 1/DP in a pass of its own before the collective, a read and write of all gradients a step, and the
        # last bucket's pass sits between the backward's end and its exposed reduce-scatter. gloo keeps the
        # pass: it averages only in recent torch releases.
        average_in_collective=info.device.type == "cuda",
    )


def build_optimizer(cfg, ddp, params: list[torch.nn.Parameter]) -> DataParallelOptimizer:
    """`optimizer=` from infir.optim's registry over the DDP model's params (or this rank's share of
    them), with decoupled weight decay on matrices only (not on norms and biases)."""
    from infir import optim

    st, oc = cfg.stage, cfg.optimizer

    def build(groups):
        return optim.build_optimizer(oc.name, groups, lr=st.lr, betas=tuple(oc.betas), eps=oc.eps, **oc.kwargs)

    return DataParallelOptimizer(ddp, params, build, st.weight_decay)


def rank_tokens(stage, info) -> int:
    """Tokens of one micro-batch on one rank (its share of the sequence under context parallelism)."""
    return stage.micro_batch * stage.seq_length // info.cp


def grad_accumulation(stage, info) -> int:
    """Micro-batches per step and rank: the global batch over micro-batch x data-parallel size."""
    unit = stage.micro_batch * info.dp
    if stage.global_batch % unit:
        below, above = stage.global_batch // unit * unit, (stage.global_batch // unit + 1) * unit
        raise ConfigError(
            f"stage.global_batch={stage.global_batch} is not a multiple of stage.micro_batch x data-parallel ranks "
            f"({stage.micro_batch} x {info.dp} = {unit}): use {' or '.join(str(v) for v in (below, above) if v)}, "
            f"or change stage.micro_batch or the number of processes"
        )
    return stage.global_batch // (stage.micro_batch * info.dp)


def run_length(stage, train_samples: int) -> int:
    """Optimizer steps of the stage: stage.iters, or else stage.epochs over the training set (the
    schema requires one of them)."""
    if stage.iters:
        return stage.iters
    return max(1, int(stage.epochs * train_samples) // stage.global_batch)


def data_order_change(cfg, ckpt_root: Path) -> str | None:
    """Whether resuming ckpt_root's last checkpoint under `cfg` reads the training data in another
    order than the run so far (data.order_keys differ): a ConfigError naming the keys, or with
    train.allow_data_order_change=true a warning to print; None when the order is the same."""
    from infir.model import ckpt_format

    resume = checkpoint.find_resume(ckpt_root)
    meta = ckpt_format.read_meta(resume) if resume is not None else {}
    saved, now = meta.get("data_order", {}), data.order_keys(cfg)
    changed = [k for k in now if k in saved and saved[k] != now[k]]
    if not changed:
        return None
    ours = " ".join(f"{k}={now[k]}" for k in changed)
    theirs = " ".join(f"{k}={saved[k]}" for k in changed)
    change = (f"{ours} differs from {theirs} of checkpoint {resume}: resuming reads the training data in another "
              f"order from step {meta['iteration']} on")
    if not cfg.train.allow_data_order_change:
        raise ConfigError(f"{change}; resume with {theirs}, or set train.allow_data_order_change=true to accept that")
    return f"WARNING {change} (train.allow_data_order_change=true)"


class Trainer:
    def __init__(self, cfg):
        from infir.optim import optimizer_spec
        from infir.train.fp8_health import HealthMonitor

        self.cfg, st = cfg, cfg.stage
        self.info = info = distributed.init(cfg.parallel.tp, cfg.device, cp=cfg.parallel.cp)
        seed_everything(cfg.seed)
        self.device = info.device
        self.size = get_size(cfg.model.name)
        check_parallel(self.size, info.tp, st.seq_length, cfg.parallel.sequence_parallel, cp=info.cp)
        self.accum = grad_accumulation(st, info)
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        order_warning = data_order_change(cfg, self.ckpt_root)  # refused before anything of the run is rewritten
        self.log = RunLogger(cfg, self.run_dir, enabled=info.is_main)
        if order_warning:
            self.log.console(order_warning)
        if info.is_main:
            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

        # Model: the recipe's linears; params in the dtype the optimizer steps (FP32 masters for
        # torch AdamW, the weight itself in BF16 for the memory-efficient ones).
        self.recipe = precision.build_recipe(cfg.precision)
        self.optimizer_spec = optimizer_spec(cfg.optimizer.name)
        self.model, self.graphed = build_model(cfg, info, self.size, self.recipe, self.optimizer_spec.param_dtype)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.health = HealthMonitor(cfg.train.fp8_health_interval)
        self.health.attach(self.model.module)
        self.gc = StepGC(cfg.train.gc_interval)
        self.optimizer = build_optimizer(cfg, self.model, self.params)
        self._wire_gradients_and_gathers(cfg, info)

        # Data and the length of the run.
        self.train_ds, self.valid_ds = data.build_data(cfg, info, self.size.vocab)
        self.total_iters = run_length(st, len(self.train_ds))
        self.warmup = resolve_warmup(st.warmup_iters, self.total_iters)
        self.tokens_per_step = st.global_batch * st.seq_length
        self.flops_per_token = flops_per_token(self.size, st.seq_length)
        self.peak = peak_tflops(self.device)

        sp = cfg.train.spike
        self.spike = SpikePolicy(sp.action, sp.factor, sp.window)
        # train.async_save: checkpoints written by a thread from host copies while training goes on
        self.staging = checkpoint.HostStaging(self.device) if cfg.train.async_save else None
        self.staging_bytes, self.staging_seconds = None, 0.0  # its buffers' size once made (first step), and how long that took
        self._pending = None  # the checkpoint being written
        self.step, self.skipped = self._start()
        self.skips_in_a_row = 0  # steps skipped since the last good one (train.max_skips); not carried across launches
        self._stop_signal = None

    def _wire_gradients_and_gathers(self, cfg, info) -> None:
        """How gradients reach the optimizer and parameters the forward: released inside the backward
        (optimizer.grad_release), the embedding's last rows after the reduction (embedding_rows.py), the sharded
        optimizer's gathers one bucket ahead of the forward, in FP8 or BF16 where they can be."""
        grad_ranks = info.dp * info.cp
        self.embedding_rows = (DeferredRows(self.model, self._dp_group(), grad_ranks)
                               if defers_rows(self.model.module, cfg.optimizer, grad_ranks, rank_tokens(cfg.stage, info))
                               else None)
        if cfg.optimizer.grad_release:
            if info.world_size != 1 or self.accum != 1:
                raise ConfigError(f"optimizer.grad_release=true steps each parameter inside one backward on one rank; this "
                                  f"run has {info.world_size} rank(s) and {self.accum} micro-batch(es) a step: launch one "
                                  f"process with stage.global_batch = stage.micro_batch, or set optimizer.grad_release=false")
            self.optimizer.release_grads(self.model)
        if self.optimizer.sharded:
            overlap_gathers_with_forward(self.model.module, self.optimizer)
        fp8, bf16 = (fp8_param_gather(cfg.optimizer, self.recipe, self.optimizer.sharded),
                     bf16_param_gather(self.recipe, self.optimizer.sharded))
        if fp8 or bf16:
            self.optimizer.narrow_gathers(self.model.module, fp8=fp8, bf16=bf16)

    def _start(self) -> tuple[int, int]:
        """(step, skipped steps) to start at: a checkpoint of this run dir resumes it, and wins over
        init_from (the weights of an earlier stage)."""
        resume = checkpoint.find_resume(self.ckpt_root)
        if resume is not None:
            state = self._load(resume)
            self.log.console(f"resumed from {resume} at step {state['step']}")
            return state["step"], state.get("skipped", 0)
        if self.cfg.init_from:
            from infir.model import ckpt_format

            src = ckpt_format.resolve(self.cfg.init_from)
            checkpoint.load_weights(src, self.model.module, self.info)
            self.log.console(f"initialised weights from {src}")
        return 0, 0

    def _load(self, resume: Path) -> dict:
        """Weights, optimizer, RNG and spike-window state of checkpoint `resume`; its trainer state."""
        self.optimizer.finish_gathers()  # a gather still in flight would overwrite the loaded weights
        checkpoint.load_weights(resume, self.model.module, self.info)
        state = checkpoint.load_trainer(resume, self.optimizer, self.info)
        self.spike.load_state_dict(state.get("spike"))
        return state

    def _on_signal(self, signum, frame):
        if signum == signal.SIGINT and self._stop_signal is not None:
            signal.default_int_handler(signum, frame)  # Ctrl-C while already stopping: stop now, without saving
        self._stop_signal = signal.Signals(signum).name
        if signum == signal.SIGINT and self.info.is_main:
            # os.write, not print: a handler that prints while the loop prints raises a reentrant-call error
            os.write(2, b"infir-train: Ctrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again: stop at once, unsaved)\n")

    # ------------------------------------------------------------------ one step
    def lr(self, step: int) -> float:
        st = self.cfg.stage
        return lr_at(step, total=self.total_iters, lr=st.lr, min_lr=st.min_lr, warmup=self.warmup, schedule=st.schedule, decay=st.decay_iters)

    def _micro_batches(self, step: int) -> list[dict]:
        st, info = self.cfg.stage, self.info
        out = []
        for micro in range(self.accum):
            idx = batching.sample_indices(
                step, micro, global_batch=st.global_batch, micro_batch=st.micro_batch, dp=info.dp,
                dp_rank=info.dp_rank, num_samples=len(self.train_ds), seed=self.cfg.seed,
                shuffle=not getattr(self.train_ds, "sequential", False),
            )
            out.append(self._inputs([self.train_ds[i] for i in idx]))
        return out

    def _inputs(self, samples: list[dict]) -> dict:
        """A micro-batch on this rank's device: the tokens of its context-parallel share."""
        return batching.to_model_inputs(batching.collate(samples), self.device, self.info.cp, self.info.cp_rank)

    def _forward(self, mb: dict) -> torch.Tensor:
        """The loss_mask-weighted sum of token losses of one micro-batch (of this rank's tokens)."""
        with precision.autocast(self.recipe, self.device):
            out = self.model(mb["input_ids"], mb["position_ids"], None, labels=mb["labels"], loss_mask=mb["loss_mask"],
                             packed_seq_params=mb["packed_seq_params"])
        return out if self.model.module.chunked_loss else (out.float() * mb["loss_mask"]).sum()

    def train_step(self, step: int) -> dict:
        if self.cfg.optimizer.grad_release:
            return self._released_step(step)
        # the loss and the gradient norm reach the host in one copy: a wait for each left the GPU idle while the
        # host queued the norm's kernels after the first
        loss, grad_norm = torch.stack([self._forward_backward(self._micro_batches(step)), self._grad_norm()]).tolist()
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        spike = finite and self.spike.is_spike(grad_norm)
        if finite and not spike:
            self._optimizer_step(step, grad_norm)
        return {"loss": loss, "grad_norm": grad_norm, "finite": finite, "spike": spike, "lr": self.lr(step)}

    def _released_step(self, step: int) -> dict:
        """A step under gradient release: each parameter steps in its backward hook, so what the update needs is
        settled before backward: the learning rate, and a finite loss (a non-finite one gets no backward, and
        train.on_nan decides as for any step). No gradient exists whole, so there is no gradient norm."""
        (mb,) = self._micro_batches(step)
        self.optimizer.set_lr(self.lr(step))
        n_tokens = mb["loss_mask"].sum().clamp(min=1)
        loss = self._forward(mb) / n_tokens
        value = loss.item()
        finite = math.isfinite(value)
        if finite:
            self._before_writes()  # the backward steps the parameters
            loss.backward()
            self._optimizer_step(step, None)  # parameters no hook stepped; the FP8 weight caches marked stale
        return {"loss": value, "grad_norm": float("nan"), "finite": finite, "spike": False, "lr": self.lr(step)}

    def _forward_backward(self, micro_batches: list[dict]) -> torch.Tensor:
        """Gradients of the global batch's token-mean loss in DDP's `main_grad`, reduced over DP; the loss (FP64,
        on the device)."""
        # Normalise by the global batch's loss tokens, so accumulation and DP give the exact token mean. Counted
        # on the host and summed through gloo: a GPU collective here would queue behind the previous step's
        # parameter all-gathers on the data-parallel communicator, and the forward would wait for all of them
        # instead of for each layer's own bucket. The sum is needed only at the first backward: the first
        # forward is queued while the ranks meet, and the GPU does not idle for them.
        count = torch.tensor([sum(mb["loss_tokens"] for mb in micro_batches)], dtype=torch.float64)
        counted = dist.all_reduce(count, group=self._dp_group(gloo=True), async_op=True)
        self.model.zero_grad_buffer()
        loss_sum = torch.zeros((), device=self.device)
        rows = self.embedding_rows
        for i, mb in enumerate(micro_batches):
            # DDP reduces each bucket as the last micro-batch's backward completes it
            last = i == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last else self.model.no_sync()
            with sync:
                if last and rows is not None:
                    rows.before_last_forward()
                loss = self._forward(mb)
                if i == 0:
                    counted.wait()
                    n_tokens = max(float(count), 1.0)
                if last and rows is not None:
                    rows.before_last_backward()
                # megatron DDP averages gradients over the DP x CP ranks; undo that share of the mean here.
                (loss * (self.info.dp * self.info.cp / n_tokens)).backward()
            loss_sum += loss.detach()
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])  # DP x CP all-reduce, plus TP all-reduce of sequence-parallel norm grads
        if rows is not None:
            rows.after_reduction()
        dist.all_reduce(loss_sum, group=self._dp_group())
        return (loss_sum / n_tokens).double()  # the FP32 mean, exact in FP64

    def _before_writes(self) -> None:
        """The parameters and optimizer states are written from here on: after the last save's copies of them."""
        if self.staging is not None:
            self.staging.before_writes()

    def _optimizer_step(self, step: int, grad_norm: float | None) -> None:
        self._before_writes()
        lr = self.lr(step)
        self.optimizer.step(lr, grads_in_dot_grad=not self.optimizer_spec.reads_main_grad, grad_scale=self._clip(grad_norm))
        precision.after_optimizer_step(self.model.module, lr)
        if self.staging is not None and self.staging_bytes is None:
            self._reserve_staging()

    def _reserve_staging(self) -> None:
        """The asynchronous save's host buffers, made once the optimizer's states exist: pinning them takes
        seconds at 7B (tens of GiB a rank), paid here, beside the first step's compilation, not as a stall of
        the first checkpoint."""
        start = time.perf_counter()
        self.staging_bytes = checkpoint.reserve(self.staging, model=self.model.module, optimizer=self.optimizer, info=self.info)
        self.staging_seconds = time.perf_counter() - start
        if self.staging_seconds >= 1.0:
            self.log.console(f"train.async_save: {self.staging_bytes / 2**30:.1f} GiB of host memory for checkpoint "
                             f"copies, made in {self.staging_seconds:.1f} s")

    def _clip(self, grad_norm: float | None) -> torch.Tensor | None:
        """Scale the gradients to a norm of stage.grad_clip when they exceed it: in place, or by the
        divisor returned for optimizers that apply it inside their fused step."""
        clip = self.cfg.stage.grad_clip
        if not clip or grad_norm is None or grad_norm <= clip:
            return None
        coef = clip / (grad_norm + 1e-6)
        if all(self.optimizer_spec.clips_in_step(o) for o in self.optimizer.optimizers):
            return torch.full((), 1.0 / coef, device=self.device)
        self.optimizer.scale_grads(coef)
        return None

    def _dp_group(self, gloo: bool = False):
        """The ranks whose tokens make up the global batch: data- and context-parallel (gloo: megatron's host-side
        group of them)."""
        from megatron.core import parallel_state as ps

        if gloo:
            return ps.get_data_parallel_group_gloo(with_context_parallel=True)
        return ps.get_data_parallel_group(with_context_parallel=True)

    def _grad_norm(self) -> torch.Tensor:
        """Global L2 norm of the gradients, counting each tensor-parallel-replicated parameter once (FP64, on the
        device)."""
        from megatron.core import parallel_state as ps

        sq = self.optimizer.grad_norm_sq()
        dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        # rounded to FP32: shard-order differences of the FP64 sum stay below its precision
        return sq.sqrt().float().double()

    @torch.no_grad()
    def validate(self) -> float | None:
        if self.valid_ds is None or not self.cfg.train.eval_iters:
            return None
        st, info = self.cfg.stage, self.info
        total = torch.zeros(2, device=self.device)
        n = min(self.cfg.train.eval_iters * st.micro_batch * info.dp, len(self.valid_ds))
        # CUDA-graphed layers cannot run a forward without a backward to follow: torch's cudagraph
        # trees then start a new generation at each layer's call, which frees the output of the layer
        # before it while the next one still reads it (the first parity runs under graphs stopped at
        # their validation). Validation is a few micro-batches: it runs the layers eagerly instead.
        stance = torch.compiler.set_stance("force_eager") if self.graphed else contextlib.nullcontext()
        with stance:
            for start in range(info.dp_rank * st.micro_batch, n, st.micro_batch * info.dp):
                idx = list(range(start, min(start + st.micro_batch, n)))
                mb = self._inputs([self.valid_ds[i] for i in idx])
                total += torch.stack([self._forward(mb), mb["loss_mask"].sum()])
        dist.all_reduce(total, group=self._dp_group())
        return (total[0] / total[1].clamp(min=1)).item()

    # ------------------------------------------------------------------ the loop
    def save(self) -> None:
        """Checkpoint this step: with train.async_save, written in the background and committed by the next
        `wait_save` (the next save, the run's end), else before this returns."""
        self.wait_save()  # one at a time: the staging buffers hold the previous one until it is written
        self.optimizer.finish_gathers()  # the weights as the last step left them
        meta = {
            "model_name": self.cfg.model.name,
            "model": {k: getattr(self.size, k) for k in self.size.__dataclass_fields__},
            "tokenizer": str(data.tokenizer_dir(self.cfg) or "") or None,
            "precision": self.cfg.precision.name,
            "recipe": self.cfg.precision.recipe,  # what `infir-convert mcore-to-hf --fp8` quantizes with
            "stage": self.cfg.stage.name,
            "run_name": self.cfg.run_name,
            "data_order": data.order_keys(self.cfg),
        }
        self._pending = checkpoint.save(
            self.ckpt_root, self.step, model=self.model.module, optimizer=self.optimizer,
            trainer_state={"step": self.step, "skipped": self.skipped, "spike": self.spike.state_dict()}, meta=meta, info=self.info,
            keep_last=self.cfg.train.keep_last, staging=self.staging,
        )
        if self.staging is None:
            self.wait_save()

    def wait_save(self) -> Path | None:
        """Wait, on every rank together, for the checkpoint being written to be committed; its path (None:
        none was being written). A failed write anywhere stops the run (CheckpointWriteError)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            path = pending.wait()
        except checkpoint.CheckpointWriteError as e:
            try:  # a full disk may refuse this too; the error itself still reaches the user
                self._summary("failed", error=str(e))
            except OSError:
                pass
            raise
        self.log.console(f"saved checkpoint {path}")
        return path

    def _saved_at(self) -> int | None:
        self.wait_save()
        resume = checkpoint.find_resume(self.ckpt_root)
        return None if resume is None else int(resume.name.split("_")[1])

    def _summary(self, status: str, **extra) -> None:
        cfg = self.cfg
        self.log.summary({
            "run_name": cfg.run_name, "model": cfg.model.name, "precision": cfg.precision.name,
            "optimizer": cfg.optimizer.name, "stage": cfg.stage.name, "status": status, "step": self.step,
            "total_iters": self.total_iters, "tp": self.info.tp, "cp": self.info.cp, "dp": self.info.dp, **extra,
        })

    def train(self) -> dict:
        """Steps to stage end, or until SIGTERM/SIGUSR1 (a scheduler's preemption notice) or Ctrl-C asks to
        save and stop; a second Ctrl-C raises KeyboardInterrupt at once.

        The handlers live only while the loop runs: a process that keeps the trainer around (a bench,
        a notebook) keeps its own handlers, and the handler's bound method does not pin the trainer
        (its model, optimizer states) in memory once it is dropped.
        """
        stops = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
        # A SIGINT the process ignores (a shell's background job) stays ignored, as Python leaves it.
        stops = [sig for sig in stops if sig != signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN]
        previous = {sig: signal.signal(sig, self._on_signal) for sig in stops}
        try:
            with self.gc:
                return self._train_loop()
        except BaseException as e:
            if self._pending is not None:  # the run stops on an error: its save is given up, `latest` stays
                self._pending.abandon()
            if isinstance(e, torch.OutOfMemoryError):  # the run dir says why the run ended where it did
                self._summary("failed", error=f"out of GPU memory in step {self.step + 1}")
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _train_loop(self) -> dict:
        tr = self.cfg.train
        self._summary("running")
        self.log.console(
            f"{self.cfg.run_name}: {self.size.num_params() / 1e6:.1f}M params, tp={self.info.tp} cp={self.info.cp} dp={self.info.dp}, "
            f"{self.total_iters} steps x {format_si(self.tokens_per_step)} tokens, accumulation {self.accum}, device {self.device}, precision {self.recipe.name}"
        )
        from megatron.core import parallel_state as ps

        splits = splits_around_gemms(self.recipe, rank_tokens(self.cfg.stage, self.info) // self.info.tp)
        schedule = sequence_parallel_schedule(self.cfg.parallel.sequence_parallel, self.cfg.parallel.tp_comm_overlap,
                                              splits, ps.get_tensor_model_parallel_group())
        if schedule:
            self.log.console(f"tensor parallel: {schedule}")
        if self.optimizer.sharded:
            how = self.optimizer.gather_dtypes
            self.log.console(f"optimizer states sharded over {self.info.dp * self.info.cp} ranks; parameter all-gather "
                             f"{self.optimizer.gather_bytes / 2**20:.1f} MiB a step from each rank{f' ({how})' if how else ''}")
        launch_steps, window, last = 0, _Window(), {}
        while self.step < self.total_iters:
            out = self._monitored_step()
            if not out["finite"]:
                self._handle_non_finite(out)
                continue
            if out["spike"]:
                self._handle_spike(out)
                continue
            self.skips_in_a_row = 0
            self.step += 1
            self.gc.after_step(self.step)
            launch_steps += 1
            window.steps += 1
            last = {"loss": out["loss"], "grad_norm": out["grad_norm"]}
            if self._due(tr.log_interval):
                self._log_progress(out, window)
            if tr.eval_interval and self._due(tr.eval_interval):
                last.update(self._log_validation())
            stop = self._stop_signal or (tr.exit_after and launch_steps >= tr.exit_after)
            if self._due(tr.save_interval) or stop:
                self.save()
                self.log.plot()
            if stop:
                self.wait_save()
                self.log.console(f"stopping at step {self.step} ({self._stop_signal or 'train.exit_after'}); rerun the same command to resume")
                self._summary("interrupted", **last)
                return last
            if not window.steps:  # validation and checkpoints stay out of the next window's time
                window.restart()
        if self._saved_at() != self.step:  # the last steps were skipped, and no save follows a skipped step
            self.save()
        self.wait_save()
        self._summary("finished", **last, **self._final_rates())
        self.log.plot()
        self.log.finish()
        return last

    def close(self) -> None:
        """Ends what this trainer left running, for a process that goes on without it (a bench's next case,
        a test): the parameter gathers the last step started (bench cases torn down with gathers pending left the
        whole parameter buffer allocated on GPUs, as an unwaited collective's tensors may stay held), the
        checkpoint being written, the logger."""
        self.optimizer.finish_gathers()
        self.wait_save()
        self.log.finish()

    def _due(self, interval: int) -> bool:
        """Every `interval` steps, and at the last step."""
        return self.step % interval == 0 or self.step == self.total_iters

    def _monitored_step(self) -> dict:
        """train_step, with the FP8 health readings of the steps the monitor samples."""
        self.health.begin_step(self.step + 1)
        if self.health.active:
            self.optimizer.finish_gathers()  # the monitor reads the weights themselves
        out = self.train_step(self.step)
        health, warnings = self.health.end_step(self.step + 1)
        if health:
            self.log.log({"step": self.step + 1, **health})
            for w in warnings:
                self.log.console(f"WARNING fp8 health, step {self.step + 1}: {w}")
        return out

    def _log_progress(self, out: dict, window: "_Window") -> None:
        """One progress line (and metrics record) over the steps since the last one."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - window.start
        rec = self._throughput(window.steps, dt)
        rec.update(step=self.step, consumed_tokens=self.step * self.tokens_per_step, loss=out["loss"], lr=out["lr"], grad_norm=out["grad_norm"])
        self.log.log(rec)
        eta = (self.total_iters - self.step) * dt / window.steps
        mfu = f" | MFU {100 * rec['mfu']:.1f}%" if rec["mfu"] is not None else ""
        mem = f" | peak {rec['peak_mem_gib']:.1f} GiB" if rec["peak_mem_gib"] is not None else ""
        self.log.console(
            f"step {self.step}/{self.total_iters} | loss {out['loss']:.4f} | lr {out['lr']:.2e} | gnorm {out['grad_norm']:.3f} | "
            f"{format_si(rec['tokens_per_s'])} tok/s | {rec['tflops']:.1f} TFLOP/s/GPU{mfu}{mem} | ETA {format_duration(eta)}"
        )
        window.restart()

    def _log_validation(self) -> dict:
        """{"val_loss": ...} after logging it, or {} without validation data."""
        val = self.validate()
        if val is None:
            return {}
        self.log.log({"step": self.step, "consumed_tokens": self.step * self.tokens_per_step, "val_loss": val})
        self.log.console(f"step {self.step} | validation loss {val:.4f}")
        return {"val_loss": val}

    def _throughput(self, steps: int, seconds: float) -> dict:
        tps = steps * self.tokens_per_step / max(seconds, 1e-9)
        # Per GPU, as Megatron reports it: tokens_per_step counts every rank's tokens, and MFU is against one GPU's peak
        # (the job's total over one GPU's peak read 113% at 7B on two GPUs).
        tflops = tps * self.flops_per_token / 1e12 / self.info.world_size
        rec = {"tokens_per_s": tps, "tflops": tflops, "mfu": tflops / self.peak if self.peak else None, "elapsed_s": time.time() - self.log.start_time}
        # peak_mem_gib: the most the caching allocator held from the GPU. The peak of allocated tensors (peak_alloc_gib)
        # misses what CUDA-graphed layers use: their replays write into the graphs' memory pool without allocating.
        cuda = self.device.type == "cuda"
        rec["peak_mem_gib"] = torch.cuda.max_memory_reserved(self.device) / 2**30 if cuda else None
        rec["peak_alloc_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30 if cuda else None
        # this rank's optimizer states on its device: what ZeRO-1 divides over the data-parallel ranks
        rec["optim_state_gib"] = self.optimizer.state_bytes(self.device) / 2**30
        self._last_rates = rec
        return rec

    def _final_rates(self) -> dict:
        rates = getattr(self, "_last_rates", {})
        return {k: rates.get(k) for k in ("tokens_per_s", "tflops", "mfu", "peak_mem_gib", "peak_alloc_gib",
                                          "optim_state_gib")}

    def _handle_non_finite(self, out: dict) -> None:
        tr = self.cfg.train
        what = f"non-finite step {self.step + 1}: loss={out['loss']}, grad norm={out['grad_norm']}"
        if tr.on_nan == "skip" and self.skips_in_a_row < tr.max_skips:
            self.skipped += 1
            self.step += 1  # the step's data is consumed; the weights did not change
            self._count_skip(f"WARNING {what}: step skipped")
            return
        tries = ["lower stage.lr", "check the data"]
        if self.recipe.fp8:
            tries.append("try precision=bf16 to rule out FP8 overflow")
        if tr.on_nan == "skip":
            what += f", with train.max_skips={tr.max_skips} steps skipped in a row already"
            tries.append("raise train.max_skips")
        else:
            tries.append("set train.on_nan=skip to skip such steps")
        self._stop(NonFiniteError, what, tries)

    def _handle_spike(self, out: dict) -> None:
        """train.spike's action on a step whose grad norm spiked (the optimizer did not step)."""
        sp, max_skips = self.cfg.train.spike, self.cfg.train.max_skips
        what = (f"grad-norm spike at step {self.step + 1}: {out['grad_norm']:.4g} > {sp.factor:g} x {self.spike.median():.4g}, "
                f"the median of the last {sp.window} steps")
        if self.skips_in_a_row >= max_skips:
            what += f", with train.max_skips={max_skips} steps skipped in a row already"
            self._stop(SpikeError, what, ["lower stage.lr", "check the data", "raise train.spike.factor or train.max_skips"])
        self.wait_save()  # a rollback goes to the last checkpoint, the one being written included
        resume = checkpoint.find_resume(self.ckpt_root) if sp.action == "rollback" else None
        if resume is None:  # skip, or a rollback before the first checkpoint
            self.skipped += 1
            self.step += 1
            self._count_skip(f"WARNING {what}: step skipped")
            return
        state = self._load(resume)
        # Every step since the checkpoint is undone: its data stays unread, as the spike's own.
        self.skipped = state.get("skipped", 0) + self.step + 1 - state["step"]
        self.step += 1
        span = f"step {self.step}" if state["step"] + 1 == self.step else f"steps {state['step'] + 1}-{self.step}"
        self._count_skip(f"WARNING {what}: rolled back to {resume} (step {state['step']}), the data of {span} skipped")

    def _count_skip(self, line: str) -> None:
        self.skips_in_a_row += 1
        self.log.console(f"{line} ({self.skips_in_a_row} in a row, train.max_skips={self.cfg.train.max_skips}; "
                         f"{self.skipped} skipped in all)")
        self.log.log({"step": self.step, "skipped_steps": self.skipped})

    def _stop(self, error: type, what: str, tries: list[str]) -> None:
        """Keep the weights of the last good step, then raise `error`: what happened and what to try."""
        if self._saved_at() != self.step and self.step > 0:
            self.save()
        self.wait_save()
        self._summary("failed", error=what)
        self.log.plot()
        advice = ", ".join(tries[:-1]) + f", or {tries[-1]}"
        raise error(f"{what}. The weights of step {self.step} are saved in {self.ckpt_root}. {advice[0].upper()}{advice[1:]}.")


class _Window:
    """The steps and wall time since the last progress line."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        self.start, self.steps = time.perf_counter(), 0
