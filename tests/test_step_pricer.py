"""The engine prices steps through the roofline's compiled pricer (RooflineCostModel.step_pricer): the same
seconds as the model's own step_time / decode_step_list, past the model's tables too (it grows them), and
never for a model that prices otherwise (a subclass, a patched instance, a plug-in)."""

from __future__ import annotations

import numpy as np
import simpy

from policies.base import make_policy
from sim.core.batch import BatchSummary
from sim.cost.costmodel import RooflineCostModel
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model
from sim.cost.step_price import NEED_TABLES
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from tests.helpers import limits


def _model() -> RooflineCostModel:
    return RooflineCostModel(get_model("Llama-3.1-8B"), get_gpu("H100 SXM"))


def _engine(cost) -> Engine:
    env = simpy.Environment()
    policy = make_policy("vllm", limits())
    return Engine(env, policy, cost, OpenSource([]), Recorder())


def test_the_engine_prices_as_the_model_does_past_its_tables():
    """Steps within the tables and past them (a pricer answers NEED_TABLES / raises IndexError there, and
    the engine asks the model, which grows them): every value is the model's own, to the bit."""
    cost, ref = _model(), _model()
    eng = _engine(cost)
    assert eng.pricer is cost.step_pricer() is not None and eng.ff is not None
    rows = [1, 7, 64, 300, 2000, 5000]  # the tables start at 1,024 tokens and 256 sampled rows
    batches = [BatchSummary(decode_ctx=np.full(n, 1500, dtype=np.int64), num_logits=n) for n in rows]
    batches.append(BatchSummary(decode_ctx=np.array([900, 40]), prefill_chunk=np.array([3000]),
                                prefill_ctx=np.array([0]), num_logits=3))  # fmt: skip
    assert cost.step_pricer().step_time(batches[-2]) == NEED_TABLES
    assert [eng.step_seconds(b) for b in batches] == [ref.step_time(b) for b in batches]
    inside = [1, 7, 64, 200]  # within the tables: the pricer's own answer ...
    ctx = [n * 1500 for n in inside]
    fresh = _engine(_model())
    assert fresh.pricer.decode_list(inside, ctx) == ref.decode_step_list(inside, ctx)
    assert fresh.ff._decode_prices(fresh.cost, inside, ctx) == ref.decode_step_list(inside, ctx)
    ctx = [n * 1500 for n in rows]  # ... and past them (IndexError: the model grows them)
    assert fresh.ff._decode_prices(fresh.cost, rows, ctx) == ref.decode_step_list(rows, ctx)

    class Proxy:  # forwards to a roofline model but prices its own way: no pricer taken from the model
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def step_time(self, batch):
            return 1.5 * self.inner.step_time(batch)

    proxied = _engine(Proxy(_model()))
    assert proxied.pricer is None and proxied.step_seconds(batches[1]) == 1.5 * ref.step_time(batches[1])


def test_no_pricer_for_a_model_that_prices_otherwise():
    class Slower(RooflineCostModel):
        def step_time(self, batch):
            return 2.0 * super().step_time(batch)

    slow = Slower(get_model("Llama-3.1-8B"), get_gpu("H100 SXM"))
    assert slow.step_pricer() is None
    patched = _model()
    patched.decode_step_list = lambda rows, ctx: [1.0] * len(rows)
    assert patched.step_pricer() is None
    b = BatchSummary(decode_ctx=np.full(8, 100, dtype=np.int64), num_logits=8)
    eng = _engine(slow)
    assert eng.pricer is None and eng.step_seconds(b) == 2.0 * _model().step_time(b)
    eng = _engine(patched)
    assert eng.ff._decode_prices(eng.cost, [3, 2], [300, 200]) == [1.0, 1.0]
