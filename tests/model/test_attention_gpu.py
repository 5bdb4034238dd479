"""The CUDA attention kernels against the reference on the H100: packed documents, context-parallel
layouts (key segments longer than query segments: FlashAttention's bottom-right causal alignment), and
a compiled model whose packed rows give each document's own loss."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from infir.model.documents import build_layout, cp_positions

pytestmark = pytest.mark.gpu

LENGTHS = [[700, 13, 1, 290, 1044], [2048]]


def attention(kernel: str, heads=12, groups=2):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from infir.model.attention import CoreAttention

    cfg = TransformerConfig(num_layers=1, hidden_size=heads * 128, num_attention_heads=heads, num_query_groups=groups,
                            kv_channels=128, attention_dropout=0.0)
    return CoreAttention(cfg, layer_number=1, attn_mask_type=None, attention_type="self", kernel=kernel).cuda()


def rows() -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in ls]) for ls in LENGTHS])


@pytest.mark.parametrize("kernel", ["varlen", "flex"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_kernel_matches_the_reference_on_every_cp_rank(kernel, cp):
    """Each rank's queries against the whole gathered keys (as the all-gather leaves them): output
    and input gradients within bf16 tolerance of the fp32 dense-mask reference."""
    positions = rows()
    b, seq = positions.shape
    g = torch.Generator(device="cuda").manual_seed(cp)
    q, k, v = (torch.randn(seq, b, h, 128, device="cuda", generator=g) for h in (12, 2, 2))
    gathered = torch.as_tensor(np.concatenate([cp_positions(seq, cp, r) for r in range(cp)]), device="cuda")
    fast, ref = attention(kernel), attention("sdpa")
    for rank in range(cp):
        layout = build_layout(positions, cp, rank).to("cuda")
        local = torch.as_tensor(cp_positions(seq, cp, rank), device="cuda")
        dy = torch.randn(len(local), b, 12 * 128, device="cuda", generator=g)
        outs = []
        for attn, dtype in ((fast, torch.bfloat16), (ref, torch.float32)):
            leaves = [t.to(dtype).requires_grad_() for t in (q[local], k[gathered], v[gathered])]
            out = attn.attend_documents(*leaves, layout).reshape(len(local), b, -1)
            outs.append([out.float(), *(x.float() for x in torch.autograd.grad(out, leaves, dy.to(dtype)))])
        for got, want in zip(*outs):
            assert float((got - want).norm() / want.norm()) < 2e-2


def test_compiled_model_on_packed_rows_gives_each_documents_own_loss():
    from megatron.core import parallel_state

    from infir.model import build_gpt, get_size, transformer_config

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", store=torch.distributed.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    size = get_size("small-180m")
    torch.manual_seed(0)
    model = build_gpt(size, transformer_config(size, params_dtype=torch.bfloat16), seq_length=4096).cuda().eval()
    for layer in model.decoder.layers:
        layer.compile()
    lengths = [1500, 7, 900, 1689]
    g = torch.Generator().manual_seed(3)
    tokens, labels = (torch.randint(0, size.vocab, (1, sum(lengths)), generator=g).cuda() for _ in range(2))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(tokens, positions.cuda(), None, labels=labels, packed_seq_params=build_layout(positions).to("cuda"))
        at = 0
        for n in lengths:
            sl = slice(at, at + n)
            alone = model(tokens[:, sl], torch.arange(n, device="cuda")[None], None, labels=labels[:, sl])
            assert float((packed[:, sl].float() - alone.float()).abs().max()) < 0.05
            at += n
