"""FlashAdamW: the PyTorch twin against the `flashoptim` package's kernel and against our Triton
kernel (bit for bit), the optimizer class, and its checkpoints."""
import io

import pytest
import torch

from infir.optim import FlashAdamW, companding
from infir.optim.adam_math import AdamScalars
from infir.optim.flash_adamw import flash_adamw_reference

interpreter_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="runs kernels in Triton's CPU interpreter; on a GPU host "
    "test_gpu.py checks the compiled kernels")


def _fresh_state(n: int, with_correction: bool) -> dict:
    g = companding.num_groups(n)
    return dict(correction=torch.zeros(n, dtype=torch.int8) if with_correction else None,
                m_codes=torch.zeros(n, dtype=torch.int8),
                m_scales=torch.zeros(g, dtype=torch.float16),
                v_codes=torch.zeros(n, dtype=torch.uint8),
                v_scales=torch.zeros(g, dtype=torch.float16))


def _gradient(n: int, gen: torch.Generator) -> torch.Tensor:
    # magnitudes spread over six decades: small groups next to large ones stress the scales
    decades = 10.0 ** torch.randint(-6, 0, (n,), generator=gen)
    return (torch.randn(n, generator=gen) * decades).to(torch.bfloat16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@interpreter_only
@pytest.mark.parametrize("n", [4099, 96])
def test_twin_matches_flashoptim_kernel_bitwise(flashoptim_kernels, n):
    fo = flashoptim_kernels
    gen = torch.Generator().manual_seed(n)
    lr, wd, betas, eps = 3e-3, 0.1, (0.9, 0.95), 1e-8
    param = torch.randn(n, generator=gen).to(torch.bfloat16)
    ours, theirs = _fresh_state(n, True), _fresh_state(n, True)
    their_param = param.clone()
    for step in range(1, 6):
        grad = _gradient(n, gen)
        out = flash_adamw_reference(param, grad, ours["correction"], ours["m_codes"],
                                    ours["m_scales"], ours["v_codes"], ours["v_scales"],
                                    AdamScalars.of(lr, *betas, eps, wd, step))
        param = out.pop("param")
        ours = out
        # flashoptim's FlashAdamW step: decoupled decay enters the kernel as lr * wd
        fo._fused_adam_step(theirs["m_codes"], theirs["m_scales"], theirs["v_codes"],
                            theirs["v_scales"], their_param, grad, theirs["correction"], lr,
                            *betas, eps, lr * wd, True, step)
        assert _same_bits(param, their_param), f"weights differ at step {step}"
        for key in ours:
            assert _same_bits(ours[key], theirs[key]), f"{key} differs at step {step}"
    # and through their decoders: dequantized states and reconstructed fp32 master weights
    from infir.optim.weight_split import merge_master
    assert torch.equal(merge_master(param, ours["correction"]),
                       fo.reconstruct_fp32_param(their_param, theirs["correction"]))
    assert torch.equal(companding.dequantize_momentum(ours["m_codes"], ours["m_scales"]),
                       _their_dequant(fo, theirs, "m"))
    assert torch.equal(companding.dequantize_variance(ours["v_codes"], ours["v_scales"]),
                       _their_dequant(fo, theirs, "v"))


def _their_dequant(fo, state: dict, which: str) -> torch.Tensor:
    # flashoptim.dequantize autotunes (needs a GPU driver); launch its kernel with one config
    codes, scales = state[f"{which}_codes"], state[f"{which}_scales"]
    out = torch.empty(codes.shape, dtype=torch.float32)
    signed = which == "m"
    # one program walks all blocks (the kernel's grid-stride loop)
    fo._triton_dequantize_kernel.fn[(1,)](codes, scales, out, codes.numel(),
                                          127.0 if signed else 255.0, 32, not signed, signed,
                                          BLOCK_SIZE_N=1024)
    return out


@interpreter_only
@pytest.mark.parametrize("dtype,n", [(torch.bfloat16, 3000), (torch.float32, 1030), (torch.bfloat16, 7)])
def test_triton_kernel_matches_twin_bitwise(dtype, n):
    from infir.optim.flash_adamw_triton import _flash_adamw_kernel, flash_adamw_triton_
    assert "Interpret" in type(_flash_adamw_kernel).__name__, "set TRITON_INTERPRET=1 before import"
    gen = torch.Generator().manual_seed(n)
    param = torch.randn(n, generator=gen).to(dtype)
    ref = _fresh_state(n, dtype == torch.bfloat16)
    fused = {k: (v.clone() if v is not None else None) for k, v in ref.items()}
    fused_param = param.clone()
    for step in range(1, 5):
        grad = _gradient(n, gen)
        s = AdamScalars.of(1e-3, 0.9, 0.999, 1e-8, 0.01, step)
        out = flash_adamw_reference(param, grad, ref["correction"], ref["m_codes"],
                                    ref["m_scales"], ref["v_codes"], ref["v_scales"], s)
        param, ref = out.pop("param"), out
        flash_adamw_triton_(fused_param, grad, fused["correction"], fused["m_codes"],
                            fused["m_scales"], fused["v_codes"], fused["v_scales"], s)
        assert _same_bits(param, fused_param), f"weights differ at step {step}"
        for key, value in ref.items():
            if value is not None:
                assert _same_bits(value, fused[key]), f"{key} differs at step {step}"


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8)).to(torch.bfloat16)


def _train(model, opt, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 40, generator=gen).to(next(model.parameters()).dtype)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def test_optimizer_class_follows_the_twin_and_tracks_fp32_adamw():
    model = _model()
    fp32 = _model().float()
    start = [q.detach().clone() for q in fp32.parameters()]
    opt = FlashAdamW(model.parameters(), lr=1e-2, fused=False)
    ref = torch.optim.AdamW(fp32.parameters(), lr=1e-2)
    _train(model, opt, 20, seed=1)
    _train(fp32, ref, 20, seed=1)
    for p, q, q0 in zip(model.parameters(), fp32.parameters(), start):
        # 8-bit states and bf16 forward passes perturb the trajectory, not its direction:
        # the master weights sit within 15% of fp32 AdamW's displacement from the start
        gap = (opt.master_weight(p) - q).norm()
        assert gap < 0.15 * (q - q0).norm(), f"gap {gap:.3g} vs moved {(q - q0).norm():.3g}"
        assert p.dtype == torch.bfloat16 and opt.state[p]["step"] == 20


def test_state_dict_round_trip_is_exact_and_compressed():
    model = _model()
    opt = FlashAdamW(model.parameters(), lr=1e-2, fused=False)
    _train(model, opt, 5, seed=2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    n_params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                      for t in st.values() if torch.is_tensor(t))
    weight_bytes = 2 * n_params
    # §3.4: 2 (weight) + 1 (correction) + 1 + 1 (states), + 2/32 + 2/32 for the fp16 scales
    assert (weight_bytes + state_bytes) / n_params == pytest.approx(5.125, abs=0.02)

    _train(model, opt, 5, seed=3)  # the run goes on ...
    buf.seek(0)
    saved = torch.load(buf)
    resumed = _model(seed=9)  # ... and a fresh process resumes from the checkpoint
    resumed.load_state_dict(saved["model"])
    opt2 = FlashAdamW(resumed.parameters(), lr=1e-2, fused=False)
    opt2.load_state_dict(saved["opt"])
    for p in resumed.parameters():
        assert opt2.state[p]["m_scales"].dtype == torch.float16
    _train(resumed, opt2, 5, seed=3)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert _same_bits(p.detach(), q.detach())
        for key, value in opt.state[p].items():
            other = opt2.state[q][key]
            assert _same_bits(value, other) if torch.is_tensor(value) else value == other


def test_reads_megatron_main_grad_when_grad_is_none():
    a, b = _model(), _model()
    opt_a = FlashAdamW(a.parameters(), fused=False)
    opt_b = FlashAdamW(b.parameters(), fused=False)
    x = torch.randn(8, 40).to(torch.bfloat16)
    a(x).float().sum().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        q.main_grad = p.grad.float()
    opt_a.step()
    opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert _same_bits(p.detach(), q.detach())


def test_rejects_fp16_params_with_a_clear_message():
    with pytest.raises(TypeError, match="bf16 or fp32"):
        FlashAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))])


@interpreter_only
def test_fused_class_step_matches_the_twin():
    """FlashAdamW.step() with fused=True (the Triton kernel, one launch per parameter: bf16 params with
    bf16 grads, a bf16 param with an fp32 main_grad, fp32 params) against fused=False, bit for bit."""
    def build():
        torch.manual_seed(3)
        return [torch.nn.Parameter(torch.randn(s).to(dt)) for s, dt in
                (((33, 5), torch.bfloat16), ((64,), torch.bfloat16), ((40, 3), torch.float32),
                 ((7,), torch.bfloat16))]
    a, b = build(), build()
    opt_a = FlashAdamW(a, lr=1e-2, weight_decay=0.1, fused=True)
    opt_b = FlashAdamW(b, lr=1e-2, weight_decay=0.1, fused=False)
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        for i, (p, q) in enumerate(zip(a, b)):
            g = torch.randn(p.shape, generator=gen)
            if i == 1:  # megatron-style fp32 main_grad
                p.grad = q.grad = None
                p.main_grad, q.main_grad = g.clone(), g.clone()
            else:
                p.grad, q.grad = g.to(p.dtype), g.to(q.dtype)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        assert _same_bits(p.detach(), q.detach())
        for key, value in opt_a.state[p].items():
            other = opt_b.state[q][key]
            assert _same_bits(value, other) if torch.is_tensor(value) else value == other
