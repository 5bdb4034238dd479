"""infir.train.comm_volume: each layout's collectives for a tiny model, against counts derived by hand from
what the layers issue (two column- and two row-parallel linears a layer, the embedding and the LM head), and
the data parallelism the trainer's optimizer config selects."""
import pytest

from infir.model.qwen import QwenSize
from infir.train.comm_volume import (
    FP8_TOKEN_BYTES, DataParallel, Layout, cp_collectives, dp_collectives, fp8_linear_params, rank_params, ring_factor,
    tp_collectives, trainer_data_parallel,
)
from infir.train.schema import OptimizerConfig

SIZE = QwenSize(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, tied=True, max_positions=256)
SEQ, MBS = 128, 2
ACT = MBS * SEQ * 64 * 2  # one BF16 hidden-state tensor of the micro-batch


def _sent(collectives, n: int, op: str | None = None) -> float:
    return sum(c.sent_bytes(n) for c in collectives if op is None or c.op == op)


def _calls(collectives, op: str) -> int:
    return sum(c.calls for c in collectives if c.op == op)


def test_ring_factors_are_nccl_tests_bus_factors():
    assert ring_factor("all_reduce", 4) == pytest.approx(2 * 3 / 4)
    assert ring_factor("all_gather", 4) == ring_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert ring_factor("all_reduce", 1) == 0
    with pytest.raises(ValueError, match="all_to_all"):
        ring_factor("all_to_all", 2)


def test_sequence_parallel_bf16_moves_four_tensors_a_layer_each_way():
    c = tp_collectives(SIZE, SEQ, MBS, Layout(tp=2))
    L = SIZE.layers
    # forward: gather QKV and FC1 inputs, scatter proj and FC2 outputs; backward: the reverse; plus the
    # embedding's scatter and the LM head's gather, and their gradients
    assert _calls(c, "all_gather") == _calls(c, "reduce_scatter") == 4 * L + 2
    assert all(x.bytes == ACT for x in c)
    assert _sent(c, 2) == pytest.approx((8 * L + 4) * ACT / 2)
    assert tp_collectives(SIZE, SEQ, MBS, Layout(tp=1)) == []


def test_full_recomputation_repeats_the_forward_collectives():
    L = SIZE.layers
    full = tp_collectives(SIZE, SEQ, MBS, Layout(tp=2, recompute="full"))
    assert _calls(full, "all_gather") == _calls(full, "reduce_scatter") == 6 * L + 2
    selective = tp_collectives(SIZE, SEQ, MBS, Layout(tp=2, recompute="selective"))
    assert selective == tp_collectives(SIZE, SEQ, MBS, Layout(tp=2))  # core attention holds no TP collective


def test_fp8_gathers_move_a_byte_and_a_scale_and_gather_xt_again_for_wgrad():
    L, tp = SIZE.layers, 4
    shard_tokens_bytes = ACT * FP8_TOKEN_BYTES / 2
    c = tp_collectives(SIZE, SEQ, MBS, Layout(tp=tp), fp8_gather=True)
    fp8 = [x for x in c if x.bytes != ACT]
    assert {x.op for x in fp8} == {"all_gather"} and all(x.bytes == pytest.approx(shard_tokens_bytes) for x in fp8)
    assert sum(x.calls for x in fp8) == 4 * L  # fprop's X and wgrad's X^T, for QKV and FC1
    bf16 = (2 * L + 2 * L + 2 * L + 4) * ACT  # proj/FC2 outputs and their grads, the QKV/FC1 input grads, embedding, head
    assert _sent(c, tp) == pytest.approx((bf16 + 4 * L * shard_tokens_bytes) * 3 / 4)
    assert FP8_TOKEN_BYTES == 1 + 4 / 128


def test_without_sequence_parallelism_two_all_reduces_a_layer_each_way():
    L = SIZE.layers
    c = tp_collectives(SIZE, SEQ, MBS, Layout(tp=2, sequence_parallel=False))
    assert {x.op for x in c} == {"all_reduce"} and _calls(c, "all_reduce") == 4 * L + 2
    assert _sent(c, 2) == pytest.approx((4 * L + 2) * ACT * 2 * (1 / 2))


def test_context_parallel_gathers_k_and_v_of_the_whole_sequence():
    L = SIZE.layers
    kv = MBS * SEQ * (SIZE.kv_heads // 2) * SIZE.head_dim * 2  # at TP=2, each rank's KV heads
    c = cp_collectives(SIZE, SEQ, MBS, Layout(tp=2, cp=2))
    assert all(x.bytes == kv and x.group == "cp" for x in c)
    assert _calls(c, "all_gather") == _calls(c, "reduce_scatter") == 2 * L
    recomputed = cp_collectives(SIZE, SEQ, MBS, Layout(tp=2, cp=2, recompute="selective"))
    assert _calls(recomputed, "all_gather") == 4 * L  # the gather sits in core attention, which is recomputed
    assert cp_collectives(SIZE, SEQ, MBS, Layout(tp=2)) == []


def test_rank_params_split_all_but_the_norms():
    norms = (2 * SIZE.layers + 1) * SIZE.hidden
    assert rank_params(SIZE, 1) == SIZE.num_params()
    assert rank_params(SIZE, 2) == pytest.approx((SIZE.num_params() - norms) / 2 + norms)


@pytest.mark.parametrize("dp", [2, 8])
def test_ddp_all_reduces_every_gradient_and_zero1_scatters_then_gathers(dp):
    layout = Layout(tp=2, dp=dp)
    P = rank_params(SIZE, 2)
    ddp = dp_collectives(SIZE, layout, DataParallel("ddp", grad_bytes=4))
    assert [(x.op, x.calls) for x in ddp] == [("all_reduce", 1)]
    assert _sent(ddp, dp) == pytest.approx(2 * (dp - 1) / dp * 4 * P)
    zero1 = dp_collectives(SIZE, layout, DataParallel("zero1", grad_bytes=2, param_bytes=2))
    assert _sent(zero1, dp, "reduce_scatter") == pytest.approx((dp - 1) / dp * 2 * P)
    assert _sent(zero1, dp, "all_gather") == pytest.approx((dp - 1) / dp * 2 * P)


def test_buckets_split_the_same_bytes_and_cp_ranks_reduce_gradients_too():
    P = rank_params(SIZE, 1)
    bucketed = dp_collectives(SIZE, Layout(dp=2), DataParallel("ddp", bucket_elems=10_000))
    assert bucketed[0].calls == -(-int(P) // 10_000) and bucketed[0].calls * bucketed[0].bytes == pytest.approx(4 * P)
    assert Layout(cp=2, dp=3).grad_ranks == 6
    assert dp_collectives(SIZE, Layout(cp=2), DataParallel()) != []  # dp=1, yet two CP ranks hold the weights
    assert dp_collectives(SIZE, Layout(tp=4), DataParallel()) == []


def test_the_trainer_shards_states_over_several_ranks_and_gathers_the_optimizers_param_dtype():
    default = trainer_data_parallel(OptimizerConfig(name="adamw"), Layout(dp=4))
    # ZeRO-1 by default, FP32 gradients, FP32 parameters (adamw's), megatron's 40M-element buckets, overlapped
    assert default == DataParallel("zero1", grad_bytes=4, param_bytes=4, bucket_elems=40_000_000, overlap=True)
    assert trainer_data_parallel(OptimizerConfig(name="adamw"), Layout(dp=64)).bucket_elems == 64_000_000  # 1M x DP
    assert trainer_data_parallel(OptimizerConfig(name="adamw"), Layout(cp=2)).mode == "zero1"  # CP ranks shard too
    assert trainer_data_parallel(OptimizerConfig(name="flash_adamw"), Layout(dp=2)).param_bytes == 2  # BF16 params
    fp8 = trainer_data_parallel(OptimizerConfig(name="adamw"), Layout(dp=2), fp8_params="amax")
    assert (fp8.fp8_params, fp8.param_bytes) == ("amax", 4)  # the rest of the parameters: FP32, adamw's
    assert trainer_data_parallel(OptimizerConfig(name="adamw", distributed=False), Layout(dp=2),
                                 fp8_params="amax").fp8_params == "off"  # replicated states: nothing gathered
    replicated = OptimizerConfig(name="adamw", distributed=False, overlap_grad_reduce=False)
    assert trainer_data_parallel(replicated, Layout(dp=2)) == DataParallel("ddp", 4, 4, bucket_elems=None, overlap=False)
    custom = OptimizerConfig(name="sr_adamw", grad_reduce_dtype="bf16", bucket_size=1000)
    assert trainer_data_parallel(custom, Layout(dp=2)) == DataParallel("zero1", 2, 2, bucket_elems=1000, overlap=True)
    assert trainer_data_parallel(OptimizerConfig(name="adamw"), Layout()).mode == "ddp"  # one rank: nothing sharded
    # BF16 autocast: FP32 masters cross as BF16, an FP8 recipe's linear weights as FP32 (each rank quantizes them)
    mixed = trainer_data_parallel(OptimizerConfig(name="adamw"), Layout(dp=2), bf16_params=True, fp8_linears=True)
    assert (mixed.param_bytes, mixed.fp8_weight_bytes) == (2, 4)
    F, P = fp8_linear_params(SIZE, 1), rank_params(SIZE, 1)
    gathered = next(c for c in dp_collectives(SIZE, Layout(dp=2), mixed) if c.name == "parameters")
    assert gathered.bytes * gathered.calls == pytest.approx(2 * (P - F) + 4 * F)
    assert trainer_data_parallel(OptimizerConfig(name="flash_adamw"), Layout(dp=2), bf16_params=True,
                                 fp8_linears=True).fp8_weight_bytes is None  # BF16 parameters: all cross alike
    with pytest.raises(ValueError, match="fp8_weight_bytes"):
        DataParallel("ddp", fp8_weight_bytes=4)


def test_bad_layouts_name_the_key():
    with pytest.raises(ValueError, match="tp=0"):
        Layout(tp=0)
    with pytest.raises(ValueError, match="recompute='some'"):
        Layout(recompute="some")
    with pytest.raises(ValueError, match="zero3"):
        DataParallel("zero3")


# 128-wide heads and dims that are multiples of 128: each weight is whole 128x128 blocks
BLOCKY = QwenSize(hidden=256, layers=2, heads=2, kv_heads=1, ffn=512, vocab=1024, tied=True, max_positions=256)


@pytest.mark.parametrize("tp, fp8, rest", [
    # a layer's QKV 256x512, proj 256x256, FC1 256x1024, FC2 512x256: 589824 weights, two layers; the rest:
    # embedding 262144, QKV biases 2 x 512, norms 5 x 256 (the norms whole on every TP rank)
    (1, 1_179_648, 262_144 + 1_024 + 1_280),
    (2, 589_824, 131_072 + 512 + 1_280),
])
def test_fp8_parameter_gather_moves_e4m3_linear_weights_with_block_scales_or_amaxes(tp, fp8, rest):
    layout = Layout(tp=tp, dp=4)
    assert rank_params(BLOCKY, tp) == fp8 + rest
    blocks = fp8 // (128 * 128)  # 72 blocks at TP=1, 36 at TP=2
    plain = dp_collectives(BLOCKY, layout, DataParallel("zero1", param_bytes=4))
    assert [(c.name, c.bytes) for c in plain] == [("gradients", 4 * (fp8 + rest)), ("parameters", 4 * (fp8 + rest))]
    scales = dp_collectives(BLOCKY, layout, DataParallel("zero1", param_bytes=4, fp8_params="scales"))
    assert [(c.name, c.op, c.bytes) for c in scales] == [
        ("gradients", "reduce_scatter", 4 * (fp8 + rest)), ("parameters", "all_gather", fp8 + 4 * blocks + 4 * rest)]
    amax = dp_collectives(BLOCKY, layout, DataParallel("zero1", param_bytes=2, fp8_params="amax"))
    assert [(c.name, c.op, c.bytes, c.phase) for c in amax[1:]] == [
        ("parameters", "all_gather", fp8 + 2 * rest, "params"), ("block amaxes", "all_reduce", 4 * blocks, "params")]
    assert scales[1].bytes == {1: 2_237_728, 2: 1_121_424}[tp]  # the same, summed by hand
    bucketed = dp_collectives(BLOCKY, layout, DataParallel("zero1", bucket_elems=100_000, fp8_params="amax"))
    assert [c.calls for c in bucketed] == [-(-(fp8 + rest) // 100_000)] * 3
    assert sum(c.calls * c.bytes for c in bucketed if c.op == "all_reduce") == pytest.approx(4 * blocks)


def test_fp8_parameter_gather_needs_sharded_states_and_a_known_scale_mode():
    with pytest.raises(ValueError, match="zero1"):
        DataParallel("ddp", fp8_params="scales")
    with pytest.raises(ValueError, match="fp8_params='fp8'"):
        DataParallel("zero1", fp8_params="fp8")
