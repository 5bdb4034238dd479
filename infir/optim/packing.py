"""One allocation per parameter for its optimizer states.

A parameter's state tensors (FlashAdamW: codes, scales and the correction, five tensors) become
views into one buffer, each at a 64-byte aligned offset (the fused kernels assume 16). On the host
this lets offloading move them with one copy each way. On the GPU the caching allocator gets one
block per parameter instead of five, so the allocator's per-block rounding is paid once (bench/optim.py
measures the bytes per parameter allocated against the layout's). The state dict gives each buffer whole (PerParamOptimizer.state_dict).
"""
import torch

ALIGN = 64


def packed(tensors: dict[str, torch.Tensor], device, pin: bool = False) -> dict[str, torch.Tensor]:
    """Copies of ``tensors`` as views into one buffer on ``device`` (pinned if ``pin``)."""
    offsets, total = [], 0
    for t in tensors.values():
        offsets.append(total)
        total += (t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN
    buf = torch.empty(max(total, ALIGN), dtype=torch.uint8, device=device, pin_memory=pin)
    out = {}
    for (k, t), off in zip(tensors.items(), offsets):
        view = buf[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t)
        out[k] = view
    return out


def packed_buffer(tensors: dict[str, torch.Tensor]):
    """The one buffer that ``tensors`` are contiguous views of, or None when they are not packed
    (states replaced from outside)."""
    first = next(iter(tensors.values()), None)
    if first is None:
        return None
    storage = first.untyped_storage()
    if any(t.untyped_storage().data_ptr() != storage.data_ptr() or not t.is_contiguous()
           for t in tensors.values()):
        return None
    return torch.empty(0, dtype=torch.uint8, device=first.device).set_(storage)
