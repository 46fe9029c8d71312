"""GPU prices: the sourced catalogue (``sim/app/data/gpu_prices.toml``), the ``[cost]`` config section and
the price of one GPU-hour of a card, so that summaries and ``servesim size --gpus`` can say what a
deployment costs.

::

    [cost]                                  # every key optional
    price_set = "on-demand"                 # a set of the catalogue: on-demand (USD) | seeds-idc10000 (CNY)
    currency = "USD"                        # what every cost figure is in (default: the set's currency)
    gpu_hour_usd = 2.0                      # one price for every card, in USD
    gpu_hour_price = 14.0                   # one price for every card, in `currency`
    gpu_hour = { "A100 40GB SXM" = 1.29 }   # per card, in `currency` (catalogue names or aliases)
    usd_rate = 7.1                          # units of `currency` per USD: converts USD figures
    hours_per_month = 730                   # for the monthly figures

A card's price is the first of: its ``gpu_hour`` entry, ``gpu_hour_price``, ``gpu_hour_usd`` (converted),
the price set's entry (converted from the set's currency when that is USD and ``usd_rate`` is given).
Every figure carries its source and date; a user's figure says so.
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from sim.core.errors import ConfigError
from sim.core.typed import validate_table
from sim.cost.hardware import get_gpu, list_gpus

CATALOGUE_PATH = Path(__file__).resolve().parent / "data" / "gpu_prices.toml"
DEFAULT_SET = "on-demand"
HOURS_PER_MONTH = 730.0  # 365 × 24 / 12
_ENTRY_KEYS = ("gpu", "price", "per", "provider", "source", "via", "date")


@dataclass(frozen=True)
class PriceEntry:
    gpu: str
    per_hour: float  # in the set's currency
    price: float  # as listed
    per: str  # "hour" | "month"
    provider: str
    source: str
    date: str
    via: str = ""


@dataclass(frozen=True)
class PriceSet:
    name: str
    currency: str
    description: str
    hours_per_month: float
    entries: dict[str, PriceEntry]


@functools.cache
def load_catalogue(path: str | None = None) -> dict[str, PriceSet]:
    """The price sets of the catalogue file, validated (a GPU servesim does not know is an error)."""
    p = Path(path) if path else CATALOGUE_PATH
    raw = tomllib.loads(p.read_text(encoding="utf-8"))
    sets: dict[str, PriceSet] = {}
    for name, table in raw.get("sets", {}).items():
        where = f"{p.name} [sets.{name}]"
        hpm = float(table.get("hours_per_month", HOURS_PER_MONTH))
        entries: dict[str, PriceEntry] = {}
        for row in table.get("prices", []):
            bad = sorted(set(row) - set(_ENTRY_KEYS))
            missing = [k for k in ("gpu", "price", "per", "source", "date") if k not in row]
            if bad or missing:
                raise ConfigError(f"{where}: entry {row.get('gpu')!r} has unknown keys {bad} / lacks {missing}")
            gpu = get_gpu(row["gpu"]).name
            price = float(row["price"])
            if not (price > 0 and math.isfinite(price)) or row["per"] not in ("hour", "month"):
                raise ConfigError(f"{where} {gpu}: price must be > 0 per hour or month, got {row['price']!r} "
                                  f"per {row['per']!r}")  # fmt: skip
            per_hour = price if row["per"] == "hour" else price / hpm
            entries[gpu] = PriceEntry(gpu, per_hour, price, row["per"], str(row.get("provider", "")),
                                      str(row["source"]), str(row["date"]), str(row.get("via", "")))  # fmt: skip
        sets[name] = PriceSet(name, str(table["currency"]).upper(), str(table.get("description", "")), hpm, entries)
    return sets


# ---- [cost] ------------------------------------------------------------------------------------------
Price = Annotated[float, Field(gt=0, le=1e6)]


@dataclass(frozen=True)
class CostConfig:
    """[cost]: GPU prices for the cost metrics; every key optional."""

    price_set: str = field(default=DEFAULT_SET, metadata={"doc": "a set of the price catalogue: on-demand (USD) | seeds-idc10000 (CNY)"})
    currency: Annotated[str, Field(pattern=r"^[A-Za-z]{3}$")] | None = field(
        default=None, metadata={"doc": "a 3-letter currency code (ISO 4217: USD, CNY, EUR, ...)"})  # None: the set's
    gpu_hour_usd: Price | None = field(default=None, metadata={"doc": "one price for every card, in USD"})
    gpu_hour_price: Price | None = field(default=None, metadata={"doc": "one price for every card, in currency"})
    gpu_hour: dict[str, Price] = field(
        default_factory=dict, metadata={"doc": "per card, in currency: catalogue name or alias = price"})
    usd_rate: Price | None = field(default=None, metadata={"doc": "units of currency per USD"})
    hours_per_month: Annotated[float, Field(gt=0, le=744)] = HOURS_PER_MONTH

    @property
    def unit(self) -> str:
        """The currency every figure is in."""
        return self.currency or load_catalogue()[self.price_set].currency


def cost_from_dict(raw: Any) -> CostConfig | None:
    """Validate a ``[cost]`` table (None or absent: the defaults apply where a price is needed): types and
    ranges by its model, then the names against the catalogues."""
    if raw is None:
        return None
    if isinstance(raw, CostConfig):
        return raw
    given = validate_table(CostConfig, "[cost]", raw)
    sets = load_catalogue()
    ps = given.get("price_set", DEFAULT_SET)
    if ps not in sets:
        raise ConfigError(f"[cost] price_set: unknown set {ps!r}; allowed: {', '.join(sets)}")
    per_gpu: dict[str, float] = {}
    named: dict[str, str] = {}
    for name, price in given.get("gpu_hour", {}).items():
        try:
            gpu = get_gpu(str(name)).name
        except ConfigError as e:
            raise ConfigError(f"[cost] gpu_hour: {e}") from None
        if gpu in per_gpu and per_gpu[gpu] != price:  # two names of one card: one of the prices would be lost
            raise ConfigError(f"[cost] gpu_hour: {named[gpu]!r} and {str(name)!r} are both {gpu} with prices "
                              f"{per_gpu[gpu]:g} and {price:g}; allowed: one price per card")
        per_gpu[gpu], named[gpu] = price, str(name)
    if given.get("gpu_hour_usd") is not None and given.get("gpu_hour_price") is not None:
        raise ConfigError(f"[cost] gpu_hour_usd = {given['gpu_hour_usd']:g} and gpu_hour_price = "
                          f"{given['gpu_hour_price']:g}: two prices for every card; allowed: one of them")
    if given.get("currency") is not None:
        given["currency"] = given["currency"].upper()
    cfg = CostConfig(**{**given, "gpu_hour": per_gpu})
    set_cur = sets[ps].currency
    own = cfg.gpu_hour_price is not None or cfg.gpu_hour_usd is not None or cfg.gpu_hour
    if cfg.unit != set_cur and not own and not (set_cur == "USD" and cfg.usd_rate is not None):
        rate = f"usd_rate ({cfg.unit} per USD), " if set_cur == "USD" else ""  # converts USD prices only
        raise ConfigError(f"[cost] currency = {cfg.unit!r} but price set {ps!r} is in {set_cur}: give {rate}your "
                          "own prices (gpu_hour, gpu_hour_price) or another price_set")
    if cfg.usd_rate is not None and cfg.unit == "USD":  # a rate from USD to USD would do nothing
        raise ConfigError(f"[cost] usd_rate = {cfg.usd_rate:g} with currency USD: it converts USD prices to "
                          "another currency; allowed: a currency other than USD, or no usd_rate")
    if cfg.gpu_hour_usd is not None and cfg.unit != "USD" and cfg.usd_rate is None:
        raise ConfigError(f"[cost] gpu_hour_usd is in USD but currency = {cfg.unit!r}: give usd_rate ({cfg.unit} "
                          "per USD) or gpu_hour_price in that currency")  # fmt: skip
    return cfg


def cost_to_dict(cfg: CostConfig | None) -> dict[str, Any] | None:
    """As a raw ``[cost]`` table (``cost_from_dict`` gives it back)."""
    if cfg is None:
        return None
    out: dict[str, Any] = {"price_set": cfg.price_set, "hours_per_month": cfg.hours_per_month}
    for k in ("currency", "gpu_hour_usd", "gpu_hour_price", "usd_rate"):
        if getattr(cfg, k) is not None:
            out[k] = getattr(cfg, k)
    if cfg.gpu_hour:
        out["gpu_hour"] = dict(cfg.gpu_hour)
    return out


# ---- a card's price ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuPrice:
    """One GPU-hour of ``gpu`` in ``currency``, and where the figure comes from."""

    gpu: str
    per_hour: float
    currency: str
    source: str
    date: str
    origin: str  # "catalogue:<set>" | "config"

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "per_hour": self.per_hour, "currency": self.currency, "source": self.source,
                "date": self.date, "origin": self.origin}  # fmt: skip


def gpu_hour_price(cost: CostConfig | None, gpu: str) -> GpuPrice:
    """The price of one GPU-hour of ``gpu`` (module doc for the order); ConfigError naming the card and
    how to give a price when there is none."""
    cfg = cost or CostConfig()
    name = get_gpu(gpu).name
    unit = cfg.unit
    if name in cfg.gpu_hour:
        return GpuPrice(name, cfg.gpu_hour[name], unit, "[cost] gpu_hour", "user", "config")
    if cfg.gpu_hour_price is not None:
        return GpuPrice(name, cfg.gpu_hour_price, unit, "[cost] gpu_hour_price", "user", "config")
    if cfg.gpu_hour_usd is not None:
        rate = 1.0 if unit == "USD" else float(cfg.usd_rate or math.nan)
        return GpuPrice(name, cfg.gpu_hour_usd * rate, unit, "[cost] gpu_hour_usd", "user", "config")
    ps = load_catalogue()[cfg.price_set]
    entry = ps.entries.get(name)
    if entry is None:
        priced = ", ".join(ps.entries)
        raise ConfigError(f"no price for {name} in price set {ps.name!r} (priced: {priced}); give one with "
                          f"--gpu-hour '{name}=PRICE' or [cost] gpu_hour / gpu_hour_price")  # fmt: skip
    per_hour = entry.price / cfg.hours_per_month if entry.per == "month" else entry.price
    if ps.currency != unit:
        if ps.currency == "USD" and cfg.usd_rate is not None:
            per_hour *= cfg.usd_rate
        else:
            raise ConfigError(f"price set {ps.name!r} is in {ps.currency}, not {unit}: set [cost] currency = "
                              f"{ps.currency!r}, give usd_rate (for a USD set) or your own prices")  # fmt: skip
    src = entry.source + (f" via {entry.via}" if entry.via else "") + f"; {entry.provider}".rstrip("; ")
    return GpuPrice(name, per_hour, unit, src, entry.date, f"catalogue:{ps.name}")


def catalogue_table(price_set: str = DEFAULT_SET):
    """The price set as a DataFrame (GPU, listed price, per GPU-hour, provider, source, date)."""
    import pandas as pd

    ps = load_catalogue()[price_set]
    order = {g: i for i, g in enumerate(list_gpus())}
    rows = [{"gpu": e.gpu, "price": e.price, "per": e.per, f"{ps.currency}/GPU-hour": e.per_hour,
             "provider": e.provider, "source": e.source, "date": e.date}
            for e in sorted(ps.entries.values(), key=lambda e: order.get(e.gpu, 99))]  # fmt: skip
    return pd.DataFrame(rows)
