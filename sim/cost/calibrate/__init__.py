"""Calibration: microbenchmark samples -> fitted CalibrationProfile, with per-operator fit errors.

samples.py   the one table every source becomes (op, shape columns, time_s)
importers.py format detection and loading: LLMServingSim (perf/ and v0), BLIS/InferSim attention and
             Vidur mlp/attention CSVs -> samples, one module per source (import_*.py)
opmodel.py   the cost model's formulas per operator call (checked against sim/cost/costmodel.py)
fit.py       bounded per-group least squares, hold-out by shape range, error tables
recipes.py   how each shipped profile was fitted (files, operators, frozen fields)
suite.py     the PyTorch microbenchmark suite behind ``servesim calibrate`` (torch optional)
"""
