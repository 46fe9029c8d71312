"""The hostile corpus, tenth round: ``servesim fit`` on microbenchmark CSVs. Bytes that are not UTF-8 (a
traceback from the header sniffer), shapes no kernel has (1e300 crashed scipy, 1e20 was fitted), GEMMs
without a shape or of 0x0x0 and all-reduces on 0 GPUs (fitted), a row with one field too many (pandas shifted
the columns: "op np.float64(0.001)"). Each is one line and exit code 2 before any fit; beside each, the
nearest valid input still fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.cost.calibrate.importers import load_path
from sim.cost.calibrate.samples import load_samples_csv
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "sim" / "cost" / "data" / "microbench"
GEMM = "op,time_s,m,k,n\ngemm,0.001,128,4096,4096\ngemm,0.002,256,4096,4096\ngemm,0.004,512,4096,4096\n"


@pytest.fixture
def no_fit(monkeypatch, no_simulation):  # noqa: F811
    """Fail if a fit starts: bad input must be refused before it."""
    import sim.cost.calibrate.fit as fit

    def boom(*a, **k):
        raise AssertionError("a fit ran before the input was checked")

    monkeypatch.setattr(fit, "fit_profile", boom)


def _folder(t: Path, text: str | bytes, name: str = "mb", meta: str | bytes = '{"gpu": "RTX 4090"}') -> Path:
    """A samples folder: samples.csv (``text``) and meta.json."""
    d = t / name
    d.mkdir(parents=True)
    for f, body in (("samples.csv", text), ("meta.json", meta)):
        (d / f).write_bytes(body if isinstance(body, bytes) else body.encode())
    return d


def _fit(path: Path, t: Path) -> list[str]:
    return ["fit", str(path), "--out", str(t / "p.json")]


# ---- 2: not UTF-8 (a traceback from sniff's readline) -------------------------------------------------------
def _garbage_file(t: Path) -> Path:
    p = t / "garbage.csv"
    p.write_bytes(bytes([0xAC, 0x00, 0xFF, 0x10]) * 75)
    return p


def _garbage_in_tree(t: Path) -> Path:
    """A valid samples folder and, in another folder of the same tree, one binary *.csv."""
    _folder(t / "tree", GEMM, "ok")
    (t / "tree" / "stray").mkdir()
    (t / "tree" / "stray" / "x.csv").write_bytes(bytes(range(128, 256)))
    return t / "tree"


def _lss_late_byte(t: Path) -> Path:
    """An LLMServingSim dense.csv whose header is text and a later row is not (read past sniff's header)."""
    d = t / "perf/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1"
    d.mkdir(parents=True)
    (d.parent / "meta.yaml").write_text("gpu: NVIDIA GeForce RTX 4090\nmodel: meta-llama/Llama-3.1-8B\n")
    (d / "dense.csv").write_bytes(b"layer,tokens,time_us\nqkv_proj,1,30.0\nqkv_proj,\xff16,40.0\n")
    return d


NOT_UTF8 = [
    ("random-bytes-file", _garbage_file, ["garbage.csv", "not UTF-8 text", "byte 0xac at offset 0", "UTF-8 CSV"]),
    ("utf16-excel", lambda t: _folder(t, "\ufeffop,time_s\n".encode("utf-16-le")),
     ["samples.csv", "not UTF-8 text", "UTF-16 byte-order mark"]),
    ("binary-csv-in-a-tree", _garbage_in_tree, ["stray/x.csv", "not UTF-8 text", "byte 0x80"]),
    ("samples-bad-byte-in-a-row", lambda t: _folder(t, GEMM.encode() + b"gemm,0.003,\xe9,4096,4096\n"),
     ["mb/samples.csv", "not UTF-8 text", "byte 0xe9 at offset"]),
    ("meta-json-not-utf8", lambda t: _folder(t, GEMM, meta=b'{"gpu": "RTX 4090 \xff"}'),
     ["meta.json", "not UTF-8 text", "a UTF-8 JSON file"]),
    ("llmservingsim-bad-byte-in-a-row", _lss_late_byte, ["dense.csv", "not UTF-8 text", "byte 0xff"]),
]


@pytest.mark.usefixtures("no_fit")
@pytest.mark.parametrize("name,make,fragments", NOT_UTF8, ids=[c[0] for c in NOT_UTF8])
def test_not_utf8_is_one_line(name, make, fragments, tmp_path, capsys):
    run_bad_case(_fit(make(tmp_path), tmp_path), fragments, capsys)


def test_utf8_with_a_byte_order_mark_fits(tmp_path):
    """A UTF-8 BOM (Excel's 'CSV UTF-8') is text: dropped, not refused."""
    assert main(_fit(_folder(tmp_path, b"\xef\xbb\xbf" + GEMM.encode()), tmp_path)) == 0


# ---- 3: shapes no kernel has -------------------------------------------------------------------------------
HUGE = [
    ("gemm-1e300", "op,time_s,m,k,n\ngemm,0.001,1e300,1e300,1e300\ngemm,0.002,1e300,4096,4096\n",
     ["mb/samples.csv", "sample row 0 (gemm)", "m 1e+300", "<= 1e+09"]),
    ("gemm-1e20", "op,time_s,m,k,n\ngemm,0.001,1e20,4096,4096\ngemm,0.002,128,4096,4096\n",
     ["sample row 0 (gemm)", "m 1e+20", "<= 1e+09"]),
    ("gemm-n-past-1e9", GEMM + "gemm,0.003,128,4096,2e9\n", ["sample row 3 (gemm)", "n 2e+09", "<= 1e+09"]),
    ("copy-nbytes-1e14", "op,time_s,nbytes\ncopy,0.001,1e14\n", ["(copy)", "nbytes 1e+14", "<= 1e+13"]),
    ("allreduce-tp-5000", "op,time_s,nbytes,tp\nallreduce,0.001,1e6,5000\n", ["(allreduce)", "tp 5000", "<= 1024"]),
    ("gemm-w-bytes-16", "op,time_s,m,k,n,w_bytes\ngemm,0.001,128,4096,4096,16\n", ["w_bytes 16", "> 0 and <= 8"]),
    ("gemm-w-bytes-0", "op,time_s,m,k,n,w_bytes\ngemm,0.001,128,4096,4096,0\n", ["w_bytes 0", "> 0 and <= 8"]),
]


def test_shapes_at_their_bounds_load(tmp_path):
    d = _folder(tmp_path, "op,time_s,m,k,n,w_bytes,nbytes,tp\ngemm,0.001,1e9,1e9,1e9,8,,\n"
                          "allreduce,0.001,,,,,1e13,1024\n")
    assert len(load_samples_csv(d / "samples.csv").samples) == 2


# ---- 5: samples that measure nothing the model describes -----------------------------------------------------
EMPTY = [
    ("gemm-no-shape-columns", "op,time_s\ngemm,0.001\ngemm,0.002\n", ["(gemm)", "m missing", "> 0", "m, k, n"]),
    ("gemm-zeros", "op,time_s,m,k,n\ngemm,0.001,0,0,0\n", ["(gemm)", "m 0", "> 0"]),
    ("gemm-k-empty", "op,time_s,m,k,n\ngemm,0.001,128,,4096\n", ["(gemm)", "k missing"]),
    ("allreduce-tp-0", "op,time_s,nbytes,tp\nallreduce,0.001,1e6,0\n", ["(allreduce)", "tp 0", "an integer >= 2"]),
    ("allreduce-tp-1", "op,time_s,nbytes,tp\nallreduce,0.001,1e6,1\n", ["tp 1", "an integer >= 2"]),
    ("allreduce-tp-2.5", "op,time_s,nbytes,tp\nallreduce,0.001,1e6,2.5\n", ["tp 2.5", "an integer >= 2"]),
    ("allreduce-no-tp", "op,time_s,nbytes\nallreduce,0.001,1e6\n", ["tp missing"]),
    ("allreduce-no-nbytes", "op,time_s,tp\nallreduce,0.001,2\n", ["nbytes missing"]),
    ("decode-without-heads", "op,time_s,n_decode,kv_decode\nattn_decode,0.001,1,100\n", ["(attn_decode)", "nh missing"]),
    ("sampler-without-vocab", "op,time_s,m\nsampler,0.001,4\n", ["(sampler)", "vocab missing"]),
]


@pytest.mark.usefixtures("no_fit")
@pytest.mark.parametrize("name,text,fragments", HUGE + EMPTY, ids=[c[0] for c in HUGE + EMPTY])
def test_shape_past_its_bound_or_missing_is_one_line(name, text, fragments, tmp_path, capsys):
    run_bad_case(_fit(_folder(tmp_path, text), tmp_path), fragments, capsys)


def test_nearest_valid_samples_fit(tmp_path):
    """All-reduces on 2 and 4 GPUs, a first prefill chunk (kv_prefill 0), the bare scheduling loop (m 0)."""
    text = ("op,time_s,nbytes,tp,chunk,kv_prefill,n_decode,kv_decode,nh,nkv,hd,m\n"
            "allreduce,2e-5,1e6,2,,,,,,,,\nallreduce,1e-4,1e8,4,,,,,,,,\nallreduce,4e-5,1e7,2.0,,,,,,,,\n"
            "attn_prefill,1e-4,,,512,0,0,0,32,8,128,\nstep_overhead,1e-4,,,,,,,,,,0\n")
    d = _folder(tmp_path, text)
    assert main(_fit(d, tmp_path)) == 0
    assert json.loads((tmp_path / "p.json").read_text())["source"] == "fitted"


# ---- 22: a row with one field too many ------------------------------------------------------------------------
def test_row_with_a_field_too_many_is_one_line(tmp_path, capsys, no_fit):
    d = _folder(tmp_path, "op,time_s,m,k,n\ngemm,0.001,128,4096,4096\ngemm,0.002,256,4096,4096,99\n")
    run_bad_case(_fit(d, tmp_path), ["samples.csv:3", "sample row 1", "expected 5 fields", "found 6"], capsys)


def test_every_row_a_field_too_many_is_one_line(tmp_path, capsys, no_fit):
    """One extra field on every row: pandas read the first column as the index ("op np.float64(0.001)")."""
    d = _folder(tmp_path, "op,time_s,m,k,n\ngemm,0.001,128,4096,4096,99\n")
    run_bad_case(_fit(d, tmp_path), ["samples.csv:2", "sample row 0", "expected 5 fields", "found 6"], capsys)
    assert "np." not in capsys.readouterr().err


def test_numeric_op_is_shown_as_written(tmp_path, capsys, no_fit):
    d = _folder(tmp_path, "op,time_s\n0.001,0.002\n")
    run_bad_case(_fit(d, tmp_path), ["mb/samples.csv", "sample row 0", "op 0.001", "allowed: one of gemm"], capsys)


def test_trailing_commas_are_no_fields(tmp_path):
    """A comma at the end of every line (some exporters write one) adds no field: the rows fit as they are."""
    d = _folder(tmp_path, GEMM.replace("\n", ",\n"))
    s = load_samples_csv(d / "samples.csv").samples
    assert list(s["op"]) == ["gemm"] * 3 and list(s["m"]) == [128, 256, 512]
    assert main(_fit(d, tmp_path)) == 0


# ---- the shipped measurements still load whole -------------------------------------------------------------
def test_shipped_samples_pass_the_checks():
    mbs = load_path(SHIPPED)
    assert len(mbs) >= 3 and sum(len(mb.samples) for mb in mbs) > 1000
