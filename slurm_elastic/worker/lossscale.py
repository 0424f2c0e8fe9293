"""float16 training with a gradient scaler: `ElasticJob(..., scaler=torch.amp.GradScaler())`.

The job uses the script's scaler as torch's AMP recipe does, at the places where the job does the work:
`job.backward(loss)` back-propagates the scaled loss; once the step's gradients are summed over the ranks,
the job unscales them (before `clip_grad_norm=`), skips the optimizer step if any is inf or NaN, and updates
the scale. The summed gradients are the same on every rank, so every rank skips the same steps and keeps
the same scale. The scaler's state travels with the replica (peer transfers, checkpoints, `job.save`).

A `fully_shard` model's ranks each hold a different gradient shard: each unscales its own, the ranks agree
on whether any shard overflowed (one flag in the step's sum over the ranks), and every rank then skips the
same step and updates the scale alike (`unscale_shards`, `update_agreed`).

Inside the loop the script's own `scaler.scale(loss)` returns the loss unscaled (so `job.backward(
scaler.scale(loss))` scales once), and its `unscale_`, `step` and `update` do nothing: the job does them when
the whole global batch is summed, as `optimizer.step()` there does nothing (optguard.py). Outside the loop
the scaler acts as usual.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from slurm_elastic.errors import ConfigError


class LossScaling:
    def __init__(self, scaler: Any, in_loop: Callable[[], bool], ignored: Callable[[str], None]) -> None:
        if not isinstance(scaler, torch.amp.GradScaler):
            raise ConfigError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        self._scale, self._unscale, self._update = scaler.scale, scaler.unscale_, scaler.update
        self._guard(in_loop, ignored)

    @property
    def enabled(self) -> bool:
        return bool(self.scaler.is_enabled())

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self._scale(torch.zeros((), device=device))  # sets the scale up on a rank that ran no micro-batch
        self._unscale(optimizer)

    def finite(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether every gradient is finite (after `unscale`): a step with an inf or NaN is skipped."""
        if not self.enabled:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    def update(self) -> None:
        self._update()

    def unscale_shards(self, grads: Sequence[torch.Tensor]) -> bool:
        """Unscale this rank's gradient shards in place; whether they are all finite. Its peers' shards may
        not be: the caller agrees with them on the step's fate, then calls `update_agreed`."""
        if not grads:
            return True
        inverse = 1.0 / self.scaler.get_scale()
        for grad in grads:
            grad.mul_(inverse)
        # One flag per shard, read back once: a read per shard would wait on the device that many times.
        return bool(torch.stack([torch.isfinite(grad).all() for grad in grads]).all())

    def update_agreed(self, overflowed: bool) -> None:
        """GradScaler.update's rule, with the overflow that every rank agreed on: back off at once, grow after
        `growth_interval` clean steps in a row. Through the scaler's public state, which is all there is."""
        state = self.scaler.state_dict()
        scale, clean = float(state["scale"]), int(state["_growth_tracker"]) + 1
        if overflowed:
            scale, clean = scale * state["backoff_factor"], 0
        elif clean == state["growth_interval"]:
            grown = torch.tensor(scale * state["growth_factor"], dtype=torch.float32).item()  # the scale's dtype
            scale, clean = (grown if math.isfinite(grown) else scale), 0
        self.scaler.load_state_dict({**state, "scale": scale, "_growth_tracker": clean})

    def state(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.enabled else None

    def load(self, state: dict[str, Any] | None) -> None:
        if state is not None and self.enabled:
            self.scaler.load_state_dict(state)

    def _guard(self, in_loop: Callable[[], bool], ignored: Callable[[str], None]) -> None:
        """The script's own calls inside the loop (see the module's docstring)."""
        scaler = self.scaler
        real: dict[str, Callable[..., Any]] = {
            "scale": scaler.scale, "unscale_": scaler.unscale_, "step": scaler.step, "update": scaler.update
        }  # fmt: skip

        def scale(self: Any, outputs: Any) -> Any:
            return outputs if in_loop() else real["scale"](outputs)

        def deferred(name: str) -> Callable[..., Any]:
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                if in_loop():
                    ignored(f"scaler.{name}")
                    return None
                return real[name](*args, **kwargs)

            return call

        scaler.scale = types.MethodType(scale, scaler)  # type: ignore[method-assign]
        for name in ("unscale_", "step", "update"):
            setattr(scaler, name, types.MethodType(deferred(name), scaler))


__all__ = ["LossScaling"]
