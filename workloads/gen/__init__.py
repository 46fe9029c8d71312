"""Generators: arrival processes, length distributions and multi-turn sessions (no trace formats)."""
