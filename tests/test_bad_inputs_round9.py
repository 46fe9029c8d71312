"""The hostile corpus, ninth round (2026-12-06): inputs that hung or were silently overridden. Each is now
one line and exit 2 before any engine runs; beside each, the nearest valid input still runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "examples" / "quickstart.toml")


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- sweep --backend ray --address: Ray's connect retried for ever where nothing answered ---------------------
def test_ray_address_where_nothing_listens_is_one_line(tmp_path, capsys, no_simulation):  # noqa: F811
    port = _closed_port()
    run_bad_case(["sweep", QUICK, "--grid", "engine.max_num_seqs=8,16", "--backend", "ray", "--address",
                  f"127.0.0.1:{port}", "--out", str(tmp_path / "s.csv")],
                 ["--address", f"127.0.0.1:{port}", "nothing answers", "ray start --head"], capsys)


def test_ray_address_that_listens_passes_the_probe():
    from sim.app.sweep import reach_ray_address

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        reach_ray_address(f"127.0.0.1:{port}")
        reach_ray_address(f"ray://127.0.0.1:{port}")
    for a in ("auto", "local"):
        reach_ray_address(a)  # nothing to reach: Ray finds or starts the instance


def test_ray_address_probe_gives_up_after_its_timeout(monkeypatch):
    """A host that drops the packets: the probe's own timeout, said, instead of Ray's endless retries."""
    from sim.app import sweep
    from sim.core.errors import ConfigError

    def slow(addr, timeout):
        assert timeout == 0.25
        raise TimeoutError("timed out")

    monkeypatch.setattr(sweep.socket, "create_connection", slow)
    with pytest.raises(ConfigError, match=r"nothing answers at 10\.1\.2\.3:6379 \(no answer in 0\.25 s\)"):
        sweep.reach_ray_address("10.1.2.3:6379", timeout_s=0.25)


# ---- --set of one key twice: the later silently replaced the earlier --------------------------------------------
@pytest.mark.parametrize("second", ["engine.max_num_seqs=16", 'engine."max_num_seqs" = 16', " engine.max_num_seqs=16"])
def test_set_one_key_twice_with_two_values(second, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "engine.max_num_seqs=8", "--set", second],
                 ["--set engine.max_num_seqs is given twice", "'8' then '16'", "one value"], capsys)


def test_set_twice_refused_in_every_subcommand_that_takes_it(tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["sweep", QUICK, "--grid", "engine.max_num_seqs=8,16", "--set", "workload.rate=1",
                  "--set", "workload.rate=2", "--out", str(tmp_path / "s.csv")],
                 ["--set workload.rate is given twice", "'1' then '2'"], capsys)


def test_set_twice_with_one_value_and_layered_flags_still_run(capsys):
    """The same value twice is no contradiction; --vllm-args and --goodput layer under and over the user's
    --set as before (the user's --set wins over the vLLM flag)."""
    from sim.app.config import check_set_repeats

    check_set_repeats(["engine.max_num_seqs=8", "engine.max_num_seqs = 8", "workload.rate=1", "workload.rate=1.0"])
    check_set_repeats(["model.dtype=fp8", "model.dtype=fp8_e4m3"])  # two spellings of one dtype
    rc = main(["run", QUICK, "--json", "--set", "simulation.num_requests=12", "--set", "engine.max_num_seqs=8",
               "--set", "engine.max_num_seqs=8", "--vllm-args", "--max-num-seqs 4", "--goodput", "ttft:1000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert '"num_finished": 12' in out
    assert '"max_num_seqs": 8' in out and '"max_num_seqs": 4' not in out  # the user's --set, not the flag
