"""``servesim calibrate`` (run the microbenchmark suite, fit a profile) and ``servesim fit`` (fit a profile from
microbenchmark CSVs, public formats included). Wire with ``cli_calibrate.add_parsers(sub)``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sim.cli.fit_checks import (
    check_outputs_not_inputs,
    holdout_fraction,
    profile_fields,
    refuse_empty,
    refuse_repeats,
    refuse_with_list,
)
from sim.cli.flags import check_not_empty
from sim.cost.calibrate.samples import OPS


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "calibrate",
        help="run the PyTorch microbenchmark suite and fit a calibration profile (needs servesim[calibrate])",
        description="Times GEMMs, attention, elementwise kernels, sampler, copy, all-reduce and a minimal "
        "scheduling loop with PyTorch, writes samples.csv + meta.json, fits a profile and writes <gpu>.json "
        "and fit_report.md into --out. On a GPU: `servesim calibrate --out profiles/`; copy the JSON to "
        "sim/cost/data/profiles/ to ship it. --smoke runs tiny shapes on the CPU (CI); its profile is marked as "
        "not a GPU profile.",
    )
    c.add_argument("--out", required=True, help="output directory (created)")
    c.add_argument("--model", default="Llama-3.1-8B", help="model whose layer shapes are timed")
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of the timed shapes")
    c.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    c.add_argument("--gpu", help="catalogue GPU to fit against (default: the detected device)")
    c.add_argument("--smoke", action="store_true", help="tiny shapes, a few seconds on a CPU (CI smoke test)")
    c.add_argument("--max-tokens", type=int, default=16384, help="largest GEMM token count")
    c.add_argument("--iters", type=int, default=20, help="timed repetitions per point")
    c.set_defaults(func=run_calibrate)

    f = sub.add_parser(
        "fit",
        help="fit a calibration profile to microbenchmark CSVs",
        description="Inputs are files or folders in any supported format (servesim samples.csv, LLMServingSim "
        "dense/attention/per_sequence.csv and v0 layers.csv, BLIS/InferSim attention CSVs, Vidur mlp/attention.csv)"
        "; append :op1,op2 to take only those operators from an input. --recipe SLUG rebuilds a shipped profile.",
    )
    f.add_argument("inputs", nargs="*", metavar="PATH[:OPS]")
    f.add_argument("--recipe", help="a shipped profile's recipe (sim/cost/calibrate/recipes.py), e.g. rtx-4090")
    f.add_argument("--data", default=None,
                   help="microbenchmark root for --recipe (default: the recipe's own: ../shared/data/microbench for "
                        "the public-data recipes, the packaged sim/cost/data/microbench for those on servesim's own "
                        "measurements)")
    f.add_argument("--gpu", help="catalogue GPU the data was measured on (default: what the data says)")
    f.add_argument("--model", help="model of the timed layers, when LLMServingSim tables do not say")
    f.add_argument("--base", default="prior", help="'prior' or a profile JSON whose values unfitted groups keep")
    f.add_argument("--freeze", default=None, help="comma-separated profile fields to keep at --base")
    f.add_argument("--from-base", default=None,
                   help="comma-separated profile fields fitted with their group, then set to --base's value (fixed "
                        "costs of a benchmarked kernel that is not the engine's, so they do not bend the other fields)")
    f.add_argument("--out", help="write the fitted profile JSON here")
    f.add_argument("--holdout", action="extend", nargs="+", default=None, metavar="FRAC|RUN",
                   help="microbenchmarks: also fit without the largest FRAC (0 < FRAC <= 0.5) of each file's shapes and report "
                        "held-out errors; with --from-run: real runs to report held-out errors on")
    f.add_argument("--from-run", action="extend", nargs="+", metavar="RUN",
                   help="fit engine-level terms to real runs (vllm bench result JSON, inference-perf results, "
                        "requests.jsonl, Prometheus scrapes) by least squares on the replay (sim/app/runfit.py)")
    # defaults None, filled in with --from-run (sim/cli/fit_runs.py): given without it they are refused
    f.add_argument("--max-per-stage", type=int, default=None,
                   help="with --from-run: replay the first N requests of each stage (default 200)")
    f.add_argument("--max-nfev", type=int, default=None,
                   help="with --from-run: at most this many fit iterations (default 30)")
    from sim.cli.progress import add_quiet_option

    add_quiet_option(f)
    f.add_argument("--profile", help="with --from-run: the profile to start from (default: the GPU's shipped one)")
    f.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with --from-run: a replay setting for every run (repeatable)")
    f.add_argument("--report", help="write the error tables as Markdown here")
    f.add_argument("--json", action="store_true", help="print the profile JSON")
    f.add_argument("--list", action="store_true",
                   help="list every catalogue GPU with the profile a run uses for it (fitted file or prior)")
    f.set_defaults(func=run_fit)


def _split_input(text: str) -> tuple[str, tuple[str, ...] | None]:
    """``PATH[:op1,op2]`` -> (path, ops). A path that exists is taken whole (a name may hold a colon); after
    an existing path, every item of the operator list must be a known operator, given once."""
    from sim.core.errors import ConfigError

    def exists(q: str) -> bool:
        try:
            return Path(q).exists()
        except OSError:  # e.g. a name too long: load_path says so
            return False

    if ":" not in text or exists(text):
        return text, None
    head, tail = text.rsplit(":", 1)
    items = [o.strip() for o in tail.split(",")]
    if not exists(head):  # neither exists: load_path names the missing path
        return (head, tuple(items)) if all(o in OPS for o in items) else (text, None)
    if not all(items):
        raise ConfigError(f"{text}: an empty operator in {tail!r}; allowed: comma-separated operators after ':' "
                          f"({', '.join(OPS)})")
    unknown = [o for o in items if o not in OPS]
    if unknown:
        raise ConfigError(f"{text}: unknown operator {unknown[0]!r}; allowed: {', '.join(OPS)}")
    twice = next((o for k, o in enumerate(items) if o in items[:k]), None)
    if twice:
        raise ConfigError(f"{text}: operator {twice!r} given twice; allowed: each operator once")
    return head, tuple(items)


def _table(df, cols: list[str]) -> str:
    """A small Markdown table (percentages for error columns)."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        d = r._asdict()
        cells = []
        for c in cols:
            v = d[c]
            if isinstance(v, float) and c not in ("n", "n_train", "n_test"):
                cells.append("-" if v != v else f"{100 * v:.1f} %")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fit_report_markdown(title: str, profile, errors, holdout=None, notes: list[str] | None = None) -> str:
    out = [f"# {title}", "", f"Profile `{profile.gpu}` ({profile.source}). {profile.description}", "",
           "## Fit error (all samples)", "", _table(errors, ["file", "op", "n", "mape", "p90", "bias"])]
    if holdout is not None and len(holdout):
        out += ["", "## Held out by shape range (largest shapes of each file not fitted)", "",
                _table(holdout, ["file", "op", "n_train", "mape_train", "n_test", "mape_test"])]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def profiles_table() -> str:
    """Every catalogue GPU, the profile ``hardware.profile = "auto"`` gives it, fitted or prior, and why."""
    from sim.cost.hardware import get_gpu, list_gpus
    from sim.cost.profiles import get_profile, gpu_family

    lines = []
    for name in list_gpus():
        gpu = get_gpu(name)
        p = get_profile(gpu)
        kind = p.source if p.source == "fitted" else f"prior ({gpu_family(gpu)})"
        lines.append(f"{name:24s} {kind:18s} eta_c {p.eta_compute:.3f} eta_b {p.eta_bandwidth:.3f} "
                     f"eta_kv {p.eta_kv:.3f}  {p.description[:90]}")
    return "\n".join(lines)


def run_fit(args: argparse.Namespace) -> int:
    from sim.core.errors import ConfigError, ServesimError
    from sim.cost.calibrate.fit import fit_profile, holdout_errors, with_metadata
    from sim.cost.calibrate.importers import load_path
    from sim.cost.calibrate.recipes import fit_recipe, get_recipe, recipe_holdout, recipe_root
    from sim.cost.calibrate.samples import merge
    from sim.cost.hardware import get_gpu
    from sim.cost.profiles import prior_profile

    refuse_empty(args)
    if args.list:
        refuse_with_list(args)
        print(profiles_table())
        return 0
    if args.from_run:
        from sim.cli.fit_runs import run_fit_from_runs

        return run_fit_from_runs(args)
    replay_only = [flag for flag, v in (("--max-per-stage", args.max_per_stage is not None),
                                        ("--max-nfev", args.max_nfev is not None),
                                        ("--profile", args.profile), ("--set", args.overrides),
                                        ("--quiet", getattr(args, "quiet", False))) if v]  # fmt: skip
    if replay_only:  # a flag that would do nothing is refused, not ignored
        raise ConfigError(f"{', '.join(replay_only)}: only with --from-run (the replay fit); a microbenchmark fit "
                          "takes --gpu, --model, --base, --freeze, --from-base, --holdout, --out, --report")
    args.holdout = holdout_fraction(args.holdout)
    freeze = profile_fields("--freeze", args.freeze)
    from_base = profile_fields("--from-base", args.from_base)
    both = sorted(freeze & from_base)
    if both:
        raise ConfigError(f"--freeze and --from-base both name {', '.join(both)}; allowed: a field in one of them "
                          "(--freeze holds it at --base while the group is fitted, --from-base fits it with the group "
                          "and then resets it)")
    from sim.cli.outpath import check_out_file

    check_out_file(args.out, "--out")  # before the fit, not after it
    check_out_file(args.report, "--report")
    if args.recipe:
        if args.inputs:
            raise ConfigError("give --recipe or input paths, not both")
        # a recipe names its own GPU, base and frozen fields: a flag that would be ignored is refused
        given = [f for f, v in (("--gpu", args.gpu), ("--model", args.model), ("--freeze", args.freeze is not None),
                                ("--from-base", args.from_base is not None), ("--base", args.base != "prior")) if v]  # fmt: skip
        if given:
            raise ConfigError(f"--recipe {args.recipe}: {', '.join(given)} not allowed with a recipe "
                              "(it fixes its GPU, model, base and frozen fields); allowed: --data, --out, --report, "
                              "--holdout")
        recipe = get_recipe(args.recipe)
        sources: list[tuple[str, str | Path]] = [("--data" if args.data else f"the recipe's data for {args.recipe}",
                                                   recipe_root(recipe, args.data))]  # fmt: skip
        # (a base profile is read whole before anything is written: refitting it in place is allowed)
        check_outputs_not_inputs([("--out", args.out), ("--report", args.report)], sources, reads=".csv")
        profile, res, bench = fit_recipe(args.recipe, args.data)
        hold = recipe_holdout(args.recipe, bench, args.holdout) if args.holdout else None
        title = f"Fit of `{args.recipe}`"
    else:
        if args.data is not None:
            raise ConfigError(f"--data {args.data}: only with --recipe (the folder a recipe reads its sources from); "
                              "give your own files as input paths")
        if not args.inputs:
            raise ConfigError("servesim fit: give input paths or --recipe")
        split = [_split_input(text) for text in args.inputs]
        refuse_repeats("input", list(args.inputs), [o for _, o in split], [p for p, _ in split])
        sources = [("input", p) for p, _ in split]
        check_outputs_not_inputs([("--out", args.out), ("--report", args.report)], sources, reads=".csv")
        gpu_named = _named_gpu(args.gpu)
        model = _named_model(args.model)
        base = _load_base(args.base)
        benches, formats = [], set()
        for path, ops in split:
            for mb in load_path(path, model=model, gpu=gpu_named):
                formats.add(mb.meta.get("format"))
                benches.append(mb.select(ops))
        if model is not None and not formats & {"llmservingsim", "llmservingsim-v0"}:
            raise ConfigError(f"--model {args.model}: not used by these inputs ({', '.join(sorted(map(str, formats)))}"
                              " name their shapes themselves); allowed: only with LLMServingSim dense/attention/"
                              "per_sequence.csv or layers.csv tables")
        bench = merge(benches)
        if bench.samples.empty:  # nothing to fit: a 'fitted' prior would be written
            raise ConfigError(f"fit: no samples in {', '.join(map(str, args.inputs))}"
                              f"{' for the operators asked' if any(':' in str(x) for x in args.inputs) else ''}; "
                              "allowed: inputs holding samples (servesim calibrate's, or a format the importers read)")
        try:
            gpu = get_gpu(gpu_named or bench.gpu)
        except ServesimError as e:
            if gpu_named:
                raise
            said = ("do not name their GPU (neither a meta.json 'gpu' nor a card in the path the importer reads)"
                    if bench.gpu == "unknown" else
                    f"name GPU {bench.gpu!r} (meta.json's 'gpu', or the importer's from the path), which the catalogue lacks")
            raise ConfigError(f"fit: the samples {said}; allowed: --gpu NAME (servesim gpus lists them)") from e
        base = prior_profile(gpu) if base is None else base
        res = fit_profile(bench, gpu, base, freeze=freeze, from_base=from_base)
        cmd = "servesim fit " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "servesim fit"
        profile = with_metadata(res, bench, command=cmd, extra={"gpu_profile": True})
        title = f"Fit for {gpu.name}"
        hold = (holdout_errors(bench, gpu, base, frac=args.holdout, freeze=freeze, from_base=from_base)
                if args.holdout else None)
    say = _sayer(args.json)  # with --json, stdout is the JSON alone: the tables go to stderr
    say(f"fitted {profile.gpu} on {len(bench.samples)} samples")
    for r in res.errors.itertuples():
        say(f"  {r.op:18s} n={r.n:6d}  MAPE {100 * r.mape:5.1f} %  P90 {100 * r.p90:5.1f} %  {r.file}")
    if hold is not None:
        for r in hold.itertuples():
            say(f"  held-out {r.op:18s} n={r.n_test:5d}  MAPE {100 * r.mape_test:5.1f} %  {r.file}")
    for n in res.notes:
        say(f"  note: {n}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        profile.save(args.out)
        say(f"wrote {args.out}")
    if args.report:
        Path(args.report).write_text(fit_report_markdown(title, profile, res.errors, hold, res.notes))
        say(f"wrote {args.report}")
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
    return 0


def _sayer(json_out: bool):
    """print, or print to stderr when stdout carries JSON (``--json``)."""
    return (lambda *a: print(*a, file=sys.stderr, flush=True)) if json_out else print


def _named_gpu(name: str | None) -> str | None:
    """``--gpu``: a catalogue name (refused by name before any file is read) -> its catalogue name."""
    from sim.core.errors import ConfigError, ServesimError
    from sim.cost.hardware import get_gpu

    if name is None:
        return None
    try:
        return get_gpu(name).name
    except ServesimError as e:
        raise ConfigError(f"--gpu {name!r}: {e}") from None


def _named_model(name: str | None):
    """``--model``: a catalogue model (or a folder with config.json), refused by name."""
    from sim.core.errors import ConfigError, ServesimError
    from sim.cost.models import get_model

    if name is None:
        return None
    try:
        return get_model(name)
    except (ServesimError, OSError) as e:
        raise ConfigError(f"--model {name!r}: {e}") from None


def _load_base(base: str):
    """``--base``: None for 'prior' (the GPU's, once it is known), else the profile JSON, refused by flag."""
    from sim.core.errors import ConfigError, ServesimError
    from sim.cost.profiles import CalibrationProfile

    if base == "prior":
        return None
    try:
        return CalibrationProfile.load(base)
    except (ServesimError, OSError) as e:
        raise ConfigError(f"--base {base!r}: {e}; allowed: 'prior' or a profile JSON") from None


def _check_calibrate(args: argparse.Namespace) -> None:
    """The suite's flags, checked before it runs: --out a new or empty directory, --tp a degree the model's
    heads split into (1-8, as `run` takes), --iters and --max-tokens >= 1 (--max-tokens not with --smoke,
    whose shapes are fixed)."""
    from sim.cli.outpath import check_out_dir
    from sim.core.errors import ConfigError
    from sim.core.fields import check_range
    from sim.cost.hardware import get_gpu, validate_tp

    check_out_dir(args.out)
    check_not_empty(args, {"model": "a catalogue model name or a folder with config.json",
                           "gpu": "a catalogue GPU name; leave it out for the detected device"})  # fmt: skip
    model = _named_model(args.model)  # an unknown model is --model's fault, not --tp's
    _named_gpu(args.gpu)
    check_range("", "--iters", args.iters, 1, 10_000)
    check_range("", "--max-tokens", args.max_tokens, 1, 1 << 20)
    check_range("", "--tp", args.tp, 1, 8)
    if args.smoke and args.max_tokens != 16384:
        raise ConfigError(f"--max-tokens {args.max_tokens}: not with --smoke (its shapes are fixed and tiny)")
    try:  # the split `run` accepts (vLLM's: heads divide by tp; KV heads divide by tp or are replicated)
        validate_tp(get_gpu("H100 SXM"), args.tp, model)
    except ConfigError as e:
        raise ConfigError(f"--tp {args.tp}: {e}") from None


def run_calibrate(args: argparse.Namespace) -> int:
    from sim.core.errors import ServesimError
    from sim.cost.calibrate.fit import fit_profile, holdout_errors, with_metadata
    from sim.cost.calibrate.suite import SuiteConfig, measured_spec, run_suite
    from sim.cost.hardware import get_gpu
    from sim.cost.profiles import gpu_slug, prior_profile

    _check_calibrate(args)  # before minutes of timing, not after them
    out = Path(args.out)
    named = get_gpu(args.gpu) if args.gpu else None  # a GPU given by name must be in the catalogue
    cfg = SuiteConfig(model=args.model, tp=args.tp, device=args.device, smoke=args.smoke,
                      max_tokens=args.max_tokens, iters=args.iters)
    bench = run_suite(cfg, log=lambda m: print(f"  {m}", flush=True))
    bench.save(out)
    print(f"wrote {out / 'samples.csv'} ({len(bench.samples)} samples) and {out / 'meta.json'}")
    try:
        gpu = named or get_gpu(bench.gpu)
        base = prior_profile(gpu)
    except ServesimError:
        gpu = measured_spec(bench, bench.gpu)  # CPU or an unknown device: peaks = what it reached here
        base = None
    res = fit_profile(bench, gpu, base)
    gpu_profile = bool(bench.meta.get("gpu_profile"))
    desc = (f"servesim calibrate on {bench.meta.get('device_name')} ({bench.meta.get('model')}, TP {cfg.tp})"
            if gpu_profile else "CPU smoke test of the calibration suite: NOT a GPU profile, never ship it")
    res.profile = replace(res.profile, description=desc)
    keys = ("device_name", "driver_version", "torch_version", "cuda_version", "cudnn_version", "sm_count",
            "l2_cache_bytes", "capability", "attention_backend", "smoke", "host")
    extra = {"gpu_profile": gpu_profile, **{k: bench.meta.get(k) for k in keys}}
    cmd = "servesim calibrate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "servesim calibrate"
    profile = with_metadata(res, bench, command=cmd, extra=extra)
    path = out / f"{gpu_slug(gpu.name)}.json"
    profile.save(path)
    hold = holdout_errors(bench, gpu, base, frac=0.2)
    (out / "fit_report.md").write_text(
        fit_report_markdown(f"servesim calibrate: {gpu.name}", profile, res.errors, hold, res.notes))
    for r in res.errors.itertuples():
        print(f"  {r.op:18s} n={r.n:4d}  MAPE {100 * r.mape:5.1f} %")
    print(f"wrote {path} and {out / 'fit_report.md'}" + ("" if gpu_profile else "  [not a GPU profile]"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m sim.cli.calibrate fit ...``) with the same error handling as ``servesim``."""
    from sim.core.errors import run_command

    parser = argparse.ArgumentParser(prog="servesim")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
