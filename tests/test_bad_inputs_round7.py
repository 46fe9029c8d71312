"""The hostile corpus, seventh round (fuzz7, 2026-12-06): cluster variant names that collide with output
files or that the file system cannot make, --out paths deeper than mkdir can recurse, fit's sample shapes
and meta.json, an HF config's dense-layer count, --intervals with --plotlyjs, schema sections of cluster
configs, a cluster config handed to the Python API. Each bad input ends in exit code 2 (or one
ServesimError line) before any engine runs; next to it, the nearest valid input still works."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

import servesim
from sim.app.variant_names import OUTPUT_FILE_NAMES
from sim.cli.main import main
from sim.core.errors import ServesimError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sim" / "cost" / "data" / "microbench" / "h200-sxm" / "qwen2-5-7b"
BASE = """[model]
name = "Mistral-7B"
[hardware]
gpu = "RTX 4090"
[engine]
cost_model = "constant"
constant_step_s = 0.01
[workload]
rate = 4.0
num_requests = 6
prompt = { dist = "fixed", value = 64 }
output = { dist = "fixed", value = 8 }
"""
HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 2816,
      "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
      "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}  # fmt: skip


def _base(t: Path, extra: str = "") -> str:
    (t / "base.toml").write_text(BASE + extra)
    return str(t / "base.toml")


def _variants(t: Path, *names: str) -> str:
    tables = "".join(f"[variants.{json.dumps(n)}]\ncluster = {{ replicas = {i + 1} }}\n" for i, n in enumerate(names))
    return _base(t, tables)


def _samples(t: Path, col: str | None = None, value: str = "", meta: str | None = None, header_only: bool = False) -> str:
    """A copy of a shipped samples folder with every gemm row's ``col`` set to ``value``."""
    d = t / "fit"
    shutil.copytree(SAMPLES, d)
    p = d / "samples.csv"
    rows = list(csv.DictReader(p.open()))
    if col is not None:
        for r in rows:
            if r["op"] == "gemm":
                r[col] = value
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        if not header_only:
            w.writerows(rows)
    if meta is not None:
        (d / "meta.json").write_text(meta)
    return str(p)


def _hf(t: Path, **over) -> str:
    (t / "config.json").write_text(json.dumps({**HF, **over}))
    return str(t / "config.json")


CASES = [
    # a variant folder named like a file the run writes: a FileExistsError after the first variant ran
    ("variant-summary-json", lambda t: ["cluster", _variants(t, "a", "a/summary.json"), "--out", str(t / "o")],
     ["[variants.\"a/summary.json\"]", "'a/summary.json'", "variant 'a'"]),
    ("variant-comparison-html", lambda t: ["cluster", _variants(t, "a", "comparison.html"), "--out", str(t / "o")],
     ["'comparison.html'", "the comparison"]),
    # names the file system cannot make: found after the simulation, or a RecursionError in mkdir
    ("variant-name-300-bytes", lambda t: ["cluster", _variants(t, "a", "v" * 300), "--out", str(t / "o")],
     ["300 bytes", "255 bytes"]),
    ("variant-name-300-levels", lambda t: ["cluster", _variants(t, "a", "/".join(["v"] * 300)), "--out", str(t / "o")],
     ["--out (variant", "folder levels to make", "at most 256"]),
    ("run-out-1200-levels", lambda t: ["run", _base(t), "--out", str(t / "/".join(["d"] * 1200))],
     ["--out", "1200 folder levels to make", "at most 256"]),
    # fit: shapes and meta.json
    ("fit-negative-k", lambda t: ["fit", _samples(t, "k", "-5"), "--out", str(t / "p.json")],
     ["samples.csv", "(gemm)", "k -5", ">= 0"]),
    ("fit-text-m", lambda t: ["fit", _samples(t, "m", "abc"), "--out", str(t / "p.json")], ["m 'abc'", ">= 0"]),
    ("fit-inf-m", lambda t: ["fit", _samples(t, "m", "inf"), "--out", str(t / "p.json")], ["m inf"]),
    ("fit-time-text", lambda t: ["fit", _samples(t, "time_s", "fast"), "--out", str(t / "p.json")],
     ["time_s 'fast'", "seconds > 0"]),
    ("fit-meta-list", lambda t: ["fit", _samples(t, meta="[1, 2]"), "--out", str(t / "p.json")],
     ["meta.json", "expected a JSON object", "list"]),
    ("fit-header-only", lambda t: ["fit", _samples(t, header_only=True), "--out", str(t / "p.json")],
     ["fit: no samples in", "samples.csv"]),
    ("fit-meta-no-gpu", lambda t: ["fit", _samples(t, meta='{"format": "servesim-samples"}'), "--out",
                                   str(t / "p.json")], ["do not name their GPU", "--gpu NAME"]),
    ("fit-meta-unknown-gpu", lambda t: ["fit", _samples(t, meta='{"gpu": "Voodoo 2"}'), "--out", str(t / "p.json")],
     ["'Voodoo 2'", "--gpu NAME"]),
    # leading dense layers below zero (above the layer count: every layer dense, tested below)
    ("hf-first-k-dense-replace", lambda t: ["plan", "--model", _hf(t, first_k_dense_replace=-1), "--gpu", "H100"],
     ["first_k_dense_replace", "got -1"]),
    ("hf-rope-scaling-text", lambda t: ["plan", "--model", _hf(t, rope_scaling="yarn"), "--gpu", "H100"],
     ["rope_scaling", "expected a table", "'yarn'"]),
    ("hf-rope-scaling-negative", lambda t: ["plan", "--model", _hf(t, rope_scaling={"type": "linear", "factor": -2}),
                                            "--gpu", "H100"], ["rope_scaling.factor", "got -2"]),
    ("hf-yarn-without-original", lambda t: ["plan", "--model", _hf(t, rope_scaling={"rope_type": "yarn", "factor": 4}),
                                            "--gpu", "H100"], ["original_max_position_embeddings", "got None"]),
    # --intervals prints a table: --plotlyjs did nothing
    ("intervals-plotlyjs", lambda t: ["run", _base(t), "--intervals", "--replications", "2", "--plotlyjs", "cdn"],
     ["--plotlyjs", "not with --intervals"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_round7_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


def test_cluster_config_through_the_api_names_the_tables(tmp_path):
    """The API runs one engine: a cluster file said "unknown section(s) ['variants']"."""
    with pytest.raises(ServesimError) as info:
        servesim.run(_variants(tmp_path, "a", "b"))
    msg = str(info.value)
    assert "\n" not in msg and "cluster table(s) ['variants']" in msg and "servesim cluster" in msg
    with pytest.raises(ServesimError, match=r"cluster table\(s\) \['cluster'\]"):
        servesim.load_config(_base(tmp_path, "[cluster]\nreplicas = 2\n"))


def test_nearest_valid_inputs(tmp_path, capsys):
    """Nested and dotted variant names, a few new --out levels, a shipped samples folder, an MoE config
    whose every layer is dense, the schema of a cluster table."""
    out = tmp_path / "o"
    assert main(["cluster", _variants(tmp_path, "vllm", "vllm/split", "v-0.11"), "--out", str(out)]) == 0
    # every file a variant run writes is one OUTPUT_FILE_NAMES knows (the variant-name check reads that list)
    written = {p.name for p in out.rglob("*") if p.is_file()}
    assert written and written <= OUTPUT_FILE_NAMES, written - OUTPUT_FILE_NAMES
    assert main(["run", _base(tmp_path), "--out", str(tmp_path / "a" / "b" / "c" / "d")]) == 0
    assert main(["fit", _samples(tmp_path), "--out", str(tmp_path / "p.json")]) == 0
    assert main(["plan", "--model", _hf(tmp_path, first_k_dense_replace=4), "--gpu", "H100"]) == 0
    # a DeepSeek config cut to fewer layers than its dense ones: every layer dense, as vLLM builds it (the
    # first version of the check refused it; before that the MoE layers came out negative)
    from sim.cost.hf_config import load_hf_config

    spec = load_hf_config(Path(_hf(tmp_path, first_k_dense_replace=100)))
    assert spec.first_k_dense_replace == 4
    # names that collide with nothing, or are written nowhere: a file's name under a folder no variant has,
    # a long name without --out (the review of the first version of these checks)
    assert main(["cluster", _variants(tmp_path, "runs/report.html", "w" * 300)]) == 0
    capsys.readouterr()
    assert main(["schema", "--section", "cluster"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "cluster"


def test_rope_scaling_stretches_the_context_as_vllm_derives_it(tmp_path):
    """vLLM's _get_and_verify_max_len: the factor multiplies max_position_embeddings (yarn: its original
    length); su / longrope / llama3 carry their own. A yarn-scaled 131,072 was refused against 32,768."""
    from sim.cost.hf_config import load_hf_config

    def derived(**rope) -> int:
        path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps({**HF, "max_position_embeddings": 32768, "rope_scaling": rope or None}))
        return load_hf_config(path).max_position_embeddings

    assert derived() == 32768
    assert derived(type="yarn", factor=4.0, original_max_position_embeddings=32768) == 131072
    assert derived(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096) == 16384
    assert derived(rope_type="linear", factor=2.0) == 65536
    assert derived(rope_type="llama3", factor=8.0, original_max_position_embeddings=8192) == 32768
    assert derived(rope_type="default") == 32768
