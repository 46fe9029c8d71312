"""The hostile corpus, eleventh round (a helper hunted tracebacks only): an --out that is a symbolic link
leading nowhere (a missing mount, a loop) or a directory with a folder where an output file goes failed
after the run with FileExistsError / IsADirectoryError; the cluster API's wrong argument types failed deep
inside (TypeError); a [[stream]]'s client_timeout_s was accepted and ignored. Each is one line and exit
code 2 (ConfigError in the API) before any work; a link to a real directory is still an --out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "examples" / "quickstart.toml")
POOLS = str(REPO / "examples" / "cluster_pools.toml")


def test_out_a_link_to_nowhere(tmp_path, capsys, no_simulation):  # noqa: F811
    (tmp_path / "dang").symlink_to(tmp_path / "missing" / "dir")
    run_bad_case(["run", QUICK, "--out", str(tmp_path / "dang")], ["--out", "symbolic link", "leads nowhere"], capsys)
    run_bad_case(["run", QUICK, "--out", str(tmp_path / "dang" / "sub")], ["symbolic link", "leads nowhere"], capsys)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    run_bad_case(["run", QUICK, "--out", str(tmp_path / "loop")], ["symbolic link", "a loop"], capsys)


def test_out_file_a_link_to_nowhere(tmp_path, capsys, no_simulation):  # noqa: F811
    (tmp_path / "x.csv").symlink_to(tmp_path / "missing.csv")
    run_bad_case(["sweep", QUICK, "--grid", "engine.max_num_seqs=2,4", "--out", str(tmp_path / "x.csv")],
                 ["--out", "symbolic link", "allowed: a file path"], capsys)


@pytest.mark.parametrize("name", ["summary.json", "report.html", "requests.parquet"])
def test_out_dir_with_a_folder_where_an_output_goes(name, tmp_path, capsys, no_simulation):  # noqa: F811
    (tmp_path / "o" / name).mkdir(parents=True)
    run_bad_case(["run", QUICK, "--out", str(tmp_path / "o")], [f"{name}' is a directory", "allowed:"], capsys)


def test_out_a_link_to_a_real_directory_still_runs(tmp_path, capsys):
    from sim.cli.main import main

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert main(["run", QUICK, "--set", "workload.num_requests=5", "--out", str(tmp_path / "link")]) == 0
    assert (tmp_path / "real" / "summary.json").is_file()


@pytest.mark.parametrize("kw,frag", [({"variant": ["a"]}, "variant: expected a variant name"),
                                     ({"overrides": [5]}, "overrides: expected a list"),
                                     ({"overrides": "engine.max_num_seqs=4"}, "overrides: expected a list"),
                                     ({"fast_forward": "no"}, "fast_forward: expected True or False")])
def test_simulate_cluster_argument_types(kw, frag):
    from sim.app.cluster import simulate_cluster

    with pytest.raises(ConfigError, match=frag):
        simulate_cluster(POOLS, **kw)


@pytest.mark.parametrize("names", [[["x"]], "one-pool"])
def test_simulate_variants_names_type(names):
    from sim.app.cluster import simulate_variants

    with pytest.raises(ConfigError, match="names: expected a list of variant names"):
        simulate_variants(POOLS, names=names)


def test_stream_client_timeout_refused_as_workloads_is(tmp_path, capsys, no_simulation):  # noqa: F811
    cfg = tmp_path / "s.toml"
    cfg.write_text('[model]\nname = "Llama-3.1-8B"\n[hardware]\ngpu = "H100 SXM"\n[engine]\nmax_model_len = 4096\n'
                   '[cluster]\nreplicas = 2\n[[stream]]\nrate = 2.0\nnum_requests = 4\nclient_timeout_s = 0.01\n'
                   'prompt = { dist = "fixed", value = 64 }\noutput = { dist = "fixed", value = 4 }\n')
    run_bad_case(["cluster", str(cfg)], ["[[stream]]", "client_timeout_s", "single engine only"], capsys)

