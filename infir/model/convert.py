"""HF Qwen2 checkpoints <-> infir megatron checkpoints, with tensor-parallel split and merge.

Two pure steps each way, on plain state dicts (no megatron, no torch.distributed):

    HF state  --(_MAPPING: rename, QKV interleave, gate/up fusion)-->  full megatron state (TP=1)
              --(split_tp: one shard per TP rank)-->                   megatron shards

and the exact inverse (`merge_tp`, then the mapping backwards). Every step is a concatenation,
a view or a rename, so HF -> megatron -> HF returns every tensor bit for bit, in its own dtype.

Megatron's fused QKV weight is interleaved per query group: for each KV group g, the query rows of
the heads in g, then g's key rows, then its value rows. With that order, a tensor-parallel split of
the fused tensor along dim 0 hands each rank whole groups, so QKV splits like any column-parallel
weight. FC1 is cat[gate, up] on one rank, but under TP each rank holds [gate_shard; up_shard], so
gate and up are split separately ("gated" below).

Checkpoint files: `ckpt_format` (one safetensors file per TP rank + meta.json); HF side:
config.json, model.safetensors (or sharded with an index), generation_config.json, tokenizer files.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch

from infir.fp8 import Recipe
from infir.model import ckpt_format, fp8_export
from infir.model.hf_config import hf_config, size_from_hf_config, size_name
from infir.model.qwen import QwenSize, check_parallel

__all__ = [
    "hf_config", "size_from_hf_config", "hf_to_mcore_state", "mcore_to_hf_state", "split_tp", "merge_tp", "tp_layout",
    "split_tensor", "merge_tensor",
    "hf_to_mcore", "mcore_to_hf", "load_hf_state", "load_into_model", "size_from_meta", "main",
]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# Old transformers versions saved RoPE's inverse frequencies as weights; they are recomputed.
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


# --------------------------------------------------------------------------- the tensor mapping
def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: QwenSize) -> torch.Tensor:
    """HF's separate Q, K, V (weights [rows, hidden] or biases [rows]) -> megatron's per-group layout."""
    groups, rest = size.kv_heads, q.shape[1:]
    q = q.reshape(groups, -1, *rest)  # the query heads of one group are adjacent in HF's q_proj
    k = k.reshape(groups, -1, *rest)
    v = v.reshape(groups, -1, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def deinterleave_qkv(qkv: torch.Tensor, size: QwenSize) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rest, d = qkv.shape[1:], size.head_dim
    per_group = qkv.reshape(size.kv_heads, -1, *rest)
    q, k, v = per_group.split([size.heads // size.kv_heads * d, d, d], dim=1)
    return tuple(t.reshape(-1, *rest) for t in (q, k, v))


@dataclass(frozen=True)
class _Entry:
    """One megatron tensor and the HF tensors it is made of."""

    mcore: str
    hf: tuple[str, ...]
    join: Callable[..., torch.Tensor] = lambda t: t  # HF tensors -> megatron tensor
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] = lambda t: (t,)  # its inverse


def _mapping(size: QwenSize) -> list[_Entry]:
    entries = [_Entry("embedding.word_embeddings.weight", ("model.embed_tokens.weight",))]
    for i in range(size.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        entries += [
            _Entry(m + "input_layernorm.weight", (h + "input_layernorm.weight",)),
            *(
                _Entry(
                    m + f"self_attention.linear_qkv.{p}",
                    tuple(h + f"self_attn.{x}_proj.{p}" for x in "qkv"),
                    join=lambda q, k, v: interleave_qkv(q, k, v, size),
                    split=lambda t: deinterleave_qkv(t, size),
                )
                for p in ("weight", "bias")
            ),
            _Entry(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",)),
            _Entry(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",)),
            _Entry(
                m + "mlp.linear_fc1.weight",
                (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"),
                join=lambda gate, up: torch.cat([gate, up]),
                split=lambda t: tuple(t.chunk(2)),
            ),
            _Entry(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",)),
        ]
    entries.append(_Entry("decoder.final_layernorm.weight", ("model.norm.weight",)))
    if not size.tied:
        entries.append(_Entry("output_layer.weight", ("lm_head.weight",)))
    return entries


def hf_shapes(size: QwenSize) -> dict[str, tuple[int, ...]]:
    """Every tensor a Qwen2ForCausalLM checkpoint of `size` holds (lm_head only when untied)."""
    d, q, kv = size.hidden, size.heads * size.head_dim, size.kv_heads * size.head_dim
    shapes = {"model.embed_tokens.weight": (size.vocab, d), "model.norm.weight": (d,)}
    for i in range(size.layers):
        h = f"model.layers.{i}."
        shapes.update({
            h + "input_layernorm.weight": (d,),
            h + "post_attention_layernorm.weight": (d,),
            h + "self_attn.q_proj.weight": (q, d),
            h + "self_attn.q_proj.bias": (q,),
            h + "self_attn.k_proj.weight": (kv, d),
            h + "self_attn.k_proj.bias": (kv,),
            h + "self_attn.v_proj.weight": (kv, d),
            h + "self_attn.v_proj.bias": (kv,),
            h + "self_attn.o_proj.weight": (d, q),
            h + "mlp.gate_proj.weight": (size.ffn, d),
            h + "mlp.up_proj.weight": (size.ffn, d),
            h + "mlp.down_proj.weight": (d, size.ffn),
        })
    if not size.tied:
        shapes["lm_head.weight"] = (size.vocab, d)
    return shapes


# --------------------------------------------------------------------------- tensor parallelism
def tp_layout(key: str) -> str:
    if key.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")):
        return "column"
    if key.endswith("linear_fc1.weight"):
        return "gated"
    if key.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "row"
    if key.endswith("layernorm.weight"):
        return "replicated"
    raise KeyError(f"no tensor-parallel layout is known for megatron tensor {key!r}")


def split_tensor(key: str, t: torch.Tensor, tp: int) -> list[torch.Tensor]:
    layout = tp_layout(key)
    if tp == 1 or layout == "replicated":
        return [t] * tp
    if layout == "column":
        pieces = t.chunk(tp, dim=0)
    elif layout == "row":
        pieces = t.chunk(tp, dim=1)
    else:
        gate, up = t.chunk(2)
        pieces = [torch.cat(pair) for pair in zip(gate.chunk(tp), up.chunk(tp))]
    # Own storage per piece: a view would keep the whole tensor alive and is not what a rank holds.
    return [p.clone(memory_format=torch.contiguous_format) for p in pieces]


def merge_tensor(key: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    layout = tp_layout(key)
    if len(pieces) == 1:
        return pieces[0]
    if layout == "column":
        return torch.cat(pieces, dim=0)
    if layout == "row":
        return torch.cat(pieces, dim=1)
    if layout == "gated":
        gates, ups = zip(*(p.chunk(2) for p in pieces))
        return torch.cat([*gates, *ups])
    first = pieces[0]
    for rank, p in enumerate(pieces[1:], start=1):
        # Megatron keeps replicated tensors identical across TP ranks; a difference means the shards
        # were not written by one run.
        if p.shape != first.shape or not torch.allclose(p.float(), first.float(), rtol=1e-3, atol=1e-6):
            raise ValueError(f"{key} differs between TP rank 0 and rank {rank}: the shards do not belong to one checkpoint")
    return first


def split_tp(state: dict[str, torch.Tensor], tp: int) -> list[dict[str, torch.Tensor]]:
    """A full (TP=1) megatron state dict -> one state dict per tensor-parallel rank."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for key, t in state.items():
        for shard, piece in zip(shards, split_tensor(key, t, tp)):
            shard[key] = piece
    return shards


def merge_tp(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-rank megatron state dicts -> the full (TP=1) state dict; `split_tp`'s exact inverse."""
    if not shards:
        raise ValueError("no tensor-parallel shards to merge")
    keys = list(shards[0])
    for rank, shard in enumerate(shards[1:], start=1):
        if set(shard) != set(keys):
            diff = sorted(set(shard) ^ set(keys))[:5]
            raise ValueError(f"TP rank {rank} holds other tensors than rank 0 (e.g. {diff})")
    return {key: merge_tensor(key, [s[key] for s in shards]) for key in keys}


# --------------------------------------------------------------------------- validation
def _describe_keys(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:6]) + (f" ... ({len(keys)} in all)" if len(keys) > 6 else "")


def _check_hf_state(hf_state: dict[str, torch.Tensor], size: QwenSize) -> None:
    expected = hf_shapes(size)
    present = {k for k in hf_state if not k.endswith(_IGNORED_HF_SUFFIXES)}
    if size.tied and "lm_head.weight" in present:
        # A tied model's state_dict() lists lm_head.weight as a second name of the embedding.
        embedding = hf_state.get("model.embed_tokens.weight")
        if embedding is not None and not torch.equal(hf_state["lm_head.weight"], embedding):
            raise ValueError(
                "config.json says tie_word_embeddings=true but the checkpoint's lm_head.weight differs from "
                "model.embed_tokens.weight: set tie_word_embeddings=false in config.json to keep the separate LM head"
            )
        present.discard("lm_head.weight")
    if not size.tied and "lm_head.weight" not in present and "model.embed_tokens.weight" in present:
        raise ValueError(
            "config.json says tie_word_embeddings=false but the checkpoint has no lm_head.weight: "
            "set tie_word_embeddings=true if the LM head shares the embedding"
        )
    if missing := set(expected) - present:
        raise KeyError(f"the HF checkpoint lacks tensors its config.json implies: {_describe_keys(missing)}")
    if unexpected := present - set(expected):
        raise KeyError(f"the HF checkpoint holds tensors a Qwen2 model of this config does not have: {_describe_keys(unexpected)}")
    for key, shape in expected.items():
        if tuple(hf_state[key].shape) != shape:
            raise ValueError(f"{key} has shape {tuple(hf_state[key].shape)}; config.json implies {shape}")


def _mcore_shapes(size: QwenSize, tp: int) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of one TP rank, found by running the mapping on meta tensors."""
    hf = {k: torch.empty(s, device="meta") for k, s in hf_shapes(size).items()}
    return {e.mcore: tuple(split_tensor(e.mcore, e.join(*(hf[k] for k in e.hf)), tp)[0].shape) for e in _mapping(size)}


def _check_mcore_shards(shards: list[dict[str, torch.Tensor]], size: QwenSize) -> None:
    tp = len(shards)
    check_parallel(size, tp, seq_length=1)
    expected = _mcore_shapes(size, tp)
    for rank, shard in enumerate(shards):
        if size.tied and "output_layer.weight" in shard:
            raise ValueError(
                "the checkpoint has an output_layer.weight but its meta says the model is tied "
                "(model.tied=true): the shards and meta.json disagree"
            )
        if missing := set(expected) - set(shard):
            hint = " (an untied model needs output_layer.weight)" if "output_layer.weight" in missing else ""
            raise KeyError(f"TP rank {rank} lacks tensors{hint}: {_describe_keys(missing)}")
        if unexpected := set(shard) - set(expected):
            raise KeyError(f"TP rank {rank} holds tensors this model does not have: {_describe_keys(unexpected)}")
        for key, shape in expected.items():
            if tuple(shard[key].shape) != shape:
                raise ValueError(f"TP rank {rank}: {key} has shape {tuple(shard[key].shape)}; tp={tp} and the model imply {shape}")


# --------------------------------------------------------------------------- pure conversions
def hf_to_mcore_state(hf_state: dict[str, torch.Tensor], size: QwenSize, tp: int = 1) -> list[dict[str, torch.Tensor]]:
    """HF Qwen2ForCausalLM tensors -> one megatron state dict per TP rank (dtype kept).

    At tp=1 renamed tensors are the input tensors themselves (no copy).
    """
    check_parallel(size, tp, seq_length=1)
    _check_hf_state(hf_state, size)
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    # Tensor by tensor, so that a 7B conversion holds the HF state and the shards, not a third copy.
    for e in _mapping(size):
        full = e.join(*(hf_state[k] for k in e.hf))
        for shard, piece in zip(shards, split_tensor(e.mcore, full, tp)):
            shard[e.mcore] = piece
    return shards


def mcore_to_hf_state(shards: list[dict[str, torch.Tensor]], size: QwenSize, fp8: Recipe | None = None) -> dict[str, torch.Tensor]:
    """Megatron TP shards (in rank order) -> HF tensors; a tied model gets no lm_head.weight, as HF saves it.

    fp8: the recipe the checkpoint was trained with; the block GEMMs' weights then come as block FP8
    (fp8_export), each with its `weight_scale_inv`.
    """
    _check_mcore_shards(shards, size)
    hf: dict[str, torch.Tensor] = {}
    requantized: dict[str, tuple[int, int]] = {}
    for e in _mapping(size):
        pieces = [s[e.mcore] for s in shards]
        hf.update(_to_hf(e, pieces))
        if fp8 is not None and fp8_export.is_block_gemm(e.mcore):
            hf.update(_fp8_parts(e, pieces, hf, fp8, requantized))
    _report_requantized(requantized)
    return hf


def _report_requantized(blocks: dict[str, tuple[int, int]]) -> None:
    """One warning for the FP8 blocks that are not training's bytes (fp8_export.block_fp8 says which)."""
    if fresh := {k: n for k, (n, _) in blocks.items() if n}:
        kinds = sorted({k.split(".")[-2] for k in fresh})
        warnings.warn(f"FP8 export: {sum(fresh.values())} of {sum(t for _, t in blocks.values())} weight blocks (in "
                      f"{', '.join(kinds)}) hold parts of two of training's 128x128 blocks (megatron's fused tensors split "
                      "at a row that is not a multiple of 128) and were quantized afresh from the checkpoint's weights; "
                      "every other block is training's FP8 bytes")


def _to_hf(e: _Entry, pieces: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    parts = e.split(merge_tensor(e.mcore, pieces))
    # Parts of one fused tensor would share its storage, which safetensors refuses: own copies.
    return {k: t.clone(memory_format=torch.contiguous_format) if len(parts) > 1 else t for k, t in zip(e.hf, parts)}


def _fp8_parts(e: _Entry, pieces: list[torch.Tensor], hf: dict[str, torch.Tensor], recipe: Recipe,
               requantized: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Each TP piece's FP8 copy as training makes it, its bytes and scales moved to the HF tensors of
    `e` as the weights are (training quantizes each rank's shard: its blocks start at the shard's edge)."""
    data, scales = zip(*(fp8_export.training_fp8(f"{e.mcore} (TP rank {r})", p, recipe) for r, p in enumerate(pieces)))
    data, scales = _to_hf(e, list(data)), _to_hf(e, list(scales))
    out = {}
    for k in e.hf:
        out[k], out[fp8_export.scale_name(k)], n = fp8_export.block_fp8(data[k], scales[k], hf[k], recipe)
        requantized[k] = (n, out[fp8_export.scale_name(k)].numel())
    return out


def load_into_model(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load one rank's megatron state into a GPTModel, failing on any tensor missing or left over.

    Megatron's linears list an `_extra_state` entry that checkpoints never hold, hence strict=False
    with our own check.
    """
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise KeyError(f"state does not fit the model: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")


# --------------------------------------------------------------------------- files
def _read_hf_config(hf_dir: Path) -> dict:
    if not hf_dir.is_dir():
        raise FileNotFoundError(f"--hf {hf_dir}: no such directory")
    path = hf_dir / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: --hf must name a HF model directory (config.json + safetensors)")
    return ckpt_format.read_json(path)


def load_hf_state(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a HF model directory: model.safetensors, or the files its index names."""
    hf_dir = Path(hf_dir)
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.exists():
        return ckpt_format.load_safetensors(single)
    if index.exists():
        state: dict[str, torch.Tensor] = {}
        for name in _index_files(index):
            state.update(ckpt_format.load_safetensors(hf_dir / name))
        return state
    if any(hf_dir.glob("pytorch_model*.bin")):
        raise FileNotFoundError(
            f"{hf_dir} holds only PyTorch .bin weights; re-save it with save_pretrained(..., safe_serialization=True)"
        )
    raise FileNotFoundError(f"{hf_dir} has neither model.safetensors nor model.safetensors.index.json")


def _index_files(index: Path) -> list[str]:
    """The files a model.safetensors.index.json names, each one present."""
    weight_map = ckpt_format.read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index} has no 'weight_map' of tensor names to file names: it is not a safetensors index")
    files = sorted(set(weight_map.values()))
    if missing := [f for f in files if not (index.parent / f).is_file()]:
        raise FileNotFoundError(f"{index} names {', '.join(missing)}, missing from {index.parent}: the download is incomplete")
    return files


def _has_tokenizer(path: Path) -> bool:
    return any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


def hf_to_mcore(hf_dir: str | Path, out_dir: str | Path, tp: int = 1) -> Path:
    """Convert a HF Qwen2 model directory into an infir checkpoint (iteration 0) under `out_dir`.

    Returns the iteration directory; `ckpt_format.resolve(out_dir)` finds it too. The tokenizer stays
    where it is: meta.json names `hf_dir` as the tokenizer when it holds tokenizer files.
    """
    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir)
    raw_config = _read_hf_config(hf_dir)
    size = size_from_hf_config(raw_config)
    check_parallel(size, tp, seq_length=1)
    final = out_dir / ckpt_format.iter_dir_name(0)
    if (out_dir / ckpt_format.LATEST).exists() or final.exists():
        raise FileExistsError(f"--out {out_dir} already holds a checkpoint; choose a new directory")
    hf_state = load_hf_state(hf_dir)
    shards = hf_to_mcore_state(hf_state, size, tp)
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in hf_state.values()})
    del hf_state

    tmp = out_dir / f"{final.name}.tmp"
    if tmp.exists():  # left by an interrupted conversion
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for rank, shard in enumerate(shards):
        ckpt_format.save_shard(tmp, rank, shard)
    generation_path = hf_dir / "generation_config.json"
    ckpt_format.write_meta(tmp, {
        "iteration": 0,
        "tp": tp,
        "model_name": size_name(size) or f"hf:{hf_dir.name}",
        "model": asdict(size),
        "tokenizer": str(hf_dir) if _has_tokenizer(hf_dir) else None,
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        # What mcore_to_hf needs to give back a directory that generates like the original.
        "hf": {
            "source": str(hf_dir),
            "token_ids": {k: raw_config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if raw_config.get(k) is not None},
            "generation_config": ckpt_format.read_json(generation_path) if generation_path.exists() else None,
        },
    })
    ckpt_format.commit(tmp, final)
    return final


def size_from_meta(meta: dict) -> QwenSize:
    names = {f.name for f in fields(QwenSize)}
    model = meta.get("model")
    if not isinstance(model, dict) or not names - {"max_positions", "rope_theta", "norm_eps"} <= set(model):
        raise ValueError(f"meta.json's 'model' must hold the QwenSize fields {sorted(names)}; got {model!r}")
    return QwenSize(**{k: v for k, v in model.items() if k in names})


def _token_ids(meta: dict, tokenizer_dir: Path | None) -> dict:
    ids = dict((meta.get("hf") or {}).get("token_ids") or {})
    if ids or tokenizer_dir is None:
        return ids
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except Exception as err:  # a broken tokenizer should not stop the weights from converting
        warnings.warn(f"could not read the tokenizer at {tokenizer_dir} ({err}); config.json gets no token ids")
        return {}
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    return {k: v for k, v in ids.items() if v is not None}


def _tokenizer_dir(meta: dict) -> Path | None:
    name = meta.get("tokenizer")
    if not name:
        return None
    path = Path(name)
    if path.is_dir() and _has_tokenizer(path):
        return path
    warnings.warn(f"meta.json names tokenizer {name!r}, which is not a tokenizer directory here; no tokenizer files copied")
    return None


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def mcore_to_hf(ckpt_dir: str | Path, out_dir: str | Path, dtype: str | None = None, max_shard_size: str = "5GB",
                fp8: bool = False) -> Path:
    """Write an infir checkpoint as a HF Qwen2 model directory that transformers and vLLM load.

    `ckpt_dir`: anything `ckpt_format.resolve` accepts. `dtype`: cast the weights (e.g. "bfloat16"
    for an fp32 training checkpoint); None keeps the checkpoint's dtype. `fp8`: the block GEMMs' weights
    in block FP8 as training quantizes them (fp8_export), the other tensors in `dtype` (default bfloat16);
    needs a checkpoint trained with an FP8 recipe.
    """
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig

    iter_dir = ckpt_format.resolve(ckpt_dir)
    meta = ckpt_format.read_meta(iter_dir)
    size, tp = size_from_meta(meta), int(meta["tp"])
    if ckpt_format.shard_path(iter_dir, tp).exists():
        raise ValueError(f"{iter_dir} holds more than the tp={tp} shards its meta.json names")
    out_dir = Path(out_dir)
    if any((out_dir / f).exists() for f in ("config.json", "model.safetensors", "model.safetensors.index.json")):
        raise FileExistsError(f"--out {out_dir} already holds a HF model; choose a new directory")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; valid: {sorted(DTYPES)}")

    recipe = fp8_export.export_recipe(meta, iter_dir) if fp8 else None
    state = mcore_to_hf_state([ckpt_format.load_shard(iter_dir, r) for r in range(tp)], size, fp8=recipe)
    dtype = dtype or ("bfloat16" if fp8 else None)
    if dtype is not None:
        state = {k: v if fp8_export.keeps_dtype(k, v) else v.to(DTYPES[dtype]) for k, v in state.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = _tokenizer_dir(meta)
    token_ids = _token_ids(meta, tokenizer_dir)
    weights_dtype = state["model.embed_tokens.weight"].dtype  # the high-precision tensors' (FP8 ones aside)
    # Weights first, config.json last: an interrupted conversion leaves no directory that looks loadable.
    save_torch_state_dict(state, out_dir, max_shard_size=max_shard_size, metadata={"format": "pt"})
    quantized = {"quantization_config": fp8_export.quantization_config()} if fp8 else {}
    hf_config(size, dtype=weights_dtype, **quantized, **token_ids).save_pretrained(out_dir)
    generation = (meta.get("hf") or {}).get("generation_config")
    (GenerationConfig.from_dict(generation) if generation else GenerationConfig(**token_ids)).save_pretrained(out_dir)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copy2(tokenizer_dir / name, out_dir / name)
    return out_dir


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infir-convert", description="Convert Qwen2 checkpoints between HF and infir's megatron format.")
    sub = parser.add_subparsers(dest="command", required=True)
    to_mcore = sub.add_parser("hf-to-mcore", help="HF model directory -> infir megatron checkpoint")
    to_mcore.add_argument("--hf", required=True, type=Path, help="HF model directory (config.json + safetensors)")
    to_mcore.add_argument("--out", required=True, type=Path, help="new checkpoints directory (gets iter_0000000/ and latest)")
    to_mcore.add_argument("--tp", type=int, default=1, help="tensor-parallel size to shard for (default 1)")
    to_hf = sub.add_parser("mcore-to-hf", help="infir megatron checkpoint -> HF model directory")
    to_hf.add_argument("--ckpt", required=True, type=Path, help="run dir, checkpoints dir or iteration dir")
    to_hf.add_argument("--out", required=True, type=Path, help="new HF model directory")
    to_hf.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                       help="cast the weights (default: keep; with --fp8, the tensors left high precision: bfloat16)")
    to_hf.add_argument("--fp8", action="store_true",
                       help="block GEMM weights in block FP8 (E4M3, 128x128 scales, as transformers and vLLM load it), "
                            "the bytes training quantizes; needs a checkpoint trained with an FP8 recipe")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "hf-to-mcore":
            path = hf_to_mcore(args.hf, args.out, tp=args.tp)
        else:
            path = mcore_to_hf(args.ckpt, args.out, dtype=args.dtype, fp8=args.fp8)
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        parser.exit(2, f"infir-convert {args.command}: error: {message}\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
