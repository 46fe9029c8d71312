"""Every SimResult the tests assemble is checked by tests/invariants.check_any_result (requests once each,
times ordered, reasons given, KV usage in [0, 1]), so no test can produce a broken result unnoticed."""

from __future__ import annotations

import pytest

import sim.app.collect as collect_mod


@pytest.fixture(autouse=True)
def _check_every_result(monkeypatch):
    from tests.invariants import check_any_result

    real = collect_mod.assemble

    def checked(*args, **kwargs):
        res = real(*args, **kwargs)
        check_any_result(res)
        return res

    for mod in ("sim.app.collect", "sim.app.simulate", "sim.app.cluster_results"):
        m = __import__(mod, fromlist=["assemble"])
        if getattr(m, "assemble", None) is real:
            monkeypatch.setattr(m, "assemble", checked)
    yield
