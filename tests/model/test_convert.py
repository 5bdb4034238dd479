"""HF <-> megatron conversion: same logits as transformers' Qwen2, exact round trips, TP split/merge, errors."""
import json
import os
import socket
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from infir.model import ckpt_format
from infir.model.convert import (
    deinterleave_qkv,
    hf_to_mcore,
    hf_to_mcore_state,
    interleave_qkv,
    load_into_model,
    main,
    mcore_to_hf,
    mcore_to_hf_state,
    merge_tp,
    split_tp,
)
from infir.model.hf_config import hf_config, size_from_hf_config
from infir.model.qwen import QwenSize

# 3 query heads per KV group (Qwen2.5-0.5B has 7): an odd group size catches a head-order slip that
# a group of 2 could hide.
SMALL = QwenSize(hidden=96, layers=2, heads=6, kv_heads=2, ffn=176, vocab=512, tied=True, max_positions=128)
SEQ = 24
WORKER = Path(__file__).with_name("tp_logits_worker.py")


def random_hf_model(size: QwenSize, seed: int = 0, dtype=torch.float32):
    """A transformers Qwen2ForCausalLM whose every tensor (norms and biases too) is random, so any
    misplaced row or swapped tensor in the conversion changes the logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(size), attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else (0.5 if "embed" in name else 0.08) * noise)
    return model.to(dtype).eval()


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def tokens_for(size: QwenSize, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, size.vocab, (batch, SEQ), generator=torch.Generator().manual_seed(1))


def megatron_logits(size: QwenSize, state: dict, tokens: torch.Tensor) -> torch.Tensor:
    from infir.model import build_gpt, transformer_config

    model = build_gpt(size, transformer_config(size, tp=1), seq_length=tokens.shape[1])
    load_into_model(model, state)
    model.eval()
    with torch.no_grad():
        logits = model(tokens, torch.arange(tokens.shape[1]).expand_as(tokens), None)
    assert logits.shape == (*tokens.shape, size.vocab)  # megatron returns [b, s, vocab] without labels
    return logits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_hf(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


# --------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_megatron_logits_match_transformers(megatron_tp1, tied):
    size = replace(SMALL, tied=tied)
    hf = random_hf_model(size)
    tokens = tokens_for(size)
    # state_dict() of a tied HF model lists lm_head.weight as a second name of the embedding.
    (shard,) = hf_to_mcore_state(hf.state_dict(), size, tp=1)
    assert ("output_layer.weight" in shard) == (not tied)
    diff = (megatron_logits(size, shard, tokens) - hf_logits(hf, tokens)).abs().max().item()
    assert diff < 1e-4, f"max |megatron - HF| logits = {diff}"


def test_megatron_model_state_evaluates_the_same_in_transformers(megatron_tp1):
    """The trainer's direction: a megatron model's state (ckpt_format.model_state) -> HF, same logits."""
    from transformers import AutoModelForCausalLM

    from infir.model import build_gpt, transformer_config

    size = replace(SMALL, tied=False)
    model = build_gpt(size, transformer_config(size, tp=1), seq_length=SEQ).eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # megatron initialises norms to 1 and biases to 0: randomise them too
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    tokens = tokens_for(size)
    with torch.no_grad():
        expected = model(tokens, torch.arange(SEQ).expand_as(tokens), None)
    hf = AutoModelForCausalLM.from_config(hf_config(size), attn_implementation="eager", dtype=torch.float32).eval()
    hf.load_state_dict(mcore_to_hf_state([ckpt_format.model_state(model)], size), strict=True)
    assert (hf_logits(hf, tokens) - expected).abs().max().item() < 1e-4


def test_wrong_conversion_is_caught_by_logits(megatron_tp1):
    """The logits check above can fail: a converter that skipped the QKV interleave would be caught."""
    hf = random_hf_model(SMALL)
    tokens = tokens_for(SMALL)
    (shard,) = hf_to_mcore_state(hf.state_dict(), SMALL, tp=1)
    sd = hf.state_dict()
    shard["decoder.layers.0.self_attention.linear_qkv.weight"] = torch.cat(
        [sd[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]
    )
    assert (megatron_logits(SMALL, shard, tokens) - hf_logits(hf, tokens)).abs().max().item() > 1e-2


def test_tp2_under_torchrun_gives_the_same_logits(tmp_path, megatron_tp1):
    size = replace(SMALL, tied=False)  # untied: the vocab-parallel output layer is split too
    hf = random_hf_model(size, seed=3)
    tokens = tokens_for(size)
    hf_dir = save_hf(hf, tmp_path / "hf")
    hf_to_mcore(hf_dir, tmp_path / "tp2", tp=2)
    torch.save(tokens, tmp_path / "tokens.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(WORKER), str(tmp_path / "tp2"), str(tmp_path / "tokens.pt"), str(tmp_path / "logits.pt")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    tp2 = torch.load(tmp_path / "logits.pt")
    (tp1_state,) = hf_to_mcore_state(hf.state_dict(), size, tp=1)
    tp1 = megatron_logits(size, tp1_state, tokens)
    assert tp2.shape == tp1.shape
    assert (tp2 - tp1).abs().max().item() < 1e-4
    assert (tp2 - hf_logits(hf, tokens)).abs().max().item() < 1e-4


# --------------------------------------------------------------------------- exact round trips
@pytest.mark.parametrize(
    "tp,tied,dtype",
    [(1, True, torch.float32), (2, True, torch.bfloat16), (1, False, torch.bfloat16), (2, False, torch.float32)],
)
def test_hf_to_megatron_to_hf_files_are_identical(tmp_path, tp, tied, dtype):
    size = replace(SMALL, tied=tied)
    hf = random_hf_model(size, seed=tp, dtype=dtype)
    src = save_hf(hf, tmp_path / "hf")
    iter_dir = hf_to_mcore(src, tmp_path / "ckpt", tp=tp)
    assert ckpt_format.resolve(tmp_path / "ckpt") == iter_dir
    meta = ckpt_format.read_meta(iter_dir)
    assert (meta["iteration"], meta["tp"], meta["model"]["hidden"]) == (0, tp, size.hidden)
    assert all(ckpt_format.shard_path(iter_dir, r).exists() for r in range(tp))

    out = mcore_to_hf(tmp_path / "ckpt", tmp_path / "back")
    before, after = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(before) == set(after)
    for key in before:
        assert after[key].dtype == before[key].dtype, key
        assert torch.equal(after[key], before[key]), key
    assert size_from_hf_config(json.loads((out / "config.json").read_text())) == size
    assert (out / "generation_config.json").exists()

    # transformers loads both directories alike (a model cast with .to() would also cast RoPE's
    # inv_freq buffer, which from_pretrained keeps in fp32) and computes the same logits.
    from transformers import AutoModelForCausalLM

    source, back = (AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval() for d in (src, out))
    assert back.dtype == dtype
    tokens = tokens_for(size)
    assert torch.equal(hf_logits(back, tokens), hf_logits(source, tokens))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_state_round_trip_and_tp_merge_are_exact(tied):
    size = replace(SMALL, tied=tied)
    hf_state = {k: v for k, v in random_hf_model(size, seed=7).state_dict().items() if not (tied and k == "lm_head.weight")}
    (full,) = hf_to_mcore_state(hf_state, size, tp=1)
    tp2 = hf_to_mcore_state(hf_state, size, tp=2)
    merged = merge_tp(tp2)
    assert set(merged) == set(full)
    assert all(torch.equal(merged[k], full[k]) for k in full)
    resplit = split_tp(full, 2)
    assert all(torch.equal(resplit[r][k], tp2[r][k]) for r in range(2) for k in full)
    for shards in ([full], tp2):
        back = mcore_to_hf_state(shards, size)
        assert set(back) == set(hf_state)
        assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)


# --------------------------------------------------------------------------- layouts, against a plain reference
def test_qkv_interleave_follows_megatron_group_order():
    size = replace(SMALL, hidden=48, heads=6, kv_heads=2)  # 3 query heads per group, head_dim 8
    d = size.head_dim
    # Each row's value names where it came from: 1000*tensor + row.
    q, k, v = (torch.arange(n * d).float().add(1000 * t)[:, None].expand(-1, size.hidden).contiguous()
               for t, n in ((1, size.heads), (2, size.kv_heads), (3, size.kv_heads)))
    expected_rows = []
    for g in range(size.kv_heads):
        for h in range(3 * g, 3 * g + 3):
            expected_rows += [1000 + h * d + i for i in range(d)]
        expected_rows += [2000 + g * d + i for i in range(d)]
        expected_rows += [3000 + g * d + i for i in range(d)]
    fused = interleave_qkv(q, k, v, size)
    assert fused[:, 0].tolist() == expected_rows
    assert all(torch.equal(a, b) for a, b in zip(deinterleave_qkv(fused, size), (q, k, v)))
    bias = interleave_qkv(q[:, 0], k[:, 0], v[:, 0], size)
    assert bias.tolist() == expected_rows


def test_tp_shards_hold_whole_query_groups_and_gate_up_halves():
    size = SMALL
    hf_state = random_hf_model(size, seed=5).state_dict()
    shards = hf_to_mcore_state(hf_state, size, tp=2)
    d, per_group = size.head_dim, size.heads // size.kv_heads
    for r, shard in enumerate(shards):
        q = hf_state["model.layers.1.self_attn.q_proj.weight"][r * per_group * d:(r + 1) * per_group * d]
        k = hf_state["model.layers.1.self_attn.k_proj.weight"][r * d:(r + 1) * d]
        v = hf_state["model.layers.1.self_attn.v_proj.weight"][r * d:(r + 1) * d]
        assert torch.equal(shard["decoder.layers.1.self_attention.linear_qkv.weight"], torch.cat([q, k, v]))
        half = size.ffn // 2
        gate = hf_state["model.layers.1.mlp.gate_proj.weight"][r * half:(r + 1) * half]
        up = hf_state["model.layers.1.mlp.up_proj.weight"][r * half:(r + 1) * half]
        assert torch.equal(shard["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))
        down = hf_state["model.layers.1.mlp.down_proj.weight"][:, r * half:(r + 1) * half]
        assert torch.equal(shard["decoder.layers.1.mlp.linear_fc2.weight"], down)
        vocab = size.vocab // 2
        assert torch.equal(shard["embedding.word_embeddings.weight"], hf_state["model.embed_tokens.weight"][r * vocab:(r + 1) * vocab])
        assert torch.equal(shard["decoder.final_layernorm.weight"], hf_state["model.norm.weight"])


# --------------------------------------------------------------------------- errors and CLI
@pytest.fixture
def hf_dir(tmp_path) -> Path:
    return save_hf(random_hf_model(SMALL), tmp_path / "hf")


def run_cli(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_cli_converts_both_ways(tmp_path, hf_dir, capsys):
    assert main(["hf-to-mcore", "--hf", str(hf_dir), "--out", str(tmp_path / "ckpt"), "--tp", "2"]) == 0
    assert main(["mcore-to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "back"), "--dtype", "bfloat16"]) == 0
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    src = load_file(str(hf_dir / "model.safetensors"))
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], src[k].bfloat16()) for k in src)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"


def test_cli_errors_name_the_problem(tmp_path, hf_dir, capsys):
    code, err = run_cli(["hf-to-mcore", "--hf", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "no such directory" in err

    code, err = run_cli(["hf-to-mcore", "--hf", str(hf_dir), "--out", str(tmp_path / "o"), "--tp", "3"], capsys)
    assert code == 2 and "parallel.tp=3 does not divide model.kv_heads=2" in err and not (tmp_path / "o").exists()

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, err = run_cli(["hf-to-mcore", "--hf", str(llama), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "model_type='llama'" in err and "qwen2" in err

    code, err = run_cli(["mcore-to-hf", "--ckpt", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "no infir checkpoint" in err

    assert main(["hf-to-mcore", "--hf", str(hf_dir), "--out", str(tmp_path / "ckpt")]) == 0
    code, err = run_cli(["hf-to-mcore", "--hf", str(hf_dir), "--out", str(tmp_path / "ckpt")], capsys)
    assert code == 2 and "already holds a checkpoint" in err


def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


@pytest.mark.parametrize("damage, message", [
    (lambda hf, ck: _truncate(hf / "model.safetensors"), "model.safetensors is not a readable safetensors file"),
    (lambda hf, ck: (hf / "config.json").write_text('{"model_type": "qwen2", '), "config.json is not valid JSON"),
    (lambda hf, ck: (hf / "config.json").write_text("[1, 2]"), "config.json holds a JSON list, not an object"),
])
def test_hf_to_mcore_names_a_truncated_or_corrupt_file(tmp_path, hf_dir, capsys, damage, message):
    damage(hf_dir, None)
    code, err = run_cli(["hf-to-mcore", "--hf", str(hf_dir), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and message in err and str(hf_dir) in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_a_sharded_hf_dir_with_a_truncated_or_missing_shard_is_named(tmp_path, hf_dir, capsys):
    hf_to_mcore(hf_dir, tmp_path / "ckpt")
    sharded = mcore_to_hf(tmp_path / "ckpt", tmp_path / "sharded", max_shard_size="100KB")
    first, second = sorted(sharded.glob("model-*.safetensors"))[:2]
    _truncate(first, 0.9)
    code, err = run_cli(["hf-to-mcore", "--hf", str(sharded), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"{first} is not a readable safetensors file" in err, err
    second.unlink()
    code, err = run_cli(["hf-to-mcore", "--hf", str(sharded), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"names {second.name}, missing from {sharded}" in err, err


@pytest.mark.parametrize("damage, message", [
    (lambda it: _truncate(it / "model_tp1.safetensors", 0.3), "model_tp1.safetensors is not a readable safetensors file"),
    (lambda it: _truncate(it / "meta.json"), "meta.json is not valid JSON"),
    (lambda it: (it / "meta.json").write_text('{"format": "infir-mcore-v1"}'), "meta.json has tp=None"),
    (lambda it: (it / "meta.json").write_bytes(b"\xff\xfe"), "meta.json is not valid JSON (not UTF-8)"),
])
def test_mcore_to_hf_names_a_truncated_or_corrupt_file(tmp_path, hf_dir, capsys, damage, message):
    iter_dir = hf_to_mcore(hf_dir, tmp_path / "ckpt", tp=2)
    damage(iter_dir)
    code, err = run_cli(["mcore-to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "back")], capsys)
    assert code == 2 and message in err and str(iter_dir) in err and err.count("\n") == 1, err
    assert not (tmp_path / "back").exists()


def test_tied_untied_mismatch_is_refused(hf_dir):
    state = load_file(str(hf_dir / "model.safetensors"))
    with_head = {**state, "lm_head.weight": torch.randn(SMALL.vocab, SMALL.hidden)}
    with pytest.raises(ValueError, match="tie_word_embeddings=true but the checkpoint's lm_head.weight differs"):
        hf_to_mcore_state(with_head, SMALL)
    with pytest.raises(ValueError, match="tie_word_embeddings=false but the checkpoint has no lm_head.weight"):
        hf_to_mcore_state(state, replace(SMALL, tied=False))
    (shard,) = hf_to_mcore_state(state, SMALL)
    with pytest.raises(ValueError, match="output_layer.weight but its meta says the model is tied"):
        mcore_to_hf_state([{**shard, "output_layer.weight": shard["embedding.word_embeddings.weight"]}], SMALL)
    with pytest.raises(KeyError, match="an untied model needs output_layer.weight"):
        mcore_to_hf_state([shard], replace(SMALL, tied=False))


def test_missing_and_misshapen_tensors_are_refused(hf_dir):
    state = load_file(str(hf_dir / "model.safetensors"))
    with pytest.raises(KeyError, match="lacks tensors its config.json implies: model.layers.1.mlp.up_proj.weight"):
        hf_to_mcore_state({k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}, SMALL)
    d = SMALL.hidden
    with pytest.raises(ValueError, match=rf"model.norm.weight has shape \({d - 1},\); config.json implies \({d},\)"):
        hf_to_mcore_state({**state, "model.norm.weight": torch.ones(d - 1)}, SMALL)
    with pytest.raises(KeyError, match="does not have: model.layers.2.input_layernorm.weight"):
        hf_to_mcore_state({**state, "model.layers.2.input_layernorm.weight": torch.ones(d)}, SMALL)
    shards = hf_to_mcore_state(state, SMALL, tp=2)
    shards[1]["decoder.final_layernorm.weight"] = shards[1]["decoder.final_layernorm.weight"] + 1
    with pytest.raises(ValueError, match="differs between TP rank 0 and rank 1"):
        mcore_to_hf_state(shards, SMALL)


def test_sharded_hf_directories_load(tmp_path, hf_dir):
    """Large models ship model-0000x-of-0000n.safetensors + an index; both directions handle it."""
    hf_to_mcore(hf_dir, tmp_path / "ckpt")
    out = mcore_to_hf(tmp_path / "ckpt", tmp_path / "sharded", max_shard_size="100KB")
    assert not (out / "model.safetensors").exists() and (out / "model.safetensors.index.json").exists()
    hf_to_mcore(out, tmp_path / "ckpt2")
    a = ckpt_format.load_shard(ckpt_format.resolve(tmp_path / "ckpt"), 0)
    b = ckpt_format.load_shard(ckpt_format.resolve(tmp_path / "ckpt2"), 0)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_and_generation_config_travel(tmp_path, hf_dir):
    from transformers import AutoTokenizer

    demo = Path(__file__).parents[2] / "infir" / "data" / "demo_tokenizer"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / name).write_bytes((demo / name).read_bytes())
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    gen.update({"eos_token_id": 2, "temperature": 0.65, "top_p": 0.95, "do_sample": True})
    (hf_dir / "generation_config.json").write_text(json.dumps(gen))

    out = mcore_to_hf(hf_to_mcore(hf_dir, tmp_path / "ckpt"), tmp_path / "back")
    assert (out / "tokenizer.json").read_bytes() == (demo / "tokenizer.json").read_bytes()
    assert AutoTokenizer.from_pretrained(out).encode("hello world") == AutoTokenizer.from_pretrained(demo).encode("hello world")
    back = json.loads((out / "generation_config.json").read_text())
    assert (back["eos_token_id"], back["temperature"], back["top_p"]) == (2, 0.65, 0.95)


def test_trainer_checkpoint_without_hf_fields_gets_token_ids_from_its_tokenizer(tmp_path):
    """A checkpoint written by infir-train names a tokenizer directory but carries no HF token ids."""
    from transformers import AutoTokenizer

    demo = Path(__file__).parents[2] / "infir" / "data" / "demo_tokenizer"
    size = replace(SMALL, vocab=8192)
    hf_state = random_hf_model(size).state_dict()
    tmp = tmp_path / "ckpt" / "iter_0000010.tmp"
    tmp.mkdir(parents=True)
    for r, shard in enumerate(hf_to_mcore_state(hf_state, size, tp=2)):
        ckpt_format.save_shard(tmp, r, shard)
    ckpt_format.write_meta(tmp, {"iteration": 10, "tp": 2, "model_name": "small", "tokenizer": str(demo),
                                 "model": {**size.__dict__, "head_dim": size.head_dim}})
    ckpt_format.commit(tmp, tmp_path / "ckpt" / "iter_0000010")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tokenizer must be found, not warned about
        out = mcore_to_hf(tmp_path / "ckpt", tmp_path / "hf")
    eos = AutoTokenizer.from_pretrained(demo).eos_token_id
    assert eos is not None
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos
