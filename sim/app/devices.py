"""Replicas that share one card: busy instances split its compute and bandwidth (module doc of
sim.app.cluster_config). Busy = the gateway has requests outstanding there; the flags change only in
gateway events, so every step sees the same flags with or without fast-forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sim.cost.decode_price import price_decode_steps


class DeviceGroup:
    """One shared card: its members (replica indices) and which of them are busy."""

    def __init__(self, name: str, overlap: float) -> None:
        self.name = name
        self.overlap = overlap
        self.members: list[int] = []
        self.busy: dict[int, bool] = {}

    def factor(self, index: int) -> float:
        """How much slower member ``index``'s steps run while the others are busy."""
        others = sum(1 for j in self.members if j != index and self.busy.get(j, False))
        return 1.0 + (1.0 - self.overlap) * others


class SharedDeviceCost:
    """A replica's cost model on a shared card: its own step time times the card's contention factor."""

    def __init__(self, base: Any, group: DeviceGroup, index: int) -> None:
        self.base, self.group, self.index = base, group, index

    def step_time(self, batch) -> float:
        return self.base.step_time(batch) * self.group.factor(self.index)

    def decode_step_times(
        self, num_decode: int | np.ndarray, ctx_sums: np.ndarray, num_logits: int | None = None
    ):
        return self.base.decode_step_times(num_decode, ctx_sums, num_logits) * self.group.factor(self.index)

    def decode_step_list(self, rows: list[int], ctx_sums: list[int]) -> list[float]:
        f = self.group.factor(self.index)
        return [t * f for t in price_decode_steps(self.base, rows, ctx_sums)]

    def breakdown(self, batch) -> dict[str, float]:
        f = self.group.factor(self.index)
        return {k: v * f for k, v in self.base.breakdown(batch).items()}


class Devices:
    """The cluster's shared cards by name (replicas on a card of their own are not in any)."""

    def __init__(self, overlap: float) -> None:
        self.overlap = overlap
        self.groups: dict[str, DeviceGroup] = {}

    def cost_for(self, device: str | None, index: int, cost: Any) -> Any:
        """Replica ``index``'s cost model: ``cost`` itself, or priced under its card's contention."""
        if device is None:
            return cost
        group = self.groups.setdefault(device, DeviceGroup(device, self.overlap))
        group.members.append(index)
        return SharedDeviceCost(cost, group, index)

    def refresh(self, is_busy: Callable[[int], bool], nudge: Callable[[int], None]) -> None:
        """Update the busy flags; ``nudge`` every other member of a card whose flags changed (its step
        times change: the engine must end its decode run)."""
        for g in self.groups.values():
            for i in g.members:
                busy = is_busy(i)
                if g.busy.get(i, False) != busy:
                    g.busy[i] = busy
                    for j in g.members:
                        if j != i:
                            nudge(j)
