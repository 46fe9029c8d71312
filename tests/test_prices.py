"""GPU prices: the sourced catalogue, the [cost] section and its validation, the cost metrics of every
summary (arithmetic checked by hand), the CLI price options."""

from __future__ import annotations

import math

import pytest

from sim.app.config import config_from_dict
from sim.app.cost_metrics import deployment_gpus, per_million
from sim.app.prices import CostConfig, cost_from_dict, gpu_hour_price, load_catalogue
from sim.app.replicate import run_one
from sim.app.results import request_metrics, summarize
from sim.app.simulate import simulate
from sim.core.errors import ConfigError
from sim.cost.hardware import list_gpus
from tests.test_sweep import run_cli

RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "A100 40GB"},
    "engine": {"max_model_len": 2048, "cost_model": "constant", "constant_step_s": 0.02},
    "workload": {"rate": 4.0, "num_requests": 40, "prompt": {"dist": "fixed", "value": 64},
                 "output": {"dist": "fixed", "value": 16}},
}  # fmt: skip


def cfg(**sections):
    return config_from_dict({**RAW, **sections})


def test_every_catalogue_price_names_a_known_card_a_source_and_a_date():
    sets = load_catalogue()
    assert {"on-demand", "seeds-idc10000"} <= set(sets)
    for ps in sets.values():
        assert ps.entries and ps.currency in ("USD", "CNY")
        for e in ps.entries.values():
            assert e.gpu in list_gpus() and e.per_hour > 0 and e.source.startswith("http") and e.date[:4] == "2026"
    seeds = sets["seeds-idc10000"].entries["A100 40GB SXM"]
    assert (seeds.price, seeds.per) == (2800, "month") and seeds.per_hour == pytest.approx(2800 / 730)
    od = gpu_hour_price(None, "h100")  # aliases resolve; the default set is on-demand USD
    assert od.gpu == "H100 SXM" and od.currency == "USD" and od.origin == "catalogue:on-demand"


def test_price_precedence_and_currencies():
    c = cost_from_dict({"gpu_hour": {"A100 40GB": 1.0}, "gpu_hour_price": 2.0})
    assert gpu_hour_price(c, "A100 40GB SXM").per_hour == 1.0  # the card's own entry first
    assert gpu_hour_price(c, "H100 SXM").per_hour == 2.0  # then one price for every card
    c = cost_from_dict({"gpu_hour_usd": 2.0, "currency": "cny", "usd_rate": 7.0})
    p = gpu_hour_price(c, "T4")
    assert (p.per_hour, p.currency, p.origin) == (14.0, "CNY", "config")
    c = cost_from_dict({"currency": "CNY", "usd_rate": 7.0})  # the USD catalogue, converted
    assert gpu_hour_price(c, "H100 SXM").per_hour == pytest.approx(7.0 * gpu_hour_price(None, "H100 SXM").per_hour)
    seeds = cost_from_dict({"price_set": "seeds-idc10000", "hours_per_month": 720})
    assert seeds.unit == "CNY" and gpu_hour_price(seeds, "T4").per_hour == pytest.approx(900 / 720)
    with pytest.raises(ConfigError, match="no price for MI300X.*--gpu-hour"):
        gpu_hour_price(None, "MI300X")


@pytest.mark.parametrize("raw, match", [
    ({"gpu_hour_usd": -1}, r"gpu_hour_usd: out of range, got -1; allowed 0 < value <= 1e\+06"),
    ({"gpu_hour_usd": "two"}, r"gpu_hour_usd: expected float or null \(one price for every card, in USD\), got 'two'"),
    ({"gpu_hour": 1.5}, r"gpu_hour: expected a table"),
    ({"gpu_hour": {"RTX 4091": 1.0}}, r"gpu_hour: unknown GPU 'RTX 4091'.*RTX 4090"),
    ({"gpu_hour": {"T4": 0}}, r"gpu_hour.T4: out of range, got 0; allowed 0 < value"),
    ({"currency": "dollars"}, r"currency: expected a 3-letter currency code"),
    ({"currency": "EUR"}, r"currency = 'EUR' but price set 'on-demand' is in USD"),
    ({"currency": "EUR", "gpu_hour_usd": 2}, r"gpu_hour_usd is in USD but currency = 'EUR'"),
    ({"price_set": "spot"}, r"price_set: unknown set 'spot'; allowed: on-demand, seeds-idc10000"),
    ({"hours_per_month": 1000}, r"hours_per_month: out of range, got 1000; allowed 0 < value <= 744"),
    ({"gpu_hours": 1}, r"unknown key 'gpu_hours'; did you mean 'gpu_hour'\? known keys: price_set"),
])  # fmt: skip
def test_bad_cost_tables_are_one_clear_error(raw, match):
    with pytest.raises(ConfigError, match=match):
        cfg(cost=raw)


def test_summary_cost_arithmetic_by_hand():
    c = cfg(cost={"gpu_hour_usd": 3.6}, slo={"ttft_ms": 25})
    res = simulate(c)
    s = summarize(res, slo=c.slo)
    assert s["cost_per_hour"] == 3.6 and s["cost_currency"] == "USD" and s["cost"]["num_gpus"] == 1
    # 3.6 $/h = 1e-3 $/s: a million tokens at T tok/s cost 1e-3 * 1e6 / T = 1000 / T dollars
    assert s["cost_per_1m_output_tokens"] == pytest.approx(1000.0 / s["output_throughput"])
    assert s["cost_per_1m_total_tokens"] == pytest.approx(1000.0 / s["total_token_throughput"])
    df = request_metrics(res.requests)
    fin = df[df["status"] == "finished"]
    good = fin[fin["ttft_s"] <= 0.025]["num_output_tokens"].sum()
    assert 0 < good < fin["num_output_tokens"].sum()  # some requests miss the 25 ms TTFT, some meet it
    assert s["cost_per_1m_goodput_tokens"] == pytest.approx(1000.0 / (good / s["duration"]))
    assert s["cost"]["run_cost"] == pytest.approx(3.6 * s["duration"] / 3600)
    assert s["cost"]["per_month"] == pytest.approx(3.6 * 730)
    # the keys vLLM's result JSON has are unchanged by the cost keys
    assert s["output_throughput"] == summarize(simulate(cfg()))["output_throughput"]
    # a percentile SLO that fails: no goodput, so no price per goodput token; TP counts every rank
    s2 = summarize(simulate(cfg(hardware={"gpu": "A100 40GB", "tensor_parallel_size": 2})), slo={"p99_ttft_ms": 1e-3})
    assert s2["cost_per_1m_goodput_tokens"] is None and s2["cost"]["num_gpus"] == 2
    assert s2["cost_per_hour"] == pytest.approx(2 * gpu_hour_price(None, "A100 40GB SXM").per_hour)
    row = run_one(c, 0)  # sweeps and sizing see the flat cost keys
    assert row["cost_per_1m_output_tokens"] == pytest.approx(s["cost_per_1m_output_tokens"])


def test_missing_price_leaves_the_cost_empty_with_the_reason_and_shared_cards_count_once():
    s = summarize(simulate(cfg(hardware={"gpu": "MI300X"})))
    assert s["cost_per_hour"] is None and "no price for MI300X" in s["cost"]["error"]
    meta = {"cluster": True, "replicas": [
        {"gpu": "H100 SXM", "tensor_parallel_size": 1, "device": "gpu0"},
        {"gpu": "H100 SXM", "tensor_parallel_size": 1, "device": "gpu0"},
        {"gpu": "A100 80GB SXM", "tensor_parallel_size": 2, "device": None}]}  # fmt: skip
    assert deployment_gpus(meta) == {"H100 SXM": 1, "A100 80GB SXM": 2}
    assert per_million(3.6, 0.0) is None and math.isclose(per_million(3.6, 1000.0), 1.0)
    assert CostConfig().unit == "USD"


def test_cli_price_options(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nname = "seed-7b"\ndtype = "fp16"\n[hardware]\ngpu = "A100 40GB"\n[engine]\n'
                    'max_model_len = 2048\ncost_model = "constant"\n[workload]\nrate = 4.0\nnum_requests = 20\n'
                    'prompt = { dist = "fixed", value = 64 }\noutput = { dist = "fixed", value = 16 }\n')  # fmt: skip
    assert run_cli(["run", str(path), "--gpu-hour", "A100 40GB=1.5", "--currency", "EUR"]) == 0
    assert "cost: 1.50 EUR/h" in capsys.readouterr().out
    assert run_cli(["run", str(path), "--gpu-hour", "A100 40GB=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpu-hour 'A100 40GB=-1'" in err[0]
    assert run_cli(["run", str(path), "--gpu-hour-usd", "2", "--currency", "CNY"]) == 2
    assert "usd_rate" in capsys.readouterr().err
