"""The chunked, fused LM head + cross entropy (infir.model.lm_loss, infir.model.gpt) against plain
PyTorch, against megatron's vocab-parallel cross entropy, and through the whole GPTModel; the token
embedding's gradient added into DDP's main_grad (infir.model.embedding) against torch's embedding backward.

The TP=2 checks run this same file as a worker under `torchrun --nproc_per_node 2` (gloo, CPU):
`python -m torch.distributed.run --nproc_per_node 2 tests/model/test_lm_loss.py`.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

from infir.model.lm_loss import chunked_lm_loss, lm_loss_reference

FP32_LOSS_RTOL, FP32_GRAD_RTOL = 1e-6, 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: a tolerance relative to the tensor's scale, not to near-zero entries."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30)).item()


def random_problem(s=37, b=3, h=32, vocab=1000, seed=0, dtype=torch.float32, masked=0.3):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(s, b, h, generator=g).to(dtype)
    weight = (torch.randn(vocab, h, generator=g) * 0.3).to(dtype)
    labels = torch.randint(0, vocab, (b, s), generator=g)
    mask = (torch.rand(b, s, generator=g) >= masked).float()
    return hidden, weight, labels, mask


def loss_and_grads(fn, hidden, weight, *args, scale=1.0, **kwargs):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = fn(hidden, weight, *args, **kwargs)
    (out.loss * scale).backward()
    return out, hidden.grad, weight.grad


@contextlib.contextmanager
def megatron_parallel(tp: int = 1):
    """torch.distributed (gloo) and megatron's parallel state; one process unless torchrun made more."""
    from megatron.core import parallel_state

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        yield parallel_state.get_tensor_model_parallel_group()
    finally:
        parallel_state.destroy_model_parallel()
        if owned:
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- against the reference
@pytest.mark.parametrize("chunk", [1, 17, 50, 111, 10_000], ids=lambda c: f"chunk{c}")
def test_fp32_matches_the_unchunked_reference(chunk):
    hidden, weight, labels, mask = random_problem(seed=chunk)
    ref, ref_dh, ref_dw = loss_and_grads(lm_loss_reference, hidden, weight, labels, mask, scale=0.37)
    out, dh, dw = loss_and_grads(chunked_lm_loss, hidden, weight, labels, mask, scale=0.37, chunk_tokens=chunk)
    assert abs(out.loss.item() - ref.loss.item()) / abs(ref.loss.item()) < FP32_LOSS_RTOL
    assert rel_err(out.per_token, ref.per_token) < FP32_LOSS_RTOL
    assert rel_err(dh, ref_dh) < FP32_GRAD_RTOL and rel_err(dw, ref_dw) < FP32_GRAD_RTOL
    assert out.num_tokens.item() == mask.sum().item()
    assert out.per_token.shape == labels.shape and not out.per_token.requires_grad


def test_masked_tokens_contribute_nothing():
    hidden, weight, labels, mask = random_problem(masked=0.5)
    labels = torch.where(mask.bool(), labels, torch.full_like(labels, -100))  # out-of-vocab labels, weight 0
    out, dh, dw = loss_and_grads(chunked_lm_loss, hidden, weight, labels, mask, chunk_tokens=29)
    keep = mask.bool()
    kept_ref, _, _ = loss_and_grads(lm_loss_reference, hidden, weight, torch.where(keep, labels, 0), mask)
    assert abs(out.loss.item() - kept_ref.loss.item()) / kept_ref.loss.item() < FP32_LOSS_RTOL
    assert (dh.transpose(0, 1)[~keep] == 0).all()  # masked tokens get no hidden-state gradient
    assert dh.transpose(0, 1)[keep].abs().sum() > 0


def test_bf16_matches_the_reference_within_bf16_tolerance():
    hidden, weight, labels, mask = random_problem(dtype=torch.bfloat16, h=64, seed=5)
    ref, ref_dh, ref_dw = loss_and_grads(lm_loss_reference, hidden, weight, labels, mask)
    out, dh, dw = loss_and_grads(chunked_lm_loss, hidden, weight, labels, mask, chunk_tokens=23)
    assert dh.dtype == torch.bfloat16 and dw.dtype == torch.bfloat16
    # Both read the same bf16-rounded logits and take the softmax in FP32: the loss agrees closely.
    assert abs(out.loss.item() - ref.loss.item()) / ref.loss.item() < 1e-5
    assert rel_err(dh, ref_dh) < 2e-2 and rel_err(dw, ref_dw) < 2e-2


def test_autocast_runs_the_gemms_in_bf16_and_returns_fp32_weight_grads():
    hidden, weight, labels, mask = random_problem(h=64, seed=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, dh, dw = loss_and_grads(chunked_lm_loss, hidden, weight, labels, mask, chunk_tokens=40)
    ref, ref_dh, ref_dw = loss_and_grads(lm_loss_reference, hidden.bfloat16(), weight.bfloat16(), labels, mask)
    assert dw.dtype == torch.float32 and dh.dtype == torch.float32
    assert abs(out.loss.item() - ref.loss.item()) / ref.loss.item() < 1e-5
    assert rel_err(dh, ref_dh) < 2e-2 and rel_err(dw, ref_dw) < 2e-2


def test_no_grad_gives_the_same_loss():
    hidden, weight, labels, mask = random_problem()
    with torch.no_grad():
        out = chunked_lm_loss(hidden, weight, labels, mask, chunk_tokens=13)
    ref = lm_loss_reference(hidden, weight, labels, mask)
    assert abs(out.loss.item() - ref.loss.item()) / ref.loss.item() < FP32_LOSS_RTOL


def test_tied_weight_gets_the_lookup_and_the_head_gradient():
    hidden, weight, labels, mask = random_problem(seed=8)
    tokens = labels.roll(1, dims=1)

    def tied_loss(fn, **kw):
        w = weight.clone().requires_grad_()
        h = hidden + torch.nn.functional.embedding(tokens, w).transpose(0, 1)  # the lookup's use of W
        fn(h, w, labels, mask, **kw).loss.backward()
        return w.grad

    ref, ours = tied_loss(lm_loss_reference), tied_loss(chunked_lm_loss, chunk_tokens=31)
    head_only = loss_and_grads(lm_loss_reference, hidden, weight, labels, mask)[2]
    assert rel_err(ours, ref) < FP32_GRAD_RTOL
    assert rel_err(ours, head_only) > 1e-2  # the lookup's share is really there


def test_a_second_backward_through_one_forward_fails_loudly():
    hidden, weight, labels, mask = random_problem()
    h = hidden.clone().requires_grad_()
    loss = chunked_lm_loss(h, weight, labels, mask, chunk_tokens=50).loss
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_bad_arguments_raise_naming_the_fix():
    hidden, weight, labels, mask = random_problem()
    with pytest.raises(ValueError, match="loss_chunk_tokens"):
        chunked_lm_loss(hidden, weight, labels, mask, chunk_tokens=0)
    with pytest.raises(ValueError, match="labels are"):
        chunked_lm_loss(hidden, weight, labels.t(), mask)


# --------------------------------------------------------------------------- megatron, TP=1
def megatron_ce_loss(hidden, weight, labels, mask, tp_group, sequence_parallel):
    """megatron's path: column-parallel LM head (full logits) + vocab_parallel_cross_entropy."""
    from megatron.core import tensor_parallel

    from infir.model.linears import column_input

    tp = dist.get_world_size(tp_group)
    x = column_input(hidden, allreduce_dgrad=tp > 1 and not sequence_parallel, sequence_parallel=sequence_parallel, tp_group=tp_group)
    per_token = tensor_parallel.vocab_parallel_cross_entropy((x @ weight.t()).float(), labels.t().contiguous())
    return (per_token * mask.t()).sum()


def check_against_megatron_ce(tp_group, sequence_parallel: bool, dtype=torch.float32):
    """Same loss and gradients as megatron's vocab-parallel CE on this rank's shards (any TP size)."""
    tp, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    hidden, weight, labels, mask = random_problem(s=24, b=2, h=32, vocab=1000, seed=21, dtype=dtype)
    v_local = weight.shape[0] // tp
    w_shard = weight[rank * v_local : (rank + 1) * v_local]
    h_in = hidden.chunk(tp, dim=0)[rank] if sequence_parallel else hidden

    def run(fn):
        h, w = h_in.clone().requires_grad_(), w_shard.clone().requires_grad_()
        loss = fn(h, w)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    ref = run(lambda h, w: megatron_ce_loss(h, w, labels, mask, tp_group, sequence_parallel))
    ours = run(lambda h, w: chunked_lm_loss(h, w, labels, mask, chunk_tokens=19, tp_group=tp_group, sequence_parallel=sequence_parallel).loss)
    loss_tol, grad_tol = (FP32_LOSS_RTOL, FP32_GRAD_RTOL) if dtype == torch.float32 else (1e-5, 2e-2)
    assert abs(ours[0].item() - ref[0].item()) / ref[0].item() < loss_tol, (ours[0], ref[0])
    assert rel_err(ours[1], ref[1]) < grad_tol, ("dH", rel_err(ours[1], ref[1]))
    assert rel_err(ours[2], ref[2]) < grad_tol, ("dW", rel_err(ours[2], ref[2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tp1_matches_megatron_vocab_parallel_cross_entropy(dtype):
    with megatron_parallel(1) as group:
        check_against_megatron_ce(group, sequence_parallel=False, dtype=dtype)


# --------------------------------------------------------------------------- the whole model
def build_infir_gpt(tp: int, sequence_parallel: bool, seq: int, tied: bool = True):
    """infir's build_gpt with InfirGPTModel in place of GPTModel (the one-line change asked of qwen.py)."""
    import megatron.core.models.gpt as mgpt

    from infir.model.gpt import InfirGPTModel
    from infir.model.qwen import build_gpt, get_size, transformer_config

    size = get_size("tiny", tied=tied)
    original, mgpt.GPTModel = mgpt.GPTModel, InfirGPTModel
    try:
        model = build_gpt(size, transformer_config(size, tp=tp, sequence_parallel=sequence_parallel), seq_length=seq)
    finally:
        mgpt.GPTModel = original
    assert isinstance(model, InfirGPTModel)
    return model, size


def check_model_paths_agree(tp: int, sequence_parallel: bool, ddp: bool):
    """megatron's logits + CE path and the chunked path: same loss, same gradients on every parameter."""
    torch.manual_seed(0)
    b, s = 2, 32
    model, size = build_infir_gpt(tp, sequence_parallel, s)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, size.vocab, (b, s + 1), generator=g)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    mask = (torch.rand(b, s, generator=g) > 0.25).float()
    positions = torch.arange(s).expand(b, s)
    if ddp:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        model = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    inner = model.module if ddp else model

    def grads(chunked: bool):
        inner.chunked_loss, inner.loss_chunk_tokens = chunked, 23
        if ddp:
            model.zero_grad_buffer()
        else:
            model.zero_grad(set_to_none=True)
        out = model(inputs, positions, None, labels=labels, loss_mask=mask)
        loss = out if chunked else (out.float() * mask).sum()
        assert loss.dim() == 0
        loss.backward()
        return loss.detach(), {n: (p.main_grad if ddp else p.grad).clone() for n, p in inner.named_parameters()}

    ref_loss, ref = grads(False)
    loss, ours = grads(True)
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < FP32_LOSS_RTOL, (loss, ref_loss)
    for name in ref:
        assert rel_err(ours[name], ref[name]) < FP32_GRAD_RTOL, (name, rel_err(ours[name], ref[name]))
    assert inner.last_per_token_loss.shape == (b, s)
    assert size.tied and ref["embedding.word_embeddings.weight"].abs().sum() > 0
    # Without labels, or with chunked_loss off, the model is megatron's.
    with torch.no_grad():
        assert model(inputs, positions, None).shape == (b, s, size.vocab // tp)


def test_model_chunked_loss_matches_megatron_path():
    with megatron_parallel(1):
        check_model_paths_agree(tp=1, sequence_parallel=False, ddp=False)


def test_model_chunked_loss_reaches_ddp_main_grad():
    with megatron_parallel(1):
        check_model_paths_agree(tp=1, sequence_parallel=False, ddp=True)


# --------------------------------------------------------------------------- the embedding's rows into main_grad
def check_embedding_rows_into_main_grad(tp: int, sequence_parallel: bool, tied: bool):
    """Every parameter's main_grad after two accumulated micro-batches of few distinct tokens (each table row
    summed from many positions, on both halves of a TP=2 vocabulary), with DDP's overlapped reduce: the lookup
    that adds its rows into main_grad and the chunked LM head that adds its gradient there, against torch's
    embedding backward and megatron's logits + cross-entropy path. Deferred: the last micro-batch's rows
    held back from the table's gradient, reduced in a bucket of its own (distributed optimizer), then added."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding

    from infir.model.embedding import MainGradEmbedding

    b, s = 2, 32
    g = torch.Generator().manual_seed(7)
    pool = torch.tensor([0, 1, 2, 17, 4095, 4096, 4097, 6000, 8191])
    tokens = pool[torch.randint(0, len(pool), (2, b, s + 1), generator=g)]
    positions = torch.arange(s).expand(b, s)

    def main_grads(lookup: type, chunked: bool, deferred: bool = False) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model, _ = build_infir_gpt(tp, sequence_parallel, s, tied=tied)
        model.chunked_loss = chunked
        emb = model.embedding.word_embeddings
        assert type(emb) is MainGradEmbedding and emb.tied == tied
        emb.__class__ = lookup
        emb.weight.shared_embedding = deferred  # megatron's bucket of its own, under the distributed optimizer
        ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=True, use_distributed_optimizer=deferred), model)
        if deferred:
            assert ddp.param_to_bucket_group[emb.weight].params == {emb.weight}
        ddp.zero_grad_buffer()
        for i in range(2):
            with ddp.no_sync() if i == 0 else contextlib.nullcontext():
                if deferred and i == 1:
                    emb.defer_rows()
                out = ddp(tokens[i, :, :-1], positions, None, labels=tokens[i, :, 1:]).float().sum()
                if deferred and i == 1 and not tied:
                    ddp.param_to_bucket_group[emb.weight].register_grad_ready(emb.weight)
                out.backward()
        ddp.finish_grad_sync()
        if deferred:
            assert emb.deferred and emb._anchor.grad is None  # the rows held back; the anchor takes no gradient
            emb.add_deferred_rows(ps.get_data_parallel_group(with_context_parallel=True), 1.0)
        # the placeholders the lookup and the chunked head hand autograd are dropped by DDP's hook
        head = model.output_layer.weight  # None where tied to the embedding
        assert emb.weight.grad is None and (head is None or head.grad is None)
        return {n: p.main_grad.clone() for n, p in model.named_parameters()}

    ref = main_grads(VocabParallelEmbedding, chunked=False)
    assert ref["embedding.word_embeddings.weight"].abs().sum() > 0
    for ours in (main_grads(MainGradEmbedding, chunked=True), main_grads(MainGradEmbedding, chunked=True, deferred=True)):
        for name in ref:
            assert rel_err(ours[name], ref[name]) < FP32_GRAD_RTOL, (name, rel_err(ours[name], ref[name]))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_embedding_rows_into_main_grad_match_torchs_backward(tied):
    with megatron_parallel(1):
        check_embedding_rows_into_main_grad(tp=1, sequence_parallel=False, tied=tied)


# --------------------------------------------------------------------------- TP=2 under torchrun
def test_tp2_with_and_without_sequence_parallel_under_torchrun():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()), __file__]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("TP2 OK") == 2, run.stdout[-3000:]


def tp2_worker() -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    from infir.model import cpu_shims

    cpu_shims.install()
    for sp in (False, True):
        with megatron_parallel(dist.get_world_size()) as group:
            check_against_megatron_ce(group, sequence_parallel=sp)
            check_model_paths_agree(tp=dist.get_world_size(), sequence_parallel=sp, ddp=False)
            for tied in (True, False):
                check_embedding_rows_into_main_grad(tp=dist.get_world_size(), sequence_parallel=sp, tied=tied)
    print(f"TP2 OK rank {dist.get_rank()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    tp2_worker()
