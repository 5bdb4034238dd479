"""Loss-spike policy (`train.spike`): which steps' gradient norm is a spike.

A step is a spike when its gradient norm exceeds `factor` times the median norm of the last `window`
steps that were not spikes; no step is judged before the window is full (early norms fall fast and
say little). The median, unlike a mean, is not dragged up by the spike it should catch, and spikes
stay out of the window so a run of them does not become the new normal. What the loop does with a
spike is `action`: skip the step (its data is consumed, the weights stay), or roll back to the last
checkpoint and skip the data window since (PaLM's remedy for its spikes).

Pure bookkeeping on floats: every rank sees the same all-reduced norm, so every rank decides the
same, and the window travels in checkpoints so a resumed run judges as the uninterrupted one would.
"""
from __future__ import annotations

import statistics
from collections import deque

ACTIONS = ("none", "skip", "rollback")


class SpikePolicy:
    def __init__(self, action: str = "none", factor: float = 5.0, window: int = 50):
        if action not in ACTIONS:
            raise ValueError(f"spike action {action!r}: expected one of {', '.join(ACTIONS)}")
        self.action, self.factor = action, factor
        self.norms: deque[float] = deque(maxlen=window)

    def is_spike(self, grad_norm: float) -> bool:
        """Whether this step's norm is a spike; a norm that is not one joins the window."""
        if self.action == "none":
            return False
        if len(self.norms) == self.norms.maxlen and grad_norm > self.factor * self.median():
            return True
        self.norms.append(grad_norm)
        return False

    def median(self) -> float:
        return statistics.median(self.norms)

    def state_dict(self) -> dict:
        return {"norms": list(self.norms)}

    def load_state_dict(self, state: dict | None) -> None:
        """The window of a checkpoint (None: one saved without the policy: an empty window)."""
        self.norms.clear()
        self.norms.extend((state or {}).get("norms", []))
