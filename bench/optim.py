"""Optimizer benchmarks: step time, bytes per parameter, offload
overhead on a 1.5B training step, and a 7B training step with offloaded states.

    python bench/optim.py --out bench_optim.md          # on one H100 80GB
    python bench/optim.py --quick                       # tiny shapes: a smoke test, CPU too

Sections
  A  optimizer.step() alone over the parameter shapes of Qwen2.5-1.5B (1.54B params, random
     weights and gradients) vs torch.optim.AdamW(fused=True) on fp32 params and grads; persistent
     bytes per param (weights + grads + states) measured with torch.cuda.memory_allocated.
  B  a full training step of a randomly initialised Qwen2 1.5B (HF config built from scratch):
     micro-batches with gradient accumulation, then the optimizer; each offloaded optimizer
     against the same optimizer with its states on the GPU.
  C  a Qwen2 7B training step on one GPU with states offloaded to pinned host memory and the
     step inside the last backward (gradient release): peak GPU memory.
  K  (not in the default set) FlashAdamW kernel variants over the same 1.54B shapes: tile rows,
     warps, IEEE vs reciprocal division; each
     variant's result is compared bit for bit with the first one's, from the same start state.
"""
import argparse
import datetime
import gc
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench.result_file import write_result  # noqa: E402
from infir.optim import build_optimizer, enable_step_in_backward  # noqa: E402

GiB = 1 << 30
QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True)
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)


def qwen_param_shapes(cfg: dict) -> list[tuple]:
    h, i, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"]
    kv_dim = kv * h // cfg["num_attention_heads"]
    layer = [(h, h), (h,), (kv_dim, h), (kv_dim,), (kv_dim, h), (kv_dim,), (h, h),
             (i, h), (i, h), (h, i), (h,), (h,)]
    shapes = [(cfg["vocab_size"], h)] + layer * cfg["num_hidden_layers"] + [(h,)]
    if not cfg["tie_word_embeddings"]:
        shapes.append((cfg["vocab_size"], h))
    return shapes


class Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def time(self, fn, warmup: int, reps: int) -> float:
        """Median seconds of fn() over reps, after warmup calls."""
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        return statistics.median(out)


def allocated(device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(device)


def free_all():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def host_state_bytes(opt) -> int:
    return sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
               if torch.is_tensor(t) and t.device.type == "cpu")


# --- A: optimizer step alone -------------------------------------------------------------------
STEP_ROWS = [  # (label, registry name or peer, param dtype, grad dtype, kwargs)
    ("torch AdamW fused (fp32 params+grads)", "adamw", torch.float32, torch.float32, {}),
    ("flash_adamw (ours)", "flash_adamw", torch.bfloat16, torch.bfloat16, {}),
    ("flashoptim 0.1.4 FlashAdamW (peer)", "flashoptim", torch.bfloat16, torch.bfloat16, {}),
    ("sr_adamw (ours)", "sr_adamw", torch.bfloat16, torch.bfloat16, {}),
    ("bf16_adamw_rn (baseline)", "bf16_adamw_rn", torch.bfloat16, torch.bfloat16, {}),
    ("offload_adamw (states on host)", "offload_adamw", torch.bfloat16, torch.bfloat16, {}),
    ("flash_adamw offload=True", "flash_adamw", torch.bfloat16, torch.bfloat16, {"offload": True}),
]


def make_optimizer(name, params, **kw):
    hyper = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if name == "flashoptim":
        import flashoptim
        return flashoptim.FlashAdamW(params, **hyper)
    return build_optimizer(name, params, **hyper, **kw)


def section_a(shapes, device, clock, reps):
    n = sum(torch.Size(s).numel() for s in shapes)
    rows = []
    base_time = None
    for label, name, pdt, gdt, kw in STEP_ROWS:
        free_all()
        try:
            before = allocated(device)
            gen = torch.Generator(device=device).manual_seed(0)
            params = [torch.nn.Parameter((torch.randn(s, generator=gen, device=device) * 0.02).to(pdt))
                      for s in shapes]
            for p in params:
                p.grad = (torch.randn(p.shape, generator=gen, device=device) * 1e-3).to(gdt)
            opt = make_optimizer(name, params, **kw)
            opt.step()  # allocates the states
            if hasattr(opt, "synchronize"):
                opt.synchronize()
            total = allocated(device) - before
            grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
            step_s = clock.time(opt.step, warmup=2, reps=reps)
            if name == "adamw":
                base_time = step_s
            host = host_state_bytes(opt) if hasattr(opt, "offload") and opt.offload else 0
            rows.append((label, step_s, base_time, total / n, (total - grads) / n, host / n))
            del params, opt
        except Exception as e:  # a missing peer or an OOM should not lose the other rows
            rows.append((label, None, None, None, None, f"{type(e).__name__}: {e}"[:80]))
    lines = [f"### A. optimizer.step() over Qwen2.5-1.5B parameter shapes ({n / 1e9:.3f}B params)",
             "", "| optimizer | step ms | vs AdamW fused | GPU bytes/param: weights+grads+states "
             "| same, grads released | host bytes/param |", "|---|---|---|---|---|---|"]
    for label, t, base, with_g, no_g, host in rows:
        if t is None:
            lines.append(f"| {label} | failed: {host} | | | | |")
            continue
        ratio = f"{t / base:.2f}x" if base else "-"
        lines.append(f"| {label} | {t * 1e3:.1f} | {ratio} | {with_g:.3f} | {no_g:.3f} | {host:.3f} |")
    return lines


# --- K: FlashAdamW kernel variants -----------------------------------------------------------------
K_VARIANTS = [  # (label, rows, num_warps, fast_div)
    ("IEEE div (the old kernel)", 32, 4, False),
    ("rows 32, 4 warps, reciprocal div", 32, 4, True),
    ("rows 16, 4 warps, reciprocal div", 16, 4, True),
    ("rows 16, 2 warps, reciprocal div", 16, 2, True),
    ("rows 8, 2 warps, reciprocal div", 8, 2, True),
]


def section_k(shapes, device, clock, reps):
    from infir.optim import FlashAdamW
    from infir.optim import flash_adamw_triton as fat
    from infir.optim.adam_math import AdamScalars
    free_all()
    n = sum(torch.Size(s).numel() for s in shapes)
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.nn.Parameter((torch.randn(s, generator=gen, device=device) * 0.02).bfloat16())
              for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen, device=device) * 1e-3).bfloat16()
    opt = FlashAdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    opt.step()  # states hold real codes from here on
    start = [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)})
             for p in params]
    grads = [p.grad for p in params]
    states = [{k: v for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in params]
    s = AdamScalars.of(1e-4, 0.9, 0.95, 1e-8, 0.1, 2)

    def restore():
        for p, (w, st) in zip(params, start):
            p.data.copy_(w)
            for k, v in st.items():
                opt.state[p][k].copy_(v)

    if device.type == "cuda":
        big = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        out = torch.empty_like(big)
        copy_s = clock.time(lambda: out.copy_(big), 2, 10)
        bw = 2 * (1 << 30) / copy_s
        del big, out
    else:
        bw = float("nan")
    moved = sum(p.numel() * 12 + 8 * ((p.numel() + 31) // 32) for p in params)  # bytes read+written
    lines = [f"### K. FlashAdamW kernel variants, {n / 1e9:.3f}B params in {len(params)} tensors "
             f"(bf16 weights and grads)", "",
             f"device copy bandwidth (read+write): {bw / 1e9:.0f} GB/s; the step moves "
             f"{moved / n:.2f} B/param: floor {moved / bw * 1e3:.1f} ms", "",
             "| variant | step ms | GB/s | % of copy BW | bits vs first variant |", "|---|---|---|---|---|"]
    ref, best = None, None
    for label, rows, warps, fast in K_VARIANTS:
        try:
            def run():
                for p, g, st in zip(params, grads, states):
                    fat.flash_adamw_triton_(p, g, st.get("correction"), st["m_codes"],
                                            st["m_scales"], st["v_codes"], st["v_scales"], s,
                                            rows=rows, num_warps=warps, fast_div=fast)
            restore()
            run()
            result = [(p.detach().clone(), {k: v.clone() for k, v in st.items()})
                      for p, st in zip(params, states)]
            if ref is None:
                ref, same = result, "reference"
            else:
                same = "identical" if all(
                    torch.equal(a.view(torch.int16), b.view(torch.int16)) and
                    all(torch.equal(sa[k].view(torch.uint8), sb[k].view(torch.uint8)) for k in sa)
                    for (a, sa), (b, sb) in zip(ref, result)) else "DIFFERENT"
            del result
            t = clock.time(run, warmup=2, reps=reps)
            if same != "DIFFERENT" and (best is None or t < best[0]):
                best = (t, label, rows, warps, fast)
            lines.append(f"| {label} | {t * 1e3:.2f} | {moved / t / 1e9:.0f} | "
                         f"{moved / t / bw * 100:.0f} | {same} |")
        except Exception as e:
            lines.append(f"| {label} | failed: {type(e).__name__}: {str(e)[:120]} | | | |")
        print(lines[-1], flush=True)
    if best is not None:  # the sections after this one step FlashAdamW with the fastest variant
        _, label, fat.ROWS, fat.NUM_WARPS, fat.FAST_DIV = best
        lines.append(f"sections run after K use the fastest variant: {label}")
    del params, opt, start, ref, grads, states
    return lines


# --- B and C: training steps of a Qwen2 model ----------------------------------------------------
def build_qwen(cfg: dict, device, checkpointing: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(**cfg, attn_implementation="sdpa", use_cache=False)
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16)
    if checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    model.train()
    return model


def host_timer(opt) -> list:
    """Accumulates the host seconds spent inside opt.step() and the step-in-backward hooks'
    step_param calls (a list of one float, read after timing)."""
    total, depth = [0.0], [0]
    for name in ("step", "step_param"):
        inner = getattr(opt, name)

        def timed(*a, _inner=inner, **k):
            depth[0] += 1
            t = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:  # step() calls step_param(): count the outer call only
                    total[0] += time.perf_counter() - t
        setattr(opt, name, timed)
    return total


def train_step_fn(model, opt, batches, handle):
    def step():
        for i, ids in enumerate(batches):
            if handle is not None:
                handle.armed = i == len(batches) - 1
            model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def section_b(cfg, device, clock, micro, seq, accum, reps):
    gen = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, cfg["vocab_size"], (micro, seq), generator=gen, device=device)
               for _ in range(accum)]
    configs = [  # (label, optimizer, kwargs, step inside last backward, baseline label)
        ("sr_adamw, states on GPU", "sr_adamw", {}, False, None),
        ("offload_adamw, step after backward", "offload_adamw", {}, False, "sr_adamw, states on GPU"),
        ("offload_adamw, step in last backward", "offload_adamw", {}, True, "sr_adamw, states on GPU"),
        ("flash_adamw, states on GPU", "flash_adamw", {}, False, None),
        ("flash_adamw offload, step after backward", "flash_adamw", {"offload": True}, False,
         "flash_adamw, states on GPU"),
        ("flash_adamw offload, step in last backward", "flash_adamw", {"offload": True}, True,
         "flash_adamw, states on GPU"),
    ]
    times, lines = {}, []
    n = None
    for label, name, kw, in_bw, base in configs:
        free_all()
        start = allocated(device) / GiB
        try:
            model = build_qwen(cfg, device, checkpointing=False)
            n = sum(p.numel() for p in model.parameters())
            opt = make_optimizer(name, model.parameters(), **kw)
            host = host_timer(opt)
            handle = enable_step_in_backward(opt, model) if in_bw else None
            t = clock.time(train_step_fn(model, opt, batches, handle), warmup=1, reps=reps)
            peak = torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else 0
            times[label] = t
            over = f"{(t / times[base] - 1) * 100:+.1f}%" if base in times else "-"
            lines.append(f"| {label} | {t * 1e3:.0f} | {over} | {peak:.1f} | {start:.2f} | "
                         f"{host[0] / (1 + reps) * 1e3:.1f} |")
            del model, opt, handle
        except Exception as e:
            lines.append(f"| {label} | failed: {type(e).__name__}: {str(e)[:80]} | | | | |")
    head = [f"### B. Qwen2 1.5B training step ({(n or 0) / 1e9:.2f}B params, random init), "
            f"{accum} micro-batches x {micro}x{seq} tokens = {accum * micro * seq} tokens/step",
            "", "| optimizer | step ms | offload overhead | peak GPU GiB | GiB held at start "
            "| host ms in optimizer calls |", "|---|---|---|---|---|---|"]
    return head + lines


def section_c(cfg, device, clock, micro, seq, reps, checkpointing):
    gen = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, cfg["vocab_size"], (micro, seq), generator=gen, device=device)]
    lines = [f"### C. Qwen2 7B training step on one GPU ({micro}x{seq} tokens, activation "
             f"checkpointing {'on' if checkpointing else 'off'})", "",
             "| optimizer | params | step ms | peak GPU GiB | host state GiB | GiB held at start |",
             "|---|---|---|---|---|---|"]
    for label, name, kw in (("offload_adamw, step in backward (grads released)", "offload_adamw", {}),
                            ("flash_adamw offload, step in backward", "flash_adamw", {"offload": True}),
                            ("flash_adamw, states on GPU, step in backward", "flash_adamw", {})):
        free_all()
        start = allocated(device) / GiB
        try:
            model = build_qwen(cfg, device, checkpointing)
            n = sum(p.numel() for p in model.parameters())
            opt = make_optimizer(name, model.parameters(), **kw)
            handle = enable_step_in_backward(opt, model)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t = clock.time(train_step_fn(model, opt, batches, handle), warmup=1, reps=reps)
            peak = torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else 0
            lines.append(f"| {label} | {n / 1e9:.2f}B | {t * 1e3:.0f} | {peak:.1f} | "
                         f"{host_state_bytes(opt) / GiB:.1f} | {start:.2f} |")
            del model, opt, handle
        except Exception as e:
            lines.append(f"| {label} | | failed: {type(e).__name__}: {str(e)[:100]} | | | |")
    lines.append(f"\nFor scale: fp32 master + fp32 AdamW states + fp32 grads = 16 B/param = "
                 f"{16 * 7.62e9 / GiB:.0f} GiB for 7.62B params before activations.")
    return lines


def pcie_bandwidth(device) -> str:
    if device.type != "cuda":
        return "n/a (CPU)"
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    clock = Clock(device)
    h2d = clock.time(lambda: dev.copy_(host, non_blocking=True), 1, 5)
    d2h = clock.time(lambda: host.copy_(dev, non_blocking=True), 1, 5)
    return f"pinned H2D {1 / h2d:.1f} GiB/s, D2H {1 / d2h:.1f} GiB/s"


def header(device, argv) -> list[str]:
    import triton
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return ["## infir.optim benchmarks", "",
            f"- device: {name}; torch {torch.__version__}, triton {triton.__version__}, "
            f"CUDA {torch.version.cuda}",
            f"- command: `python {' '.join(argv)}`",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- PCIe: {pcie_bandwidth(device)}", ""]


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the markdown here, and its figures as JSON beside it (PATH.json)")
    ap.add_argument("--sections", default="ABC")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=2, help="B: sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--accum", type=int, default=8, help="B: micro-batches per optimizer step")
    args = ap.parse_args(argv[1:])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = Clock(device)
    small, big = (TINY, TINY) if args.quick else (QWEN_1_5B, QWEN_7B)
    seq = 16 if args.quick else args.seq
    lines = header(device, argv)
    print("\n".join(lines), flush=True)
    sections = {
        "A": lambda: section_a(qwen_param_shapes(small), device, clock, args.reps),
        "B": lambda: section_b(small, device, clock, args.micro, seq, args.accum, max(2, args.reps // 2)),
        "C": lambda: section_c(big, device, clock, 1, seq, 2, checkpointing=True),
        "K": lambda: section_k(qwen_param_shapes(small), device, clock, args.reps),
    }
    for key in args.sections:
        part = sections[key]() + [""]
        print("\n".join(part), flush=True)
        lines += part
    if args.out:
        text = "\n".join(lines) + "\n"
        with open(args.out, "w") as f:
            f.write(text)
        write_result(args.out, text)


if __name__ == "__main__":
    main()
