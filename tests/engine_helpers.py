"""Run the engine directly on specs, without configs, for engine-level tests."""

from __future__ import annotations

import simpy

from policies.base import make_policy
from sim.cost.costmodel import ConstantCostModel
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from tests.helpers import limits


def run_specs(specs, policy="vllm", step_s=1.0, horizon=None, fast_forward=True, cost=None, **lim):
    env = simpy.Environment()
    pol = make_policy(policy, limits(**lim))
    src = OpenSource(specs)
    rec = Recorder(trace=True)
    eng = Engine(env, pol, cost or ConstantCostModel(step_s=step_s), src, rec, horizon, fast_forward)
    env.run()
    return eng, rec, src
