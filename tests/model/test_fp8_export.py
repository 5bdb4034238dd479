"""`infir-convert mcore-to-hf --fp8`: the block-FP8 layout transformers' FineGrainedFP8 and vLLM load, the
FP8 bytes infir's FP8 layers compute, the size, the refusals, and logits through transformers' loader."""
from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from infir.eval.backends import HFBackend, fp8_kernel_missing
from infir.fp8 import dequantize, get_recipe
from infir.fp8.quantize import quantize_reference
from infir.model import ckpt_format
from infir.model.convert import deinterleave_qkv, hf_shapes, hf_to_mcore_state, load_into_model, main
from infir.model.convert import mcore_to_hf, mcore_to_hf_state, merge_tp, split_tp
from infir.model.fp8_export import is_block_gemm, quantization_config
from infir.model.qwen import SIZES, QwenSize

# head_dim 128: every split of the fused QKV and FC1 (and of TP=2 shards) falls on a 128 boundary, as in
# Qwen2.5-1.5B/3B/7B. Untied, so the LM head is exported too.
ALIGNED = QwenSize(hidden=512, layers=2, heads=4, kv_heads=2, ffn=768, vocab=512, tied=False, max_positions=128)
# head_dim 64, as Qwen2.5-0.5B: each query group's K and V rows (64 each) share a 128-row block.
HALF_HEAD = QwenSize(hidden=256, layers=2, heads=4, kv_heads=2, ffn=384, vocab=512, tied=True, max_positions=128)
BLOCK_GEMMS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEQ = 32


def random_hf_state(size: QwenSize, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random FP32 tensors whose magnitude changes every 64 rows by a power of two, so that blocks of
    rows get different scales (UE8M0 scales too)."""
    gen = torch.Generator().manual_seed(seed)

    def tensor(shape):
        magnitude = torch.exp2(torch.randint(-3, 3, (-(-shape[0] // 64),), generator=gen).float())
        return 0.05 * torch.randn(shape, generator=gen) * magnitude.repeat_interleave(64)[:shape[0]].reshape(-1, *[1] * (len(shape) - 1))

    return {k: tensor(s) for k, s in hf_shapes(size).items()}


def write_checkpoint(root: Path, size: QwenSize, shards: list[dict], recipe: str | None, **meta) -> Path:
    """An infir checkpoint as the trainer writes it (meta.json names the recipe)."""
    it = root / ckpt_format.iter_dir_name(7)
    it.mkdir(parents=True)
    for rank, shard in enumerate(shards):
        ckpt_format.save_shard(it, rank, shard)
    trained = {"precision": recipe, "recipe": recipe} if recipe else {}
    ckpt_format.write_meta(it, {"iteration": 7, "tp": len(shards), "model": asdict(size), "tokenizer": None, **trained, **meta})
    (root / ckpt_format.LATEST).write_text(it.name + "\n")
    return root


def export(tmp_path: Path, size: QwenSize, shards: list[dict], recipe: str, name: str = "hf") -> tuple[Path, list[str]]:
    """The --fp8 export of `shards`, and the warnings it gave."""
    ckpt = write_checkpoint(tmp_path / f"ckpt-{name}", size, shards, recipe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mcore_to_hf(ckpt, tmp_path / name, fp8=True)
    return out, [str(w.message) for w in caught if "FP8 export" in str(w.message)]


def read(out: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def transformers_dequantized(out: Path) -> dict[str, torch.Tensor]:
    """The weights transformers' FineGrainedFP8 loader makes of the export (dequantized, FP32)."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                 quantization_config=FineGrainedFP8Config(dequantize=True))
    return model.state_dict()


def block_weights(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.endswith(".weight") and k.split(".")[-2] in BLOCK_GEMMS}


def dequantized_shards(shards: list[dict], recipe: str) -> list[dict]:
    """Each rank's block GEMM weights replaced by the reference quantizer's FP8 values, dequantized."""
    w = get_recipe(recipe).weight
    return [{k: dequantize(quantize_reference(v, w.granularity, w.scale_format, w.fmt)) if is_block_gemm(k) else v
             for k, v in shard.items()} for shard in shards]


# --------------------------------------------------------------------------- layout
def expected_fp8_params(out: Path, tied: bool) -> dict[str, tuple[torch.dtype, tuple]]:
    """Name -> (dtype, shape) of every parameter transformers' FP8 model of this config.json holds."""
    from transformers import AutoConfig, AutoModelForCausalLM, FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear

    config = AutoConfig.from_pretrained(out)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    settings = config.quantization_config
    replace_with_fp8_linear(model, settings["modules_to_not_convert"], FineGrainedFP8Config(**settings), pre_quantized=True)
    params = {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}
    if tied:
        params.pop("lm_head.weight")  # a tied model's file holds the embedding only
    return params


@pytest.mark.parametrize("size", [ALIGNED, HALF_HEAD], ids=["aligned", "half_head"])
def test_export_has_the_layout_transformers_fp8_model_expects(tmp_path, size):
    out, _ = export(tmp_path, size, hf_to_mcore_state(random_hf_state(size), size), "fp8_blockwise_ue8m0")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == quantization_config()
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    assert config["quantization_config"]["activation_scheme"] == "dynamic"
    assert config["dtype"] == "bfloat16"
    state = read(out)
    got = {k: (v.dtype, tuple(v.shape)) for k, v in state.items()}
    want = expected_fp8_params(out, size.tied)
    assert got.keys() == want.keys()
    fp8 = {k for k in state if k.split(".")[-2] in BLOCK_GEMMS and k.endswith((".weight", ".weight_scale_inv"))}
    assert len(fp8) == 2 * 7 * size.layers
    for k, (dtype, shape) in got.items():
        if k in fp8:  # FP8 E4M3 weights and FP32 scales of [ceil(out/128), ceil(in/128)], as transformers allocates
            assert (dtype, shape) == want[k], k
        else:  # embeddings, norms, biases and the LM head stay BF16
            assert dtype == torch.bfloat16 and shape == want[k][1], k
    for k in fp8:
        if k.endswith("weight_scale_inv"):
            w = state[k.removesuffix("_scale_inv")]
            assert tuple(state[k].shape) == (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
            # UE8M0 scales stay powers of two
            assert torch.equal(state[k], torch.exp2(torch.log2(state[k]).round())), k


# --------------------------------------------------------------------------- the bytes
def infir_fp8_weights(size: QwenSize, state: dict, recipe: str) -> dict[str, torch.Tensor]:
    """Each FP8 layer's own FP8 weight (its WeightCache after a forward), dequantized, by megatron name."""
    from infir.model import build_gpt, transformer_config
    from infir.model.fp8_linears import fp8_linears_of

    # on a GPU host megatron's RoPE moves its table to the GPU whatever the model's device: run there
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_gpt(size, transformer_config(size, autocast_dtype=torch.bfloat16), get_recipe(recipe), seq_length=SEQ)
    load_into_model(model, state)
    model.to(device)
    tokens = torch.randint(0, size.vocab, (1, SEQ), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        model(tokens, torch.arange(SEQ, device=device)[None], None)
    names = {id(m): n for n, m in model.named_modules()}
    return {f"{names[id(m)]}.weight": dequantize(m.weight_cache.q).cpu() for m in fp8_linears_of(model)}


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise"])
def test_dequantized_export_is_infir_fp8_weights_bit_for_bit(tmp_path, megatron_tp1, recipe):
    (shard,) = hf_to_mcore_state(random_hf_state(ALIGNED), ALIGNED)
    layers = infir_fp8_weights(ALIGNED, shard, recipe)
    assert len(layers) == 4 * ALIGNED.layers
    want = block_weights(mcore_to_hf_state([{**shard, **layers}], ALIGNED))
    out, notes = export(tmp_path, ALIGNED, [shard], recipe)
    got = block_weights(transformers_dequantized(out))
    assert got.keys() == want.keys() and not notes
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # not the high-precision weights: the check above can fail
    assert not torch.equal(got["model.layers.0.mlp.up_proj.weight"], random_hf_state(ALIGNED)["model.layers.0.mlp.up_proj.weight"])


def test_blocks_straddling_two_training_blocks_are_quantized_afresh(tmp_path, megatron_tp1):
    """Qwen2.5-0.5B's case (head_dim 64): an HF K or V block holds the rows of two query groups, from two
    of training's blocks. Where their scales differ the block is quantized from the weight itself; every
    other block is infir's FP8 weight bit for bit. (A re-quantized block can still dequantize to training's
    values: two UE8M0 scales differ by a power of two, and E4M3 values move exactly between them until they
    fall below its normal range; so fewer blocks may differ than the export reports.)"""
    hf = random_hf_state(HALF_HEAD)
    (shard,) = hf_to_mcore_state(hf, HALF_HEAD)
    want = block_weights(mcore_to_hf_state([{**shard, **infir_fp8_weights(HALF_HEAD, shard, "fp8_blockwise_ue8m0")}], HALF_HEAD))
    out, notes = export(tmp_path, HALF_HEAD, [shard], "fp8_blockwise_ue8m0")
    got = block_weights(transformers_dequantized(out))
    fresh = 0
    for k in want:
        for r in range(0, want[k].shape[0], 128):
            for c in range(0, want[k].shape[1], 128):
                g, w = got[k][r:r + 128, c:c + 128], want[k][r:r + 128, c:c + 128]
                if torch.equal(g, w):
                    continue
                assert k.split(".")[-2] in ("k_proj", "v_proj"), f"{k} block ({r}, {c}) is not training's"
                block = hf[k][r:r + 128, c:c + 128]
                assert torch.equal(g, dequantize(quantize_reference(block, "block", "ue8m0"))), (k, r, c)
                fresh += 1
    assert len(notes) == 1 and "(in k_proj, v_proj)" in notes[0]
    assert 0 < fresh <= int(notes[0].split("FP8 export: ")[1].split(" of ")[0])


@pytest.mark.parametrize("recipe", ["fp8_blockwise_ue8m0", "fp8_tensorwise"])
def test_tp2_export_takes_each_ranks_own_quantization(tmp_path, recipe):
    """Training quantizes each TP rank's shard: its blocks (or its one per-tensor scale) are the rank's."""
    hf = random_hf_state(ALIGNED)
    shards = split_tp(hf_to_mcore_state(hf, ALIGNED)[0], 2)
    out, notes = export(tmp_path, ALIGNED, shards, recipe, "tp2")
    got = block_weights(transformers_dequantized(out))
    want = block_weights(mcore_to_hf_state(dequantized_shards(shards, recipe), ALIGNED))
    assert not notes and all(torch.equal(got[k], want[k]) for k in want)
    out1, _ = export(tmp_path, ALIGNED, hf_to_mcore_state(hf, ALIGNED), recipe, "tp1")
    # ranks split at multiples of 128 hold the TP=1 blocks (byte-identical files); per-tensor scales are per rank
    same = (out1 / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert same == (recipe != "fp8_tensorwise")


def test_block_weights_take_at_most_055x_the_bf16_bytes(tmp_path):
    size = ALIGNED
    shards = hf_to_mcore_state(random_hf_state(size), size)
    out, _ = export(tmp_path, size, shards, "fp8_blockwise_ue8m0")
    bf16 = mcore_to_hf(write_checkpoint(tmp_path / "bf16-ckpt", size, shards, "bf16"), tmp_path / "bf16", dtype="bfloat16")
    nbytes = lambda state: sum(v.numel() * v.element_size() for k, v in state.items() if k.split(".")[-2] in BLOCK_GEMMS
                               and "bias" not in k)
    ratio = nbytes(read(out)) / nbytes(read(bf16))
    assert 0.5 < ratio <= 0.55, ratio


# --------------------------------------------------------------------------- which Qwen2.5 shapes split on blocks
def straddling(size: QwenSize, tp: int) -> set[str]:
    """The block GEMMs some of whose HF 128-row (o/down: 128-column) blocks take elements of two of
    training's blocks: each TP rank's rows (columns) tagged with their training block, moved through the
    conversion's TP merge and QKV / gate-up split."""
    d, out = size.head_dim, set()
    for key, n in (("self_attention.linear_qkv.weight", (size.heads + 2 * size.kv_heads) * d),
                   ("self_attention.linear_proj.weight", size.heads * d),
                   ("mlp.linear_fc1.weight", 2 * size.ffn), ("mlp.linear_fc2.weight", size.ffn)):
        row_parallel = key.endswith(("proj.weight", "fc2.weight"))
        tags = [(torch.arange(n // tp) // 128 + 1000 * r)[:, None] for r in range(tp)]
        merged = merge_tp([{key: t.t() if row_parallel else t} for t in tags])[key]
        if key.endswith("qkv.weight"):
            parts = deinterleave_qkv(merged, size)
        else:
            parts = (merged.t(),) if row_parallel else merged.chunk(2) if key.endswith("fc1.weight") else (merged,)
        if any(len(set(p[i:i + 128].flatten().tolist())) > 1 for p in parts for i in range(0, len(p), 128)):
            out.add(key)
    return out


@pytest.mark.parametrize("name, tp, expected", [
    ("qwen2.5-0.5b", 1, {"self_attention.linear_qkv.weight"}),
    ("qwen2.5-0.5b", 2, {"self_attention.linear_qkv.weight", "self_attention.linear_proj.weight"}),
    ("qwen2.5-1.5b", 1, set()), ("qwen2.5-1.5b", 2, set()),
    ("qwen2.5-3b", 1, set()), ("qwen2.5-3b", 2, set()),
    ("qwen2.5-7b", 1, set()), ("qwen2.5-7b", 2, set()), ("qwen2.5-7b", 4, set()),
])
def test_only_qwen25_05b_splits_inside_a_block(name, tp, expected):
    """fp8_export's docstring: which sizes can re-quantize a block at all."""
    assert straddling(SIZES[name], tp) == expected


# --------------------------------------------------------------------------- refusals and the CLI
def test_cli_writes_fp8_and_bf16_beside_it(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt", HALF_HEAD, hf_to_mcore_state(random_hf_state(HALF_HEAD), HALF_HEAD),
                            "fp8_blockwise_ue8m0")
    assert main(["mcore-to-hf", "--ckpt", str(ckpt), "--out", str(tmp_path / "fp8"), "--fp8"]) == 0
    assert main(["mcore-to-hf", "--ckpt", str(ckpt), "--out", str(tmp_path / "plain")]) == 0
    fp8, plain = read(tmp_path / "fp8"), read(tmp_path / "plain")
    assert fp8["model.layers.1.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert fp8["model.norm.weight"].dtype == torch.bfloat16 and plain["model.norm.weight"].dtype == torch.float32
    assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())


@pytest.mark.parametrize("recipe, message", [
    ("bf16", "was trained with precision=bf16: export it without --fp8"),
    (None, "was not trained by infir (converted from HF weights): export it without --fp8"),
    ("moss", "was trained with moss, whose weight scales follow the optimizer's updates"),
])
def test_fp8_needs_a_checkpoint_trained_with_an_fp8_recipe(tmp_path, capsys, recipe, message):
    ckpt = write_checkpoint(tmp_path / "ckpt", HALF_HEAD, hf_to_mcore_state(random_hf_state(HALF_HEAD), HALF_HEAD), recipe)
    with pytest.raises(SystemExit) as exit_info:
        main(["mcore-to-hf", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf"), "--fp8"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "hf").exists()


def test_a_nan_weight_is_named(tmp_path, capsys):
    (shard,) = hf_to_mcore_state(random_hf_state(HALF_HEAD), HALF_HEAD)
    shard["decoder.layers.1.mlp.linear_fc2.weight"][3, 5] = float("nan")
    ckpt = write_checkpoint(tmp_path / "ckpt", HALF_HEAD, [shard], "fp8_blockwise_ue8m0")
    with pytest.raises(SystemExit):
        main(["mcore-to-hf", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf"), "--fp8"])
    assert "decoder.layers.1.mlp.linear_fc2.weight (TP rank 0) holds NaN or inf" in capsys.readouterr().err


# --------------------------------------------------------------------------- logits
def infir_model(size: QwenSize, state: dict, recipe: str, device: str = "cpu"):
    """infir's model holding `state` and running `recipe` as training does (autocast to its compute dtype)."""
    from infir.model import build_gpt, transformer_config

    r = get_recipe(recipe)
    autocast = None if r.compute_dtype == torch.float32 else r.compute_dtype
    model = build_gpt(size, transformer_config(size, autocast_dtype=autocast), r if r.fp8 else None,
                      seq_length=size.max_positions)
    load_into_model(model, state)
    model.to(device).eval()

    def forward(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
            return model(tokens, torch.arange(tokens.shape[1], device=device).expand_as(tokens), None).float()

    return forward


def hf_forward(model):
    def forward(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=tokens).logits.float()

    return forward


def relative_logit_errors(got, want, tokens: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """Per prompt (row of `tokens`): the largest |got - want| of its logits relative to its largest |want|."""
    out = []
    for chunk in tokens.split(batch):
        g, w = got(chunk), want(chunk)
        out.append(((g - w).abs().amax(dim=(1, 2)) / w.abs().amax(dim=(1, 2))).cpu())
    return torch.cat(out)


def within_fp8_tolerance(fp8_other, fp8_infir, bf16_infir, tokens) -> tuple[float, float]:
    """(max relative logit error between two FP8 forwards, the bound it must keep). The bound: 2%, or, where
    FP8 itself moves infir's logits further from BF16 (same weights), twice that distance: each forward
    rounds its activations to E4M3 on its own grid (transformers with FP32 scales, infir's recipe with
    UE8M0 ones), and a randomly initialised deep model carries those roundings to the logits."""
    err = float(relative_logit_errors(fp8_other, fp8_infir, tokens).max())
    noise = float(relative_logit_errors(fp8_infir, bf16_infir, tokens).max())
    return err, max(0.02, 2 * noise)


def with_infirs_fp8_weights(size: QwenSize, shard: dict, recipe: str) -> dict:
    """`shard` as the export holds it: the FP8 layers' weights dequantized, every other tensor rounded to BF16."""
    weights = infir_fp8_weights(size, shard, recipe)
    return {k: weights.get(k, v.bfloat16().float()) for k, v in shard.items()}


def emulate_fp8_activations(model) -> None:
    """The input of each of transformers' FP8 linears quantized per 1x128 with FP32 scales, as its GPU
    kernel does (finegrained-fp8's activation quantizer), for a CPU model that dequantized its weights."""
    from infir.fp8.quantize import quantize_reference

    def quantize_input(module, args):
        return (dequantize(quantize_reference(args[0].float(), "token", "fp32")).to(args[0].dtype),)

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in BLOCK_GEMMS:
            module.register_forward_pre_hook(quantize_input)


def test_transformers_loads_the_export_with_infirs_logits(tmp_path, megatron_tp1):
    """transformers' FineGrainedFP8 loader on CPU (dequantize=True: its FP8 GEMM kernel needs a GPU) gives
    the logits of infir's FP32 model holding the same weights; with FP8 activations as its GPU kernel
    quantizes them, it stays within FP8 tolerance of infir's FP8 forward."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    size, recipe = ALIGNED, "fp8_blockwise_ue8m0"
    (shard,) = hf_to_mcore_state(random_hf_state(size), size)
    out, _ = export(tmp_path, size, [shard], recipe)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                              quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    tokens = torch.randint(0, size.vocab, (8, SEQ), generator=torch.Generator().manual_seed(3))
    same = with_infirs_fp8_weights(size, shard, recipe)
    assert float(relative_logit_errors(hf_forward(hf), infir_model(size, same, "fp32"), tokens).max()) < 1e-5

    emulate_fp8_activations(hf)
    err, bound = within_fp8_tolerance(hf_forward(hf), infir_model(size, shard, recipe), infir_model(size, same, "bf16"), tokens)
    assert err <= bound, (err, bound)


# --------------------------------------------------------------------------- infir-eval
def test_infir_eval_generates_from_the_export(tmp_path, capsys):
    """`infir-eval run model=<the export> backend.name=hf`: on a CPU, transformers dequantizes the FP8
    weights as they load (its FP8 GEMM kernel needs a GPU), and the backend says so."""
    from transformers import AutoTokenizer

    from infir.data import DEMO_TOKENIZER
    from infir.eval.cli import main as eval_main

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    size = QwenSize(hidden=128, layers=1, heads=1, kv_heads=1, ffn=256, vocab=len(tokenizer), tied=True, max_positions=512)
    ckpt = write_checkpoint(tmp_path / "ckpt", size, hf_to_mcore_state(random_hf_state(size), size), "fp8_blockwise_ue8m0",
                            tokenizer=str(DEMO_TOKENIZER))
    out = mcore_to_hf(ckpt, tmp_path / "hf", fp8=True)
    with pytest.warns(UserWarning, match="FP8 weights, and transformers' FP8 GEMM cannot run here"):
        backend = HFBackend(out, tokenizer, device="cpu")
    loaded = backend.model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(loaded, block_weights(transformers_dequantized(out))["model.layers.0.mlp.up_proj.weight"])

    run = tmp_path / "eval"
    with pytest.warns(UserWarning, match="dequantized on load"):
        assert eval_main(["run", f"model={out}", "benchmarks=[demo_arith]", "source=samples", "limit=2", "sampling.n=1",
                          "sampling.max_new_tokens=4", "backend.name=hf", f"out_dir={run}"]) == 0
    result = json.loads((run / "summary.json").read_text())["benchmarks"]["demo_arith"]
    assert result["problems"] == 2 and 0 < result["mean_tokens"] <= 4


# --------------------------------------------------------------------------- on the GPU
@pytest.fixture(scope="module")
def export_05b(tmp_path_factory, megatron_tp1):
    """Qwen2.5-0.5B's shapes, megatron's random init, trained (and exported) with InfiR2's recipe; 64 prompts."""
    from infir.model import build_gpt, get_size, transformer_config

    size, recipe = get_size("qwen2.5-0.5b"), "fp8_blockwise_ue8m0"
    torch.manual_seed(0)
    model = build_gpt(size, transformer_config(size, autocast_dtype=torch.bfloat16), get_recipe(recipe), seq_length=SEQ)
    shard = ckpt_format.model_state(model)
    out, notes = export(tmp_path_factory.mktemp("export_05b"), size, [shard], recipe)
    tokens = torch.randint(0, size.vocab, (64, 4 * SEQ), generator=torch.Generator().manual_seed(5)).cuda()
    return size, recipe, shard, out, tokens


@pytest.mark.gpu
def test_gpu_transformers_loads_the_fp8_export_as_fp8_linears(export_05b):
    from transformers import AutoModelForCausalLM
    from transformers.integrations.finegrained_fp8 import FP8Linear

    *_, out, _ = export_05b
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, device_map="cuda")
    layers = dict(model.named_modules())
    state = read(out)
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.23.mlp.down_proj"):
        assert isinstance(layers[name], FP8Linear)
        assert torch.equal(layers[name].weight.view(torch.uint8).cpu(), state[f"{name}.weight"].view(torch.uint8))
        assert torch.equal(layers[name].weight_scale_inv.float().cpu(), state[f"{name}.weight_scale_inv"])
    assert not isinstance(layers["lm_head"], FP8Linear) and model.lm_head.weight.dtype == torch.bfloat16


@pytest.mark.gpu
def test_gpu_dequantized_export_gives_infirs_fp32_logits(export_05b):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    size, recipe, shard, out, tokens = export_05b
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, device_map="cuda",
                                              quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    same = with_infirs_fp8_weights(size, shard, recipe)
    err = relative_logit_errors(hf_forward(hf), infir_model(size, same, "fp32", "cuda"), tokens)
    assert float(err.max()) < 1e-3


@pytest.mark.gpu
def test_gpu_transformers_fp8_logits_match_infirs_fp8_forward(export_05b):
    """The issue's target: transformers' FP8 model (its FP8 GEMMs, activations quantized on the fly) against
    infir's FP8 forward, 64 prompts. Prints both distances, so a run records them."""
    from transformers import AutoModelForCausalLM

    if (missing := fp8_kernel_missing()) is not None:
        pytest.skip(f"transformers' finegrained-fp8 kernel cannot be loaded here ({missing}); it comes from the HF "
                    "hub: `pip install kernels` and a hub cache holding kernels-community/finegrained-fp8")
    size, recipe, shard, out, tokens = export_05b
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, device_map="cuda").eval()
    same = with_infirs_fp8_weights(size, shard, recipe)
    err, bound = within_fp8_tolerance(hf_forward(hf), infir_model(size, shard, recipe, "cuda"),
                                      infir_model(size, same, "bf16", "cuda"), tokens)
    print(f"max relative logit error, transformers FP8 vs infir FP8: {err:.4f} (bound {bound:.4f})")
    assert err <= bound


@pytest.mark.gpu
def test_gpu_vllm_serves_the_export(export_05b):
    """vLLM reads the export's quantization_config as its `fp8` method and generates (the export holds no
    tokenizer: token ids in, token ids out)."""
    pytest.importorskip("vllm")
    *_, out, tokens = export_05b
    gc.collect()
    torch.cuda.empty_cache()  # vLLM, in its own process, sizes its cache by the memory free on the GPU
    script = (
        "from vllm import LLM, SamplingParams\n"
        f"llm = LLM(model={str(out)!r}, enforce_eager=True, gpu_memory_utilization=0.3, skip_tokenizer_init=True)\n"
        "assert llm.llm_engine.model_config.quantization == 'fp8', llm.llm_engine.model_config.quantization\n"
        f"prompts = [{{'prompt_token_ids': t}} for t in {tokens[:8, :16].tolist()!r}]\n"
        "outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, detokenize=False))\n"
        "assert all(len(o.outputs[0].token_ids) == 8 for o in outs)\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=900)
