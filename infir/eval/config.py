"""Typed configuration of `infir-eval run` (a structured config: a mistyped key or a wrong type is an
error naming the key). Values come from conf/eval.yaml, an optional preset conf/eval/<preset>.yaml,
then command-line overrides in Hydra's syntax (`benchmarks=[aime24,math500] sampling.n=4`).

Why not Hydra's own composition: the project's config directory also holds the training groups
(conf/model/, conf/data/, ...), and Hydra would read `model=<path>` as a choice in the training
`model` group. We keep Hydra's override grammar and OmegaConf's typed merge, and read our own files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf


@dataclass
class SamplingOverrides:
    """null keeps each benchmark's reference value (eval/<name>.py)."""
    n: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_new_tokens: Optional[int] = None


@dataclass
class BackendConfig:
    name: str = "auto"  # auto (vllm if installed and a GPU is present, else hf) | vllm | hf
    device: str = "auto"
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU
    batch_size: int = 8  # hf: sequences per generate call
    cache: str = "auto"  # hf: auto (static on GPU, dynamic on CPU) | dynamic | static KV cache
    compile: Optional[bool] = None  # hf: torch.compile the decode step; null: on with a static cache on a GPU
    sort_by_length: bool = True  # hf: batch sequences by prompt length (results keep the prompts' order)
    tensor_parallel_size: int = 1  # vllm
    gpu_memory_utilization: float = 0.9  # vllm
    chunk_size: int = 64  # problems generated between two cache flushes


@dataclass
class GradingConfig:
    workers: int = 4  # parallel sandboxes for code
    timeout_s: float = 6.0  # per test, wall clock (CPU limit is the same, rounded up)
    memory_mb: int = 2048  # per test, address space
    max_processes: int = 64
    disk_mb: int = 128  # per test, all files the program writes together


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "infir-eval"
    mode: str = "offline"
    name: Optional[str] = None


@dataclass
class EvalConfig:
    model: str = "???"
    tokenizer: Optional[str] = None  # default: the model directory
    benchmarks: list[str] = field(default_factory=lambda: ["aime24", "aime25", "gpqa_diamond", "livecodebench_v5"])
    out_dir: Optional[str] = None  # default: eval_runs/<model dir name>
    label: Optional[str] = None  # the row name in `infir-eval compare`; default: out_dir's name
    source: str = "hub"  # hub | samples | bundle:DIR | a path: where every benchmark's problems come from ...
    sources: dict[str, str] = field(default_factory=dict)  # ... unless named here per benchmark
    limit: Optional[int] = None  # the first N problems of each benchmark (smoke runs)
    seed: int = 42  # EvalScope's default: GPQA's options come in its order
    system_prompt: Optional[str] = None
    pass_k: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32])
    preset: Optional[str] = None
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    backend: BackendConfig = field(default_factory=BackendConfig)
    grading: GradingConfig = field(default_factory=GradingConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


def conf_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "conf"


def _apply_overrides(cfg, overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key == "sources" and isinstance(override.value(), str):
            key = "source"  # `sources=bundle:DIR`: one source for every benchmark
        if override.is_delete():
            raise ValueError(f"override {override.input_line!r}: deleting keys is not supported")
        if override.is_sweep_override():
            raise ValueError(f"override {override.input_line!r}: sweeps are not supported; run once per value")
        OmegaConf.update(cfg, key, override.value(), merge=False)


def load_config(overrides: list[str], root: Path | None = None) -> Any:
    """conf/eval.yaml <- conf/eval/<preset>.yaml <- overrides, checked against EvalConfig."""
    root = Path(root) if root else conf_dir()
    cfg = OmegaConf.merge(OmegaConf.structured(EvalConfig), OmegaConf.load(root / "eval.yaml"))
    presets = [o.split("=", 1)[1] for o in overrides if o.startswith("preset=")]
    preset = presets[-1] if presets else cfg.preset
    if preset:
        preset_file = root / "eval" / f"{preset}.yaml"
        if not preset_file.is_file():
            known = sorted(p.stem for p in (root / "eval").glob("*.yaml"))
            raise FileNotFoundError(f"preset={preset}: no {preset_file}; known presets: {known}")
        cfg = OmegaConf.merge(cfg, OmegaConf.load(preset_file))
    _apply_overrides(cfg, overrides)
    if OmegaConf.is_missing(cfg, "model"):
        raise ValueError("infir-eval run needs model=<HF model directory or megatron checkpoint>")
    check_backend(cfg.backend)
    return cfg


def check_backend(backend) -> None:
    """Values the types do not rule out, each refused in one line naming the key and what it takes."""
    from infir.eval.backends import BACKENDS, check_cache_options

    if backend.name not in BACKENDS:
        raise ValueError(f"backend.name must be one of {', '.join(BACKENDS)}; got {backend.name!r}")
    check_cache_options(backend.cache, backend.compile)
    for key in ("batch_size", "chunk_size", "tensor_parallel_size"):
        if getattr(backend, key) < 1:
            raise ValueError(f"backend.{key} must be at least 1; got {getattr(backend, key)}")
