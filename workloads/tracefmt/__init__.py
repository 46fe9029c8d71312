"""Parsers for public request traces; the public entry point is :mod:`workloads.traces`.

``core``: the loaded-trace type and the options every format shares (window, scale, sample, clip, limit).
``rows``: reading CSV/JSONL files with exact ``file:line: field`` error messages.
``csvtraces``: Azure LLM inference (2023/2024), BurstGPT, token-count CSVs.
``jsontraces``: Mooncake, vLLM-bench JSONL, ShareGPT JSON, vLLM's "random" dataset.
``stats``: summary numbers of a loaded trace.
"""
