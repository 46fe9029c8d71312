"""Paged KV memory: a block pool (blocks only) under a manager that speaks requests and tokens."""

from sim.kv.block_pool import BlockPool, KVBlock
from sim.kv.manager import KVCacheManager

__all__ = ["BlockPool", "KVBlock", "KVCacheManager"]
