"""The Qwen2.5 size table against the published HF configs and parameter counts, and the
QwenSize <-> Qwen2Config mapping (no hub access: the published values are written out here)."""
from dataclasses import replace

import pytest
import torch

from infir.model.hf_config import hf_config, size_from_hf_config, size_name
from infir.model.qwen import SIZES

# config.json of the Qwen/Qwen2.5-{0.5B,1.5B,3B,7B} repositories, architecture fields, as published
# (transformers 4.x layout: rope_theta at top level). max_position_embeddings differs between base
# and instruct repos, so it is left out.
PUBLISHED_CONFIGS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_hidden_layers=24,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_hidden_layers=28,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_hidden_layers=36,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_hidden_layers=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
COMMON = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-06,
              rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False, sliding_window=131072,
              max_window_layers=21, max_position_embeddings=32768, torch_dtype="bfloat16",
              bos_token_id=151643, eos_token_id=151643, attention_dropout=0.0)
# Parameter counts of the released checkpoints (model cards: 0.49B, 1.54B, 3.09B, 7.61B; exact values
# are the tensors' element counts, e.g. 7B's index total_size 15,231,233,024 bytes / 2 bytes per bf16).
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b": (494_032_768, 0.49),
    "qwen2.5-1.5b": (1_543_714_304, 1.54),
    "qwen2.5-3b": (3_085_938_688, 3.09),
    "qwen2.5-7b": (7_615_616_512, 7.61),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_size_table_matches_published_config(name):
    size = size_from_hf_config({**COMMON, **PUBLISHED_CONFIGS[name]})
    assert size == SIZES[name]
    assert size_name(replace(size, max_positions=131072)) == name  # base repos publish a longer context


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_match_published(name):
    exact, card_billions = PUBLISHED_PARAMS[name]
    count = SIZES[name].num_params()
    assert count == exact
    assert abs(count / 1e9 - card_billions) < 0.01  # the cards round some figures and truncate others


@pytest.mark.parametrize("name", sorted(SIZES))
def test_hf_model_of_our_config_has_num_params(name):
    """transformers' own Qwen2 built from hf_config(size) (on the meta device: no memory) agrees."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(SIZES[name]))
    assert sum(p.numel() for p in model.parameters()) == SIZES[name].num_params()
    assert model.config.tie_word_embeddings == SIZES[name].tied


@pytest.mark.parametrize("name", sorted(SIZES))
def test_hf_config_round_trips(name):
    size = SIZES[name]
    cfg = hf_config(size)
    assert size_from_hf_config(cfg) == size
    assert size_from_hf_config(cfg.to_dict()) == size


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(use_sliding_window=True), "use_sliding_window=true"),
        (dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), "RoPE scaling 'yarn'"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(model_type="llama"), "model_type='llama'"),
    ],
)
def test_configs_infir_cannot_represent_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        size_from_hf_config({**COMMON, **PUBLISHED_CONFIGS["qwen2.5-0.5b"], **change})
