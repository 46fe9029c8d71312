# Each target creates .venv on a fresh machine if needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.native
# the modules sim/native.py compiles with mypyc (rebuilt when one changes)
NATIVE_SRC := $(shell $(PY) -c "import ast,sys; t=ast.parse(open('sim/native.py').read()); \
	print(' '.join(m.replace('.','/')+'.py' for n in t.body if isinstance(n, ast.Assign) \
	and getattr(n.targets[0],'id','')=='MODULES' for m in ast.literal_eval(n.value)))")

.PHONY: demo test lint bench clean native

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,native]'
	touch $(STAMP)

# mypyc-compiled hot modules; if compiling fails everything runs interpreted (same results)
$(NATIVE): $(STAMP) sim/native.py $(NATIVE_SRC)
	SERVESIM_PURE=1 $(BIN)/python -c 'import sys, sim.native as n; sys.exit(n.build())'
	touch $(NATIVE)

native: $(NATIVE)

demo: $(NATIVE)
	$(BIN)/servesim demo --out out/demo

test: $(NATIVE)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(NATIVE)
	$(BIN)/python bench/speed.py

clean:
	-test -x $(BIN)/python && $(BIN)/python -c 'import sim.native as n; n.clean()'
	rm -rf $(VENV) out .pytest_cache
