# Each target creates .venv on a fresh machine if needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.native-built
PYC := $(VENV)/.pyc-built
# the sources a native build depends on (sim/native.py dependencies(): the compiled modules and what they import)
NATIVE_SRC := sim/native.py $(wildcard sim/core/*.py sim/kv/*.py sim/engine/*.py policies/*.py) \
	sim/cost/decode_price.py sim/cost/step_price.py workloads/gen/session_source.py routers/base.py routers/rotor.py routers/view.py \
	$(foreach m,cluster_config devices disagg gateway inbox replica timing,sim/app/$(m).py)

.PHONY: demo test lint bench clean native

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,native]'
	touch $(STAMP)

# mypyc-compiled hot modules; if compiling fails everything runs interpreted (same results) and the
# next make tries again
$(NATIVE): $(STAMP) $(NATIVE_SRC)
	SERVESIM_PURE=1 $(BIN)/python -c 'import sys, sim.native as n; sys.exit(n.build())' \
		&& touch $(NATIVE) || echo "servesim: running interpreted"

# Byte-compiled sources: where PYTHONDONTWRITEBYTECODE is set (as on these machines) every process would
# otherwise compile ~31k lines again before it starts (~0.07 s of importing bench/speed.py's modules).
# Python still checks each .pyc against its source, so an edited file is never run stale.
PY_PACKAGES := sim policies workloads routers servesim bench
$(PYC): $(STAMP) $(foreach d,$(PY_PACKAGES),$(wildcard $(d)/*.py $(d)/*/*.py $(d)/*/*/*.py))
	$(BIN)/python -m compileall -q $(PY_PACKAGES) > /dev/null && touch $(PYC)

native: $(NATIVE)

demo: $(NATIVE) $(PYC)
	$(BIN)/servesim demo --out out/demo

test: $(NATIVE) $(PYC)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(NATIVE) $(PYC)
	$(BIN)/python bench/speed.py

clean:
	-test -x $(BIN)/python && $(BIN)/python -c 'import sim.native as n; n.clean()'
	rm -rf $(VENV) out .pytest_cache
