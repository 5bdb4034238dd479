"""The training loop, read top to bottom: `Trainer.__init__` builds everything in order (processes,
model, DDP, optimizer, data, resume), `train_step` runs one optimizer step over its micro-batches,
`train` loops, validates, logs and checkpoints.

Precision: master weights, gradients (megatron DDP's fp32 `main_grad` buffers) and optimizer states
are FP32; the forward/backward compute dtype is the recipe's (BF16 autocast, or FP8 linears).
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from infir.model import build_gpt, check_parallel, get_size, transformer_config
from infir.model.cpu_shims import seed_everything
from infir.train import batch as batching
from infir.train import checkpoint, data, dist as distributed
from infir.train.flops import flops_per_token, peak_tflops
from infir.train.gc_control import StepGC
from infir.train.metrics import RunLogger, format_duration, format_si
from infir.train import precision
from infir.train.schedule import lr_at, resolve_warmup


def _on_gpu(choice, device: torch.device) -> bool:
    """A true/false/auto switch where auto means: on CUDA devices."""
    return device.type == "cuda" if choice == "auto" else bool(choice)


def compile_mode(choice: str, recipe, recompute: str, device: torch.device) -> str:
    """torch.compile's mode for each layer; auto: CUDA graphs (reduce-overhead) where the recipe asks for
    them (the blockwise FP8 recipes: their layers issue more kernels than BF16's around shorter GEMMs, so
    their step waits on the host, bench/step.py's graphs rows), on a GPU and without recomputation (no
    run has used graphs with it), the default mode otherwise."""
    if choice != "auto":
        return choice
    graphs = device.type == "cuda" and recipe.cuda_graphs and recompute == "none"
    return "reduce-overhead" if graphs else "default"


class NonFiniteError(RuntimeError):
    """A NaN/Inf loss or gradient norm stopped the run (the last good checkpoint is kept)."""


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        st = cfg.stage
        self.info = info = distributed.init(cfg.parallel.tp, cfg.device)
        seed_everything(cfg.seed)
        self.device = info.device
        self.size = get_size(cfg.model.name)
        check_parallel(self.size, info.tp, st.seq_length, cfg.parallel.sequence_parallel)
        if st.global_batch % (st.micro_batch * info.dp):
            raise ValueError(
                f"stage.global_batch={st.global_batch} must be a multiple of stage.micro_batch x data-parallel size "
                f"({st.micro_batch} x {info.dp})"
            )
        self.accum = st.global_batch // (st.micro_batch * info.dp)
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.log = RunLogger(cfg, self.run_dir, enabled=info.is_main)
        if info.is_main:
            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

        # Model: megatron GPTModel from our spec, the recipe's linears, FP32 master weights.
        self.recipe = precision.build_recipe(cfg.precision)
        from infir.optim import required_param_dtype

        # FP32 masters for torch AdamW; the memory-efficient optimizers keep the weight itself in BF16.
        self.param_dtype = required_param_dtype(cfg.optimizer.name)
        tcfg = transformer_config(
            self.size,
            tp=info.tp,
            sequence_parallel=cfg.parallel.sequence_parallel,
            params_dtype=self.param_dtype,
            init_std=cfg.model.init_std,
            recompute=cfg.model.recompute,
            cpu_init=cfg.model.cpu_init,
            fusions=_on_gpu(cfg.model.fusions, self.device),
            autocast_dtype=None if self.recipe.compute_dtype == torch.float32 else self.recipe.compute_dtype,
        )
        model = build_gpt(
            self.size, tcfg, self.recipe, seq_length=st.seq_length,
            chunked_loss=_on_gpu(cfg.model.chunked_loss, self.device), loss_chunk_tokens=cfg.model.loss_chunk_tokens,
        ).to(self.device)
        self.graphed = False
        if _on_gpu(cfg.model.compile, self.device):
            # Per-layer compile fuses norms, RoPE, SwiGLU and residual adds around the GEMMs;
            # Module.compile() works in place, so parameter names and checkpoints are unchanged.
            # reduce-overhead adds CUDA graphs: for steps where issuing a layer's kernels from
            # Python takes longer than running them (compile_mode above)
            mode = compile_mode(cfg.model.get("compile_mode", "auto"), self.recipe, cfg.model.recompute,
                                self.device)
            for layer in model.decoder.layers:
                layer.compile(mode=None if mode == "default" else mode)
            # whether torch.compile's mode replays CUDA graphs, as torch itself lists it (validate needs it)
            self.graphed = bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        self.model = DistributedDataParallel(
            tcfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False), model
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        from infir.train.fp8_health import HealthMonitor

        self.health = HealthMonitor(cfg.train.fp8_health_interval)
        self.health.attach(model)
        self.gc = StepGC(cfg.train.get("gc_interval"))

        # Optimizer: decoupled weight decay on matrices only (not on norms and biases).
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        self.optimizer = self._build_optimizer(
            [{"params": decay, "weight_decay": st.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        )

        # Data and the length of the run.
        self.train_ds, self.valid_ds = data.build(cfg, info, self.size.vocab)
        if st.iters:
            self.total_iters = int(st.iters)
        elif st.epochs:
            self.total_iters = max(1, int(st.epochs * len(self.train_ds)) // st.global_batch)
        else:
            raise ValueError("stage.iters or stage.epochs must be set")
        self.warmup = resolve_warmup(st.warmup_iters, self.total_iters)
        self.tokens_per_step = st.global_batch * st.seq_length
        self.flops_per_token = flops_per_token(self.size, st.seq_length)
        self.peak = peak_tflops(self.device)

        # Resume (same run dir) wins over init_from (weights of an earlier stage).
        self.step = 0
        self.skipped = 0
        resume = checkpoint.find_resume(self.ckpt_root)
        if resume is not None:
            checkpoint.load_weights(resume, self.model.module, info)
            state = checkpoint.load_trainer(resume, self.optimizer, info)
            self.step, self.skipped = state["step"], state.get("skipped", 0)
            self.log.console(f"resumed from {resume} at step {self.step}")
        elif cfg.init_from:
            from infir.model import ckpt_format

            src = ckpt_format.resolve(cfg.init_from)
            checkpoint.load_weights(src, self.model.module, info)
            self.log.console(f"initialised weights from {src}")
        self._stop_signal = None

    def _build_optimizer(self, groups):
        """`optimizer=` by name from infir.optim's registry (torch AdamW for `adamw`).

        torch AdamW steps on `.grad`, which we point at DDP's FP32 `main_grad`; infir.optim's
        optimizers read `main_grad` themselves (their params are BF16, so `.grad` cannot hold it).
        """
        from infir.optim import build_optimizer

        st, oc = self.cfg.stage, self.cfg.optimizer
        self.grads_in_dot_grad = oc.name == "adamw"
        return build_optimizer(oc.name, groups, lr=st.lr, betas=tuple(oc.betas), eps=oc.eps, **oc.get("kwargs", {}))

    def _on_signal(self, signum, frame):
        self._stop_signal = signal.Signals(signum).name

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
            out.append(batching.to_model_inputs(batching.collate([self.train_ds[i] for i in idx]), self.device))
        return out

    def _forward(self, mb: dict) -> torch.Tensor:
        """The loss_mask-weighted sum of token losses of one micro-batch."""
        with precision.autocast(self.recipe, self.device):
            out = self.model(mb["input_ids"], mb["position_ids"], mb["attention_mask"], labels=mb["labels"], loss_mask=mb["loss_mask"])
        return out if self.model.module.chunked_loss else (out.float() * mb["loss_mask"]).sum()

    def train_step(self, step: int) -> dict:
        micro_batches = self._micro_batches(step)
        # Normalise by the global batch's loss tokens, so accumulation and DP give the exact token mean.
        n_tokens = torch.stack([mb["loss_mask"].sum() for mb in micro_batches]).sum()
        dist.all_reduce(n_tokens, group=self._dp_group())
        n_tokens = n_tokens.clamp(min=1)
        self.model.zero_grad_buffer()
        loss_sum = torch.zeros((), device=self.device)
        for mb in micro_batches:
            loss = self._forward(mb)
            # megatron DDP averages gradients over DP ranks; undo that share of the mean here.
            (loss * (self.info.dp / n_tokens)).backward()
            loss_sum += loss.detach()
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])  # DP all-reduce, plus TP all-reduce of sequence-parallel norm grads
        dist.all_reduce(loss_sum, group=self._dp_group())
        loss = (loss_sum / n_tokens).item()
        grad_norm = self._grad_norm()
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if finite:
            clip = self.cfg.stage.grad_clip
            if self.grads_in_dot_grad:
                for p in self.params:
                    p.grad = p.main_grad
            if clip and grad_norm > clip:
                coef = clip / (grad_norm + 1e-6)
                if getattr(self.optimizer, "defaults", {}).get("fused") and self.grads_in_dot_grad:
                    # torch's fused Adam divides the gradients by `grad_scale` inside its kernel:
                    # the clip costs no extra pass over the gradients.
                    self.optimizer.grad_scale = torch.full((), 1.0 / coef, device=self.device)
                else:
                    torch._foreach_mul_([p.main_grad for p in self.params], coef)
            lr = self.lr(step)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.optimizer.step()
            self.optimizer.grad_scale = None
            for p in self.params:
                p.grad = None  # DDP's hooks accumulate into main_grad; a stale .grad would be added twice
            precision.after_optimizer_step(self.model.module, lr)
        return {"loss": loss, "grad_norm": grad_norm, "finite": finite, "lr": self.lr(step)}

    def _dp_group(self):
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_group()

    def _grad_norm(self) -> float:
        """Global L2 norm of the gradients, counting each tensor-parallel-replicated parameter once."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        grads = [p.main_grad for p in self.params if param_is_not_tensor_parallel_duplicate(p)]
        sq = torch.stack(torch._foreach_norm(grads)).float().pow(2).sum() if grads else torch.zeros((), device=self.device)
        dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        return sq.sqrt().item()

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
                mb = batching.to_model_inputs(batching.collate([self.valid_ds[i] for i in idx]), self.device)
                total += torch.stack([self._forward(mb), mb["loss_mask"].sum()])
        dist.all_reduce(total, group=self._dp_group())
        return (total[0] / total[1].clamp(min=1)).item()

    # ------------------------------------------------------------------ the loop
    def save(self) -> Path:
        meta = {
            "model_name": self.cfg.model.name,
            "model": {k: getattr(self.size, k) for k in self.size.__dataclass_fields__},
            "tokenizer": str(data.tokenizer_dir(self.cfg) or "") or None,
            "precision": self.cfg.precision.name,
            "stage": self.cfg.stage.name,
            "run_name": self.cfg.run_name,
        }
        try:
            path = checkpoint.save(
                self.ckpt_root, self.step, model=self.model.module, optimizer=self.optimizer,
                trainer_state={"step": self.step, "skipped": self.skipped}, meta=meta, info=self.info,
                keep_last=self.cfg.train.keep_last,
            )
        except checkpoint.CheckpointWriteError as e:
            try:  # a full disk may refuse this too; the error itself still reaches the user
                self._summary("failed", error=str(e))
            except OSError:
                pass
            raise
        self.log.console(f"saved checkpoint {path}")
        return path

    def _saved_at(self) -> int | None:
        resume = checkpoint.find_resume(self.ckpt_root)
        return None if resume is None else int(resume.name.split("_")[1])

    def _summary(self, status: str, **extra) -> None:
        cfg = self.cfg
        self.log.summary({
            "run_name": cfg.run_name, "model": cfg.model.name, "precision": cfg.precision.name,
            "optimizer": cfg.optimizer.name, "stage": cfg.stage.name, "status": status, "step": self.step,
            "total_iters": self.total_iters, "tp": self.info.tp, "dp": self.info.dp, **extra,
        })

    def train(self) -> dict:
        """Steps to stage end, or until SIGTERM/SIGUSR1 (a scheduler's preemption notice) asks to save and stop.

        The handlers live only while the loop runs: a process that keeps the trainer around (a bench,
        a notebook) keeps its own handlers, and the handler's bound method does not pin the trainer
        (its model, optimizer states) in memory once it is dropped.
        """
        stops = (signal.SIGTERM, signal.SIGUSR1)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in stops}
        try:
            with self.gc:
                return self._train_loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _train_loop(self) -> dict:
        cfg, tr = self.cfg, self.cfg.train
        self._summary("running")
        self.log.console(
            f"{cfg.run_name}: {self.size.num_params() / 1e6:.1f}M params, tp={self.info.tp} dp={self.info.dp}, "
            f"{self.total_iters} steps x {format_si(self.tokens_per_step)} tokens, accumulation {self.accum}, device {self.device}, precision {self.recipe.name}"
        )
        start_step, launch_steps = self.step, 0
        window_t, window_steps = time.perf_counter(), 0
        last = {}
        while self.step < self.total_iters:
            self.health.begin_step(self.step + 1)
            out = self.train_step(self.step)
            health, warnings = self.health.end_step(self.step + 1)
            if health:
                self.log.log({"step": self.step + 1, **health})
                for w in warnings:
                    self.log.console(f"WARNING fp8 health, step {self.step + 1}: {w}")
            if not out["finite"]:
                self._handle_non_finite(out)
                continue
            self.step += 1
            self.gc.after_step(self.step)
            launch_steps += 1
            window_steps += 1
            last = {"loss": out["loss"], "grad_norm": out["grad_norm"]}
            if self.step % tr.log_interval == 0 or self.step == self.total_iters:
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                dt = time.perf_counter() - window_t
                rec = self._throughput(window_steps, dt)
                rec.update(step=self.step, consumed_tokens=self.step * self.tokens_per_step, loss=out["loss"], lr=out["lr"], grad_norm=out["grad_norm"])
                self.log.log(rec)
                eta = (self.total_iters - self.step) * dt / window_steps
                mfu = f" | MFU {100 * rec['mfu']:.1f}%" if rec["mfu"] is not None else ""
                self.log.console(
                    f"step {self.step}/{self.total_iters} | loss {out['loss']:.4f} | lr {out['lr']:.2e} | gnorm {out['grad_norm']:.3f} | "
                    f"{format_si(rec['tokens_per_s'])} tok/s | {rec['tflops']:.1f} TFLOP/s/GPU{mfu} | ETA {format_duration(eta)}"
                )
                window_t, window_steps = time.perf_counter(), 0
            if tr.eval_interval and (self.step % tr.eval_interval == 0 or self.step == self.total_iters):
                val = self.validate()
                if val is not None:
                    self.log.log({"step": self.step, "consumed_tokens": self.step * self.tokens_per_step, "val_loss": val})
                    self.log.console(f"step {self.step} | validation loss {val:.4f}")
                    last["val_loss"] = val
            stop = self._stop_signal or (tr.exit_after and launch_steps >= tr.exit_after)
            if self.step % tr.save_interval == 0 or self.step == self.total_iters or stop:
                self.save()
                self.log.plot()
            if stop:
                self.log.console(f"stopping at step {self.step} ({self._stop_signal or 'train.exit_after'}); rerun the same command to resume")
                self._summary("interrupted", **last)
                return last
            window_t = window_t if window_steps else time.perf_counter()
        self._summary("finished", **last, **self._final_rates())
        self.log.plot()
        self.log.finish()
        return last

    def _throughput(self, steps: int, seconds: float) -> dict:
        tps = steps * self.tokens_per_step / max(seconds, 1e-9)
        # Per GPU, as Megatron reports it: tokens_per_step counts every rank's tokens, and MFU is against one GPU's peak
        # (the job's total over one GPU's peak read 113% at 7B on two GPUs).
        tflops = tps * self.flops_per_token / 1e12 / self.info.world_size
        rec = {"tokens_per_s": tps, "tflops": tflops, "mfu": tflops / self.peak if self.peak else None, "elapsed_s": time.time() - self.log.start_time}
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        self._last_rates = rec
        return rec

    def _final_rates(self) -> dict:
        rates = getattr(self, "_last_rates", {})
        return {k: rates.get(k) for k in ("tokens_per_s", "tflops", "mfu", "peak_mem_gib")}

    def _handle_non_finite(self, out: dict) -> None:
        what = f"step {self.step + 1}: loss={out['loss']}, grad norm={out['grad_norm']}"
        if self.cfg.train.on_nan == "skip" and self.skipped < self.cfg.train.max_skips:
            self.skipped += 1
            self.step += 1  # the step's data is consumed; the weights did not change
            self.log.console(f"WARNING non-finite {what}: step skipped ({self.skipped}/{self.cfg.train.max_skips} allowed)")
            self.log.log({"step": self.step, "skipped_steps": self.skipped})
            return
        # The weights are still those of the last good step: keep them, then stop.
        if self._saved_at() != self.step and self.step > 0:
            self.save()
        self._summary("failed", error=f"non-finite {what}")
        self.log.plot()
        raise NonFiniteError(
            f"non-finite {what}. The weights of step {self.step} are saved in {self.ckpt_root}. "
            "Lower stage.lr, check the data, try precision=bf16 to rule out FP8 overflow, "
            "or set train.on_nan=skip to skip such steps."
        )
