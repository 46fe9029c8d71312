"""The hostile corpus, fifth round (fuzzC): ``servesim fit`` and ``servesim calibrate``. Outputs naming an input
(or each other), the same input twice, held-out runs also fitted or checked only after the fit, empty values
read as the flag left out, empty or repeated list items, unknown operators, flags that do nothing, a
--freeze / --from-base clash and hold-out fractions that leave nothing to fit: each ends in exit code 2 and
one line before anything is fitted or written. Beside each refusal, the nearest valid input still works.
Inputs are copies under tmp_path: nothing under the repository is ever an output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
MB_SRC = REPO / "sim" / "cost" / "data" / "microbench" / "h200-sxm" / "llama-3-1-8b"
RUNS_SRC = REPO / "tests" / "data" / "runs"
FAST = ["--max-nfev", "1", "--max-per-stage", "5"]


@pytest.fixture
def mb(tmp_path: Path) -> Path:
    """A copy of one packaged microbenchmark folder (samples.csv + meta.json)."""
    d = tmp_path / "mb"
    shutil.copytree(MB_SRC, d)
    return d


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    shutil.copytree(RUNS_SRC, d, ignore=shutil.ignore_patterns("*.py"))
    return d


@pytest.fixture
def no_fit(monkeypatch, no_simulation):  # noqa: F811
    """Fail if a fit starts: bad input must be refused before it."""
    import sim.app.runfit as runfit
    import sim.cost.calibrate.fit as fit
    import sim.cost.calibrate.recipes as recipes

    def boom(*a, **k):
        raise AssertionError("a fit ran before the input was checked")

    for mod, name in ((fit, "fit_profile"), (recipes, "fit_profile"), (runfit, "fit_runs")):
        monkeypatch.setattr(mod, name, boom)


def _digest(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# (name, argv(tmp, mb, runs), fragments)
CASES = [
    # S1: an output naming an input, or the other output
    ("out-is-input", lambda t, m, r: ["fit", f"{m}/samples.csv", "--out", f"{m}/samples.csv"],
     ["--out", "samples.csv", "one of the inputs"]),
    ("out-is-input-dotdot", lambda t, m, r: ["fit", f"{m}/samples.csv", "--out", f"{m}/../mb/samples.csv"],
     ["--out", "one of the inputs"]),
    ("out-inside-input-dir", lambda t, m, r: ["fit", str(m), "--out", f"{m}/new.csv"],
     ["--out", "new.csv", "inside one of the inputs"]),  # a .csv the folder's loader would read next time
    ("out-is-meta-in-input-dir", lambda t, m, r: ["fit", str(m), "--out", f"{m}/meta.json"],
     ["--out", "meta.json", "the metadata read with input"]),
    ("report-is-meta", lambda t, m, r: ["fit", f"{m}/samples.csv", "--report", f"{m}/meta.json"],
     ["--report", "meta.json", "one of the inputs"]),
    ("out-is-report", lambda t, m, r: ["fit", f"{m}/samples.csv", "--out", f"{t}/same.json", "--report",
                                       f"{t}/same.json"], ["--report", "same file as --out"]),
    ("recipe-out-in-data", lambda t, m, r: ["fit", "--recipe", "h200-sxm", "--data", str(t), "--out",
                                            f"{m}/samples.csv"], ["--out", "--data", "one of the inputs"]),
    ("from-run-out-is-run", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--out",
                                             f"{r}/vllm_bench_result.json", *FAST], ["--out", "one of the inputs"]),
    ("from-run-out-is-holdout", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--holdout",
                                                 f"{r}/prometheus", "--gpu", "RTX 4090", "--out",
                                                 f"{r}/prometheus/x.json", *FAST],
     ["--out", "inside one of the inputs", "--holdout"]),
    # S2: a bad held-out run is refused before the fit
    ("holdout-run-no-gpu", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--out",
                                            f"{t}/fr.json", "--holdout", f"{r}/prometheus", *FAST],
     ["prometheus", "--gpu"]),
    # S3: a held-out run that is also fitted
    ("holdout-also-fitted", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--holdout",
                                             f"{r}/../runs/vllm_bench_result.json", "--out", f"{t}/fr.json", *FAST],
     ["--holdout", "also given to --from-run"]),
    # S4: the same input twice
    ("input-twice", lambda t, m, r: ["fit", f"{m}/samples.csv", f"{m}/samples.csv"], ["samples.csv", "given before"]),
    ("input-file-and-its-dir", lambda t, m, r: ["fit", str(m), f"{m}/samples.csv"], ["samples.csv", "inside"]),
    ("input-ops-overlap", lambda t, m, r: ["fit", f"{m}/samples.csv:gemm", f"{m}/samples.csv"], ["given before"]),
    ("run-twice", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json",
                                   f"{r}/vllm_bench_result.json", "--out", f"{t}/fr.json", *FAST],
     ["--from-run", "given before"]),
    # S5 / E6: an empty value is not the flag left out
    ("gpu-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--gpu", ""], ["--gpu ''", "empty"]),
    ("recipe-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--recipe", ""], ["--recipe ''", "empty"]),
    ("model-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--model", ""], ["--model ''", "empty"]),
    ("freeze-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", ""], ["--freeze ''", "empty"]),
    ("from-base-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--from-base", ""], ["--from-base ''", "empty"]),
    ("base-empty", lambda t, m, r: ["fit", f"{m}/samples.csv", "--base", ""], ["--base ''", "'prior' or a profile"]),
    ("base-dir", lambda t, m, r: ["fit", f"{m}/samples.csv", "--base", str(m)], ["--base", "directory"]),
    ("data-empty", lambda t, m, r: ["fit", "--recipe", "rtx-4090", "--data", ""], ["--data ''", "empty"]),
    ("input-empty", lambda t, m, r: ["fit", ""], ["input path ''", "empty"]),
    ("from-run-gpu-empty", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--out",
                                            f"{t}/fr.json", "--gpu", "", *FAST], ["--gpu ''", "empty"]),
    ("from-run-profile-empty", lambda t, m, r: ["fit", "--from-run", f"{r}/vllm_bench_result.json", "--out",
                                                f"{t}/fr.json", "--profile", "", *FAST], ["--profile ''", "empty"]),
    ("calibrate-gpu-empty", lambda t, m, r: ["calibrate", "--smoke", "--device", "cpu", "--out", f"{t}/cal",
                                             "--gpu", ""], ["--gpu ''", "empty"]),
    ("calibrate-model-empty", lambda t, m, r: ["calibrate", "--smoke", "--device", "cpu", "--out", f"{t}/cal",
                                               "--model", ""], ["--model ''", "empty"]),
    # S6: empty list items
    ("freeze-comma", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", ","], ["--freeze ','", "empty item"]),
    ("freeze-double-comma", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", "eta_compute,,t0_gemm_s"],
     ["--freeze", "empty item"]),
    ("from-base-trailing-comma", lambda t, m, r: ["fit", f"{m}/samples.csv", "--from-base", "eta_kv,"],
     ["--from-base", "empty item"]),
    ("ops-trailing-comma", lambda t, m, r: ["fit", f"{m}/samples.csv:gemm,"], ["samples.csv:gemm,", "empty operator"]),
    ("ops-leading-comma", lambda t, m, r: ["fit", f"{m}/samples.csv:,gemm"], ["empty operator"]),
    # S7: an operator or field twice
    ("ops-twice", lambda t, m, r: ["fit", f"{m}/samples.csv:gemm,gemm"], ["'gemm' given twice"]),
    ("freeze-twice", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", "eta_kv,eta_kv"], ["'eta_kv' given twice"]),
    # S9: flags that would do nothing
    ("data-without-recipe", lambda t, m, r: ["fit", f"{m}/samples.csv", "--data", str(m)], ["--data", "--recipe"]),
    ("model-unused", lambda t, m, r: ["fit", f"{m}/samples.csv", "--model", "Llama-3.1-8B"],
     ["--model Llama-3.1-8B", "not used", "LLMServingSim"]),
    ("model-unknown", lambda t, m, r: ["fit", f"{m}/samples.csv", "--model", "nosuch"], ["--model 'nosuch'", "unknown"]),
    ("freeze-never-fitted", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", "gpu"], ["--freeze", "'gpu'"]),
    # S10: one field in --freeze and --from-base
    ("freeze-and-from-base", lambda t, m, r: ["fit", f"{m}/samples.csv", "--freeze", "eta_compute", "--from-base",
                                              "eta_compute"], ["--freeze and --from-base", "eta_compute"]),
    # S12: a hold-out that leaves (almost) nothing to fit
    ("holdout-0.9999", lambda t, m, r: ["fit", f"{m}/samples.csv", "--holdout", "0.9999"], ["--holdout 0.9999", "0.5"]),
    ("holdout-0.51", lambda t, m, r: ["fit", f"{m}/samples.csv", "--holdout", "0.51"], ["--holdout 0.51", "0.5"]),
    # E2: calibrate --model's own fault
    ("calibrate-model-unknown", lambda t, m, r: ["calibrate", "--smoke", "--device", "cpu", "--out", f"{t}/cal",
                                                 "--model", "nosuch"], ["--model 'nosuch'", "unknown model"]),
    # E3: an unknown operator is not a missing path
    ("ops-unknown", lambda t, m, r: ["fit", f"{m}/samples.csv:nosuch"], ["unknown operator 'nosuch'", "attn_decode"]),
    ("ops-upper-case", lambda t, m, r: ["fit", f"{m}/samples.csv:GEMM"], ["unknown operator 'GEMM'", "gemm"]),
]


@pytest.mark.usefixtures("no_fit")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_fit5_one_line_exit_2(name, argv, fragments, tmp_path, mb, runs, capsys):
    (tmp_path / "b.json").write_text(json.dumps({"gpu": "H200 SXM"}))
    before, runs_before = _digest(mb), _digest(runs)
    run_bad_case(argv(tmp_path, mb, runs), fragments, capsys)
    assert _digest(mb) == before and _digest(runs) == runs_before  # no input overwritten
    assert not (tmp_path / "same.json").exists() and not (tmp_path / "fr.json").exists()


# ---- the nearest valid inputs ------------------------------------------------------------------------


def test_gemm_fit_json_is_pure_json_with_outputs_beside_the_input(mb, tmp_path, capsys):
    """E8: --json prints only the profile on stdout; S1: a new file beside an input is fine; S7/E3: one known
    operator; S12: --holdout 0.5 (the bound) still fits."""
    out, rep = mb / "new.json", tmp_path / "r.md"
    before = _digest(mb)
    assert main(["fit", f"{mb}/samples.csv:gemm", "--out", str(out), "--report", str(rep), "--holdout", "0.5",
                 "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["gpu"] == "H200 SXM"
    assert "fitted H200 SXM" in cap.err and "held-out gemm" in cap.err
    assert json.loads(out.read_text())["gpu"] == "H200 SXM" and rep.read_text().startswith("#")
    assert {k: v for k, v in _digest(mb).items() if k != "new.json"} == before


def test_fit_a_folder_with_outputs_inside_it_and_refit_in_place(mb, tmp_path, capsys):
    """A profile and a report written inside the input folder (its loader reads only .csv there), and a base
    profile refitted in place (read whole before anything is written): as before the checks."""
    assert main(["fit", str(mb), "--out", str(mb / "refit.json"), "--report", str(mb / "r.md")]) == 0
    assert json.loads((mb / "refit.json").read_text())["gpu"] == "H200 SXM" and (mb / "r.md").is_file()
    base = tmp_path / "b.json"
    base.write_text((mb / "refit.json").read_text())
    assert main(["fit", f"{mb}/samples.csv:gemm", "--base", str(base), "--out", str(base)]) == 0
    assert json.loads(base.read_text())["gpu"] == "H200 SXM"
    capsys.readouterr()


def test_disjoint_operators_of_one_file_and_distinct_lists(mb, capsys):
    """S4: the same file with operators that do not overlap is no repeat; S6/S10: fields in one list each."""
    assert main(["fit", f"{mb}/samples.csv:gemm", f"{mb}/samples.csv:attn_decode", "--freeze", "roofline_p",
                 "--from-base", "eta_kv"]) == 0
    out = capsys.readouterr().out
    assert "gemm" in out and "attn_decode" in out


def test_gpu_and_base_given(mb, tmp_path, capsys):
    """S5/E6: a named --gpu and a --base profile file (not an output) are used."""
    base = tmp_path / "base.json"
    assert main(["fit", f"{mb}/samples.csv:gemm", "--gpu", "H200", "--out", str(base)]) == 0
    assert main(["fit", f"{mb}/samples.csv:gemm", "--gpu", "H200", "--base", str(base), "--out",
                 str(tmp_path / "p2.json")]) == 0
    assert "fitted H200 SXM" in capsys.readouterr().out


def test_model_used_by_llmservingsim_tables(tmp_path, capsys):
    """S9: --model stays allowed where the tables use it (LLMServingSim, whose meta.yaml may not say)."""
    d = tmp_path / "RTX4090" / "tp1"
    d.mkdir(parents=True)
    # qkv_proj rows: GEMM samples whose shapes come from --model (lm_head belongs in per_sequence.csv: in
    # dense.csv it made no sample, and a fit of nothing is refused since round 7)
    (d / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,20.0\nqkv_proj,8,21.0\nqkv_proj,64,40.0\n")
    assert main(["fit", str(d), "--model", "Llama-3.1-8B", "--gpu", "RTX 4090"]) == 0
    out = capsys.readouterr().out
    assert "fitted RTX 4090 on 3 samples" in out


def test_recipe_with_data_and_outputs_elsewhere(mb, tmp_path, capsys):
    """S1/S9: --data with --recipe, the outputs outside the data folder."""
    data = tmp_path / "data" / "h200-sxm"
    for m in ("llama-3-1-8b", "llama-2-7b", "qwen2-5-7b"):
        shutil.copytree(MB_SRC.parent / m, data / m)
    out = tmp_path / "out" / "p.json"
    assert main(["fit", "--recipe", "h200-sxm", "--data", str(tmp_path / "data"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["gpu"] == "H200 SXM"


def test_from_run_with_distinct_holdout_and_json(runs, tmp_path, capsys):
    """S3/S4/E8: a held-out run (another file) that is not fitted; stdout is the JSON alone."""
    out, other = tmp_path / "fr.json", tmp_path / "other_run.json"
    shutil.copy(runs / "vllm_bench_result.json", other)
    assert main(["fit", "--from-run", f"{runs}/vllm_bench_result.json", "--holdout", str(other), "--gpu",
                 "RTX 4090", "--out", str(out), "--json", *FAST]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fit"] and "holdout" in doc and out.is_file()


def test_calibrate_flags_pass_the_checks():
    """E2/S5: a known --model and --gpu pass calibrate's checks (the suite itself is not run here)."""
    import argparse

    from sim.cli.calibrate import _check_calibrate

    args = argparse.Namespace(out="/tmp/never-made-servesim-cal", iters=20, max_tokens=16384, tp=2, smoke=True,
                              model="Llama-3.1-8B", gpu="H100")
    _check_calibrate(args)
