"""sim/cost/step_price.py: the compiled step pricing gives, to the bit, what its source gives interpreted."""

from __future__ import annotations

import importlib.util
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.native as native
from sim.core.batch import BatchSummary
from sim.cost.costmodel import RooflineCostModel, make_cost_model

pytestmark = pytest.mark.skipif(native.state() != "compiled", reason="no current mypyc build: nothing to compare")

# dense GQA with CUDA graphs, MLA + MoE, tensor parallel
SETUPS = [("Llama-3.1-8B", "RTX 4090", 1), ("DeepSeek-V2-Lite", "H100 SXM", 1), ("Mixtral-8x7B", "A100 80GB SXM", 2)]


def _interpreted_pricer(cm: RooflineCostModel):
    """The same coefficients in the interpreted StepPricer (the module loaded from its source file)."""
    spec = importlib.util.spec_from_file_location("step_price_source", native.source("sim.cost.step_price"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return cm._make_pricer(mod.StepPricer)


@pytest.fixture(scope="module", params=SETUPS, ids=[m for m, _, _ in SETUPS])
def pair(request):
    model, gpu, tp = request.param
    cm = make_cost_model("roofline", model=model, gpu=gpu, tensor_parallel_size=tp)
    ref = _interpreted_pricer(cm)
    assert type(ref) is not type(cm._pricer), "the reference must be the interpreted class"
    return cm, ref


batches = st.builds(
    lambda dec, pre, logits, so, si: BatchSummary(decode_ctx=dec, prefill_chunk=[c for c, _ in pre],
                                                  prefill_ctx=[p for _, p in pre], num_logits=logits,
                                                  swap_out_blocks=so, swap_in_blocks=si),  # fmt: skip
    st.lists(st.integers(1, 40_000), max_size=300),
    st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 30_000)), max_size=4),
    st.integers(0, 300),
    st.integers(0, 3) | st.just(0),
    st.integers(0, 3) | st.just(0),
)


@settings(max_examples=200, deadline=None)
@given(batch=batches)
def test_compiled_step_time_is_the_interpreted_one_to_the_bit(pair, batch):
    cm, ref = pair
    t = cm.step_time(batch)  # grows the model's tables when the step reads past them
    ref.tok, ref.head = cm._tok, cm._head
    assert t.hex() == ref.step_time(batch).hex()  # to the bit
    assert cm._pricer.prefill_attn(batch.prefill_chunks(), batch.prefill_ctxs()) == ref.prefill_attn(
        batch.prefill_chunks(), batch.prefill_ctxs())
    if batch.num_decode:
        assert cm._pricer.mixed_decode(batch) == ref.mixed_decode(batch)


def test_a_step_past_the_tables_grows_them_and_prices_as_a_model_that_had_them():
    cm = make_cost_model("roofline", model="Llama-3.1-8B", gpu="RTX 4090")
    big = BatchSummary(decode_ctx=list(range(1, 5000)), num_logits=4999)
    n0 = len(cm._tok)
    t = cm.step_time(big)
    assert len(cm._tok) > n0 and cm._pricer.tok is cm._tok and cm._pricer.head is cm._head
    assert cm.decode_step_list([6000], [10]) and cm._pricer.tok is cm._tok, "a run's growth reaches the pricer"
    grown = make_cost_model("roofline", model="Llama-3.1-8B", gpu="RTX 4090")
    grown._grow_tok(6000)
    grown._grow_head(6000)
    grown._pricer = grown._make_pricer()
    assert grown.step_time(big) == t


def test_a_pickled_cost_model_rebuilds_its_pricer():
    cm = make_cost_model("roofline", model="Llama-3.1-8B", gpu="RTX 4090")
    b = BatchSummary(decode_ctx=[300, 900], prefill_chunk=[512], prefill_ctx=[0], num_logits=3)
    back = pickle.loads(pickle.dumps(cm))
    assert back._pricer.tok is back._tok and back.step_time(b) == cm.step_time(b)


def test_a_cost_model_is_freed_without_the_cycle_collector():
    """The pricer holds no reference back to its cost model: a dropped model goes with its last reference
    (a sweep of many runs does not wait for a full collection to free each one's tables)."""
    import gc
    import weakref

    cm = make_cost_model("roofline", model="Llama-3.1-8B", gpu="RTX 4090")
    ref = weakref.ref(cm)
    was = gc.isenabled()
    gc.disable()
    try:
        del cm
        assert ref() is None
    finally:
        if was:
            gc.enable()
