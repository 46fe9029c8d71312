"""CPU swap space for swap preemption (vLLM V0, engines.md §1.5 V0-1, V0-5, V0-6).

V0 copies a preempted group's GPU blocks into a CPU block pool of ``swap_space`` GiB and copies them
back before the group runs again. The CPU side needs no prefix cache or LRU order (V0 reuses nothing
from CPU blocks except the copy itself), so the pool only counts blocks per request.
"""

from __future__ import annotations

from sim.core.errors import ServesimError


class SwapSpaceError(ServesimError):
    """The CPU pool cannot hold a swap-out. vLLM V0 raises ``RuntimeError("Aborted due to the lack of CPU
    swap space...")`` here, which kills the engine (engines.md V0-5); the simulation stops the same way."""


class CpuBlockPool:
    """``num_blocks`` CPU blocks; a swapped-out request holds as many as it had on the GPU."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._held: dict[str, int] = {}
        self._used = 0
        self.num_swap_outs = 0  # swap-out events (requests), cumulative
        self.num_swap_ins = 0
        self.blocks_swapped_out = 0  # blocks copied GPU -> CPU, cumulative
        self.blocks_swapped_in = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._used

    @property
    def num_used_blocks(self) -> int:
        return self._used

    @property
    def usage(self) -> float:
        """V0's ``vllm:cpu_cache_usage_perc`` (0-1)."""
        return self._used / self.num_blocks if self.num_blocks else 0.0

    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def num_held(self, request_id: str) -> int:
        return self._held.get(request_id, 0)

    def put(self, request_id: str, n: int) -> None:
        """Store ``n`` blocks of ``request_id``; the caller has checked ``n <= num_free_blocks``."""
        if request_id in self._held:
            raise ValueError(f"request {request_id} is already swapped out")
        if n > self.num_free_blocks:
            raise ValueError(f"cannot swap out {n} blocks: {self.num_free_blocks} CPU blocks free")
        self._held[request_id] = n
        self._used += n
        self.num_swap_outs += 1
        self.blocks_swapped_out += n

    def take(self, request_id: str) -> int:
        """Release ``request_id``'s CPU blocks (swap-in); returns how many it held."""
        n = self._held.pop(request_id)
        self._used -= n
        self.num_swap_ins += 1
        self.blocks_swapped_in += n
        return n

    def drop(self, request_id: str) -> int:
        """Release without a copy back (the request was aborted while swapped out)."""
        n = self._held.pop(request_id, 0)
        self._used -= n
        return n

    def stats(self) -> dict[str, int]:
        return {
            "num_cpu_blocks": self.num_blocks,
            "num_swap_outs": self.num_swap_outs,
            "num_swap_ins": self.num_swap_ins,
            "blocks_swapped_out": self.blocks_swapped_out,
            "blocks_swapped_in": self.blocks_swapped_in,
            "cpu_blocks_in_use": self._used,
        }
