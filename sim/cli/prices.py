"""Price options shared by the commands that report costs (``run``, ``size``): they become ``[cost]``
overrides, validated like the config file's (sim/app/prices.py)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from sim.core.errors import ConfigError


def add_price_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prices ([cost]; default: the on-demand catalogue, sim/app/data/gpu_prices.toml)")
    g.add_argument("--gpu-hour-usd", type=float, metavar="USD", help="one price per GPU-hour for every card, USD")
    g.add_argument("--gpu-hour", action="append", default=[], metavar="GPU=PRICE",
                   help="price per GPU-hour of one card, in --currency (repeatable), e.g. 'A100 40GB=1.29'")
    g.add_argument("--currency", metavar="CODE", help="currency of every cost figure (ISO 4217, e.g. CNY)")
    g.add_argument("--price-set", metavar="NAME", help="catalogue set: on-demand (USD) or seeds-idc10000 (CNY)")
    g.add_argument("--usd-rate", type=float, metavar="RATE", help="units of --currency per USD (converts USD prices)")


def price_overrides(args: Any) -> list[str]:
    """The ``--set``-style overrides (``cost.KEY=VALUE``) the price options stand for."""
    out: list[str] = []
    for flag, key in (("gpu_hour_usd", "gpu_hour_usd"), ("usd_rate", "usd_rate")):
        v = getattr(args, flag, None)
        if v is not None:
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"--{flag.replace('_', '-')}: expected a number > 0, got {v}")
            out.append(f"cost.{key}={v!r}")
    for flag in ("currency", "price_set"):
        v = getattr(args, flag, None)
        if v is not None:
            out.append(f'cost.{flag}="{v}"')
    seen: dict[str, str] = {}
    for item in getattr(args, "gpu_hour", None) or []:
        name, sep, text = item.rpartition("=")
        try:
            price = float(text)
        except ValueError:
            price = math.nan
        if not sep or not name.strip() or "." in name or "=" in name or not (math.isfinite(price) and price > 0):
            raise ConfigError(f"--gpu-hour {item!r}: expected GPU=PRICE with a price > 0, e.g. 'A100 40GB=1.29'")
        key = " ".join(name.split()).lower()
        if key in seen:  # the later override would replace the first without a word
            raise ConfigError(f"--gpu-hour {item!r}: {name.strip()!r} is priced twice (also {seen[key]!r}); "
                              "allowed: one price per card")
        seen[key] = item
        out.append(f"cost.gpu_hour.{name.strip()}={price!r}")
    return out


def check_prices_used(args: Any, gpus: Any) -> None:
    """The price flags must price something: a ``--gpu-hour`` for a card no run uses, or a ``--gpu-hour-usd``
    when every card used has its own ``--gpu-hour``, would be dropped without a word; refused. ``gpus``:
    the names of the cards the runs use."""
    if not getattr(args, "gpu_hour", None):
        return
    from sim.cost.hardware import get_gpu

    used = {get_gpu(str(g)).name for g in gpus}
    priced: set[str] = set()
    for item in getattr(args, "gpu_hour", None) or []:
        name = get_gpu(item.rpartition("=")[0].strip()).name
        if name not in used:
            raise ConfigError(f"--gpu-hour {item!r}: no run here uses {name} (they use {', '.join(sorted(used))}); "
                              "allowed: a price for a card the runs use")
        priced.add(name)
    usd = getattr(args, "gpu_hour_usd", None)
    if usd is not None and used and used <= priced:
        raise ConfigError(f"--gpu-hour-usd {usd:g}: every card the runs use has its own --gpu-hour price, so it "
                          "prices nothing; allowed: one of them")
