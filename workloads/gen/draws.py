"""What each request of a synthetic workload is, apart from when it comes: prompt and output lengths,
shared-prefix group, priority. :class:`Drawer` parses the ``[workload]`` table once and draws any number
of requests at a time; numpy draws each element in turn from its stream, so drawing in chunks gives the
same requests as drawing all at once (the lazy workloads rely on it: tests/test_lazy_workloads.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.fields import MAX_GENERATED, MAX_PRIORITY
from sim.core.request import PrefixHashes, RequestSpec
from sim.core.spec import plain_spec
from workloads.gen.lengths import LengthDist, check_keys, clip_to_context, read_float, read_int


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    num_groups: int
    prefix_len: int

    @classmethod
    def from_config(cls, cfg: Any, where: str) -> SharedPrefix:
        if not isinstance(cfg, Mapping):
            raise ConfigError(
                f"{where}: expected a table {{num_groups = ..., prefix_len = ...}}, got {cfg!r}"
            )
        check_keys(cfg, ("num_groups", "prefix_len"), where)
        return cls(read_int(cfg, "num_groups", where, lo=1, hi=MAX_GENERATED),
                   read_int(cfg, "prefix_len", where, lo=1, hi=MAX_GENERATED))


@dataclass(frozen=True, slots=True)
class PriorityMix:
    levels: tuple[int, ...]
    weights: tuple[float, ...]  # normalised to sum 1

    @classmethod
    def from_config(cls, cfg: Any, where: str) -> PriorityMix:
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{where}: expected a table {{levels = [...], weights = [...]}}, got {cfg!r}")
        check_keys(cfg, ("levels", "weights"), where)
        levels = cfg.get("levels")
        if not isinstance(levels, list | tuple) or not levels:
            raise ConfigError(f"{where}.levels: expected a non-empty list of integers, got {levels!r}")
        lv = tuple(read_int({"levels": x}, "levels", where, lo=-MAX_PRIORITY, hi=MAX_PRIORITY) for x in levels)
        dup = next((x for i, x in enumerate(lv) if x in lv[:i]), None)
        if dup is not None:  # its weights would be split between two entries of one level
            raise ConfigError(f"{where}.levels: {dup} given twice in {list(lv)}; allowed: distinct levels (weigh "
                              "a level with weights)")
        w_raw = cfg.get("weights", [1.0] * len(lv))
        if not isinstance(w_raw, list | tuple) or len(w_raw) != len(lv):
            raise ConfigError(
                f"{where}.weights: expected a list of {len(lv)} numbers (one per level), got {w_raw!r}"
            )
        w = [read_float({"weights": x}, "weights", where, lo=0.0, hi=1e9) for x in w_raw]  # relative: 1e9 is plenty
        if sum(w) <= 0:
            raise ConfigError(f"{where}.weights: must not all be zero")
        return cls(lv, tuple(x / sum(w) for x in w))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        idx = rng.choice(len(self.levels), size=n, p=np.asarray(self.weights))
        return np.asarray(self.levels, dtype=np.int64)[idx]


class GroupPrefixes:
    """Each shared-prefix group's system-prompt block hashes, made the first time a request of the group
    is drawn (a workload may name far more groups than it ever draws: none are made up front)."""

    def __init__(self, prefix_len: int) -> None:
        self.prefix_len = prefix_len
        self._made: dict[int, PrefixHashes] = {}

    def __getitem__(self, g: int) -> PrefixHashes:
        ph = self._made.get(g)
        if ph is None:
            ph = self._made[g] = PrefixHashes(segments("", g, self.prefix_len, self.prefix_len)[:1])
        return ph


@dataclass(frozen=True)
class Draws:
    """Everything about a run of consecutive requests except their arrival times; identical for any
    arrival setting."""

    prompt_lens: np.ndarray  # total prompt, prefix included
    output_lens: np.ndarray
    priorities: np.ndarray
    groups: np.ndarray | None
    prefix_len: int
    num_clipped: int
    prefix_hashes: GroupPrefixes | None = None  # each group's system prompt's block hashes

    def spec(self, i: int, j: int, arrival_time: float, session_id: str | None = None) -> RequestSpec:
        """Request number ``i`` (id ``r<i>``), row ``j`` of these draws."""
        rid = f"r{i}"
        p = int(self.prompt_lens[j])
        segs = ph = None
        if self.groups is not None:
            g = int(self.groups[j])
            segs = segments(rid, g, self.prefix_len, p)
            ph = self.prefix_hashes[g] if self.prefix_hashes is not None else None
        # past the group's prefix the prompt ("u", rid) and the output are this request's alone
        return RequestSpec(request_id=rid, arrival_time=arrival_time, prompt_len=p,
                           output_len=int(self.output_lens[j]), priority=int(self.priorities[j]),
                           session_id=session_id, segments=segs, prefix_hashes=ph,
                           private_from=self.prefix_len if segs is not None else None)  # fmt: skip

    def specs(self, i0: int, times: list[float]) -> list[RequestSpec]:
        """Requests ``i0, i0 + 1, ...`` arriving at ``times`` (one per row)."""
        prompts, outputs, prios = self.prompt_lens.tolist(), self.output_lens.tolist(), self.priorities.tolist()
        if self.groups is None:
            return [plain_spec(f"r{i0 + j}", t, prompts[j], outputs[j], prios[j]) for j, t in enumerate(times)]
        return [self.spec(i0 + j, j, t) for j, t in enumerate(times)]


def segments(rid: str, group: int, prefix_len: int, prompt_len: int) -> tuple:
    return ((("sys", group), prefix_len), (("u", rid), prompt_len - prefix_len))


class Drawer:
    """The per-request draws of one ``[workload]`` table (see module doc); ``draw(n)`` takes the next ``n``
    from the given streams. The table is checked when the Drawer is made, before any draw."""

    def __init__(self, cfg: Mapping[str, Any], where: str, max_model_len: int | None,
                 base_dir: str | Path | None) -> None:  # fmt: skip
        for key in ("prompt", "output"):
            if key not in cfg:
                raise ConfigError(
                    f'{where}.{key}: required (a length distribution, e.g. {{dist = "fixed", value = 128}})'
                )
        self.prompt = LengthDist.from_config(cfg["prompt"], f"{where}.prompt", base_dir)
        self.output = LengthDist.from_config(cfg["output"], f"{where}.output", base_dir)
        sp = cfg.get("shared_prefix")
        self.shared = None if sp is None else SharedPrefix.from_config(sp, f"{where}.shared_prefix")
        # each group's system prompt hashed once for every draw (sim.core.request.PrefixHashes)
        self.prefix_hashes = None if self.shared is None else GroupPrefixes(self.shared.prefix_len)
        self.prefix_len = 0 if self.shared is None else self.shared.prefix_len
        pr = cfg.get("priority")
        self.priority = None if pr is None else PriorityMix.from_config(pr, f"{where}.priority")
        self.max_model_len = max_model_len
        if max_model_len is not None and self.prefix_len + 2 > max_model_len:
            raise ConfigError(
                f"{where}.shared_prefix.prefix_len: {self.prefix_len} leaves no room for a prompt and an "
                f"output within max_model_len {max_model_len}"
            )

    def draw(self, n: int, streams: dict[str, np.random.Generator]) -> Draws:
        prompt = self.prompt.sample(n, streams["prompt"])
        output = self.output.sample(n, streams["output"])
        groups = None
        if self.shared is not None:
            groups = streams["prefix_group"].integers(0, self.shared.num_groups, size=n)
            prompt = prompt + self.prefix_len
        if self.priority is not None:
            priorities = self.priority.sample(n, streams["priority"])
        else:
            priorities = np.zeros(n, dtype=np.int64)
        num_clipped = 0
        if self.max_model_len is not None:
            prompt, output, changed = clip_to_context(prompt, output, self.max_model_len,
                                                      min_prompt=self.prefix_len + 1)  # fmt: skip
            num_clipped = int(changed.sum())
        return Draws(prompt, output, priorities, groups, self.prefix_len, num_clipped, self.prefix_hashes)
