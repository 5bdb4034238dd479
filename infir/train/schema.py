"""The types of `infir-train`'s config tree: one dataclass per Hydra group, each checking its own fields.

conf/config.yaml lists `infir_schema` (registered by `register()`) first in its defaults, so each
group's YAML merges into a typed node: an unknown key or a wrong type fails while Hydra composes.
`OmegaConf.to_object` (config.typed) then builds these dataclasses, and each `__post_init__` checks
its ranges, as megatron's TransformerConfig does, raising a ConfigError that names the field.
Rules that span groups (the stage's data source, the parallel split of the model) are in
config.validate. A field without a default must be set by the group's YAML (a YAML's `???` keeps
the schema's default, so a key that YAMLs leave to the user has none).

The `scale` group has no node of its own: its YAMLs override `stage` and `train` fields, which these
types check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from infir.train.config import ConfigError, check

# "auto" (on a GPU), true or false. Not Union[bool, str]: OmegaConf's union nodes fail inside Hydra's merge.
AutoBool = Any
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _positive_int(key: str, value) -> None:
    check(value > 0, key, value, "a positive integer")


def _at_least_zero(key: str, value) -> None:
    check(value >= 0, key, value, "a number >= 0")


def _one_of(key: str, value, valid) -> None:
    check(value in valid, key, value, f"one of {', '.join(map(str, valid))}")


@dataclass
class ModelConfig:
    name: str = MISSING              # a size of infir.model.qwen.SIZES
    init_std: float = 0.02
    recompute: str = "none"          # none | full | selective
    cpu_init: bool = True
    compile: AutoBool = "auto"
    compile_mode: str = "auto"       # auto, or one of torch.compile's modes
    fusions: AutoBool = "auto"
    chunked_loss: AutoBool = "auto"
    loss_chunk_tokens: int = 8192
    attention: str = "auto"          # packed documents / context parallelism: auto | varlen | flex | sdpa
    fp8_weight_cache: AutoBool = "auto"  # FP8 weights kept for the step (true) or quantized per layer forward (false)

    def __post_init__(self):
        from infir.model.qwen import SIZES

        _one_of("model.name", self.name, sorted(SIZES))
        check(self.init_std > 0, "model.init_std", self.init_std, "a positive number")
        _one_of("model.recompute", self.recompute, ("none", "full", "selective"))
        for key in ("compile", "fusions", "chunked_loss"):
            value = getattr(self, key)
            check(value in ("auto", True, False), f"model.{key}", value, "auto (on a GPU), true or false")
        check(self.fp8_weight_cache in ("auto", True, False), "model.fp8_weight_cache", self.fp8_weight_cache,
              "auto (quantized per layer forward under full recomputation, else kept), true (kept) or false")
        check(self.compile_mode in COMPILE_MODES, "model.compile_mode", self.compile_mode,
              f"one of {', '.join(COMPILE_MODES)} (auto, or one of torch.compile's modes)")
        _positive_int("model.loss_chunk_tokens", self.loss_chunk_tokens)
        from infir.model.attention import KERNELS

        _one_of("model.attention", self.attention, KERNELS)


@dataclass
class PrecisionConfig:
    name: str = MISSING              # the run name's part
    recipe: str = MISSING            # a key of infir.fp8.RECIPES, the registry the layers' recipe comes from
    fp8_swiglu_input: bool = False   # SwiGLU's input kept for the backward in FP8 (FP8 recipes only)

    def __post_init__(self):
        from infir.train.precision import build_recipe

        try:
            build_recipe(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class OptimizerConfig:
    name: str = MISSING              # a key of infir.optim.OPTIMIZERS
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    kwargs: Dict[str, Any] = field(default_factory=dict)  # more keyword arguments of its class: +optimizer.kwargs.seed=7
    # ZeRO-1: each data-parallel rank keeps and steps 1/DP of the optimizer states (infir/train/optimizer.py);
    # null: on whenever there is more than one data-parallel (x context-parallel) rank
    distributed: Optional[bool] = None
    overlap_grad_reduce: bool = True  # reduce each gradient bucket while backward computes the next
    bucket_size: Optional[int] = None  # elements per gradient bucket; null: megatron's max(40M, 1M x DP)
    grad_reduce_dtype: str = "fp32"  # fp32 | bf16: the dtype gradients accumulate and are reduced in
    # sharded states, 128x128-block FP8 recipes: the FP8 linears' updated weights are all-gathered as FP8 bytes
    # (infir/train/fp8_param_gather.py): fewer bytes on the wire, more work and one more exchange in the step;
    # for links slower than the step's compute (across nodes). Off: BENCHMARKS.md measures it within a node
    fp8_param_gather: bool = False
    # one rank: each parameter steps inside backward and its gradient is freed at once (FlashOptim's gradient
    # release: 5 bytes a parameter with flash_adamw); no gradient-norm clipping, spike detection or accumulation
    grad_release: bool = False

    def __post_init__(self):
        from infir.optim import OPTIMIZERS

        _one_of("optimizer.name", self.name, sorted(OPTIMIZERS))
        _one_of("optimizer.grad_reduce_dtype", self.grad_reduce_dtype, ["bf16", "fp32"])
        check(self.bucket_size is None or self.bucket_size > 0, "optimizer.bucket_size", self.bucket_size,
              "a positive number of elements, or null")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optimizer.betas", list(self.betas),
              "two numbers in [0, 1), e.g. [0.9,0.95]")
        check(self.eps > 0, "optimizer.eps", self.eps, "a positive number")


@dataclass
class DataConfig:
    name: str = MISSING              # demo | custom | synthetic
    root: Optional[str] = None
    tokenizer: Optional[str] = MISSING  # a HF tokenizer directory; null: the demo tokenizer
    sources: Optional[Dict[str, Any]] = None  # stage.dataset -> a prefix, a [weight, prefix, ...] blend or a mixture file
    valid: Any = None                # a prefix or blend for validation; null: held out of the training data
    reset_attention_at_eod: bool = False  # pretraining: documents attend only themselves, positions restart after EOD
    synthetic_doc_median: Optional[int] = None  # data=synthetic: rows packed from log-normal documents of this median length

    def __post_init__(self):
        _one_of("data.name", self.name, ("demo", "custom", "synthetic"))
        check(self.synthetic_doc_median is None or self.synthetic_doc_median > 0, "data.synthetic_doc_median",
              self.synthetic_doc_median, "a positive number of tokens, or null (whole rows)")


@dataclass
class StageConfig:
    name: str = MISSING
    dataset: str = MISSING           # which of data.sources this stage reads
    seq_length: int = MISSING
    global_batch: int = MISSING
    micro_batch: int = MISSING
    iters: Optional[int] = None      # null: from epochs x dataset size
    epochs: Optional[float] = None
    lr: float = MISSING
    min_lr: float = 0.0
    schedule: str = MISSING          # cosine | wsd | constant
    warmup_iters: float = 0.0        # a fraction < 1: a share of all steps
    decay_iters: Optional[int] = None
    weight_decay: float = 0.0
    grad_clip: float = 1.0           # 0: no clipping

    def __post_init__(self):
        for key in ("seq_length", "global_batch", "micro_batch"):
            _positive_int(f"stage.{key}", getattr(self, key))
        check(self.iters is None or self.iters > 0, "stage.iters", self.iters, "a positive integer or null (then stage.epochs)")
        check(self.iters is not None or (self.epochs or 0) > 0, "stage.epochs", self.epochs,
              "a positive number when stage.iters is null")
        _one_of("stage.schedule", self.schedule, ("cosine", "wsd", "constant"))
        check(self.lr > 0, "stage.lr", self.lr, "a positive number")
        check(0 <= self.min_lr <= self.lr, "stage.min_lr", self.min_lr, f"between 0 and stage.lr={self.lr}")
        for key in ("warmup_iters", "weight_decay", "grad_clip"):
            _at_least_zero(f"stage.{key}", getattr(self, key))
        check(self.decay_iters is None or self.decay_iters >= 0, "stage.decay_iters", self.decay_iters,
              "an integer >= 0 or null (decay over all steps after warmup)")


@dataclass
class ParallelConfig:
    tp: int = 1                      # tensor-parallel size; data parallel takes the rest of the launch's ranks
    sequence_parallel: bool = False
    cp: int = 1                      # context-parallel size: the sequence split over cp ranks
    # the sequence-parallel collectives split per rank around their GEMMs (infir.fp8.sp_overlap); nothing to
    # split without sequence parallelism or at tp=1, where it is left off (tp2 turns it on for either)
    tp_comm_overlap: bool = False

    def __post_init__(self):
        check(self.tp >= 1, "parallel.tp", self.tp, "an integer >= 1")
        check(self.cp >= 1, "parallel.cp", self.cp, "an integer >= 1")


@dataclass
class LoggerConfig:
    name: str = MISSING
    wandb: str = "offline"           # disabled | offline | online ($WANDB_MODE wins over the last two)
    project: str = "infir"

    def __post_init__(self):
        _one_of("logger.wandb", self.wandb, ("disabled", "offline", "online"))


@dataclass
class SpikeConfig:
    action: str = "none"             # none | skip | rollback (infir.train.spike)
    factor: float = 5.0              # a spike: a grad norm above factor x the running median
    window: int = 50                 # steps in the running median; none is judged before it is full

    def __post_init__(self):
        from infir.train.spike import ACTIONS

        _one_of("train.spike.action", self.action, ACTIONS)
        check(self.factor > 1, "train.spike.factor", self.factor, "a number > 1 (times the running median grad norm)")
        _positive_int("train.spike.window", self.window)


@dataclass
class TrainConfig:
    log_interval: int = 10
    eval_interval: int = 500         # 0: never
    eval_iters: int = 20
    save_interval: int = 1000
    keep_last: int = 2
    on_nan: str = "stop"             # stop | skip
    max_skips: int = 10
    fp8_health_interval: int = 100   # 0: off
    exit_after: Optional[int] = None
    gc_interval: Optional[int] = None  # null: Python's automatic garbage collector
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    allow_data_order_change: bool = False  # resume even where the config reads the data in another order
    async_save: bool = True          # checkpoints written by a background thread from host copies

    def __post_init__(self):
        _one_of("train.on_nan", self.on_nan, ("stop", "skip"))
        for key in ("log_interval", "save_interval"):
            _positive_int(f"train.{key}", getattr(self, key))
        for key in ("eval_interval", "eval_iters", "keep_last", "max_skips", "fp8_health_interval"):
            check(getattr(self, key) >= 0, f"train.{key}", getattr(self, key), "an integer >= 0")
        check(self.exit_after is None or self.exit_after >= 1, "train.exit_after", self.exit_after,
              "null or an integer >= 1 (stop after that many steps of this launch)")
        check(self.gc_interval is None or self.gc_interval >= 1, "train.gc_interval", self.gc_interval,
              "null (Python's automatic garbage collection) or an integer >= 1 (collect every N steps)")


@dataclass
class InfirConfig:
    model: ModelConfig = MISSING
    precision: PrecisionConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    data: DataConfig = MISSING
    stage: StageConfig = MISSING
    parallel: ParallelConfig = MISSING
    logger: LoggerConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    run_name: str = MISSING
    run_dir: str = MISSING
    seed: int = 1234
    device: str = "auto"             # auto (cuda if present) | cpu | cuda
    init_from: Optional[str] = None  # a checkpoint whose weights start this run

    def __post_init__(self):
        _one_of("device", self.device, ("auto", "cpu", "cuda"))


def register() -> None:
    """Make `infir_schema` (the first default of conf/config.yaml) known to Hydra."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="infir_schema", node=InfirConfig)


__all__ = ["InfirConfig", "ModelConfig", "PrecisionConfig", "OptimizerConfig", "DataConfig", "StageConfig",
           "ParallelConfig", "LoggerConfig", "SpikeConfig", "TrainConfig", "COMPILE_MODES", "register"]
