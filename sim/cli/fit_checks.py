"""``servesim fit``'s checks of its inputs and outputs, before anything is fitted or written: no output that
is an input, no input twice, no empty value read as the default, no field both frozen and taken from the
base, a hold-out that leaves samples to fit (sim/cli/calibrate.py runs them)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sim.cli.flags import check_not_empty


def holdout_fraction(values: list[str] | None) -> float:
    from sim.core.errors import ConfigError

    if values is None:
        return 0.0  # no hold-out
    try:
        if len(values) != 1:
            raise ValueError
        frac = float(values[0])
    except ValueError:
        raise ConfigError(f"--holdout {' '.join(values)}: without --from-run it takes one fraction of shapes "
                          "(e.g. 0.2); held-out runs go with --from-run") from None
    # 0 included: a given --holdout that would hold nothing out is refused. Above one half, a file with few
    # distinct shapes keeps none to fit (holdout_mask holds out the top FRAC of each file's shapes): at most 0.5
    # leaves every (file, operator) with two or more shapes at least one, and the fit most of the data.
    if not 0 < frac <= MAX_HOLDOUT:
        raise ConfigError(f"--holdout {values[0]}: the fraction of shapes held out must be in (0, 1) and at most "
                          f"{MAX_HOLDOUT} (above one half the fit keeps too few shapes: a file with 2 keeps none)")
    return frac


MAX_HOLDOUT = 0.5

# what each string flag of `fit` takes (argparse dest), for the message that refuses an empty value
_FIT_VALUES = {
    "gpu": "a catalogue GPU name (servesim gpus); leave it out for what the data says",
    "model": "a catalogue model name or a folder with config.json; leave it out for what the files say",
    "recipe": "a recipe slug (servesim fit --list shows the profiles; recipes: sim/cost/calibrate/recipes.py)",
    "data": "a microbenchmark folder",
    "base": "'prior' or a profile JSON",
    "freeze": "comma-separated profile fields",
    "from_base": "comma-separated profile fields",
    "profile": "a profile JSON or 'auto'; leave it out for the GPU's shipped profile",
    "out": "a file path",
    "report": "a file path",
}


def refuse_empty(args: argparse.Namespace) -> None:
    """An empty (or blank) value is refused, never read as the flag left out."""
    from sim.core.errors import ConfigError

    check_not_empty(args, _FIT_VALUES)
    for flag, values in (("input path", args.inputs), ("--from-run", args.from_run), ("--holdout", args.holdout)):
        for v in values or ():
            if not v.strip():
                raise ConfigError(f"{flag} {v!r}: an empty path; allowed: a file or folder")


def profile_fields(flag: str, text: str | None) -> frozenset[str]:
    """``--freeze`` / ``--from-base``: comma-separated fields the fit moves, each once, no empty item."""
    from sim.core.errors import ConfigError
    from sim.cost.calibrate.fit import GROUPS

    if text is None:
        return frozenset()
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise ConfigError(f"{flag} {text!r}: an empty item; allowed: comma-separated profile fields, e.g. "
                          "eta_compute,t0_gemm_s")
    fittable = [p.name for g in GROUPS for p in g.params]
    unknown = [x for x in items if x not in fittable]
    if unknown:
        raise ConfigError(f"{flag}: unknown or never fitted profile field(s) {unknown}; allowed: "
                          f"{', '.join(sorted(fittable))}")
    twice = next((x for k, x in enumerate(items) if x in items[:k]), None)
    if twice:
        raise ConfigError(f"{flag} {text!r}: {twice!r} given twice; allowed: each field once")
    return frozenset(items)


def real_path(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


def check_outputs_not_inputs(outputs: list[tuple[str, str | None]], inputs: list[tuple[str, str | Path]],
                             reads: str | None = None) -> None:
    """Each output (flag, path) a file of its own: not another output, not an input, not a file inside an input
    folder that its loader reads (``reads``: the suffix it reads there, e.g. ".csv"; None: any file), not the
    meta.json / meta.yaml the importers read beside an input (up to two folders up). Checked before anything
    is written (paths compared resolved: symlinks and ./ spellings)."""
    from sim.core.errors import ConfigError

    seen: list[tuple[str, str, Path]] = []
    for flag, value in outputs:
        if not value:
            continue
        out = real_path(value)
        for flag2, value2, out2 in seen:
            if out == out2:
                raise ConfigError(f"{flag} {value}: the same file as {flag2} {value2}; allowed: a different file")
        seen.append((flag, value, out))
        for label, src in inputs:
            try:
                real = real_path(src)
                is_dir = real.is_dir()
            except OSError:  # the loader reports an unusable input path
                continue
            folder = real if is_dir else real.parent
            read_there = reads is None or out.suffix.lower() == reads
            if out == real or (is_dir and real in out.parents and read_there):
                where = "is" if out == real else "is inside"
                raise ConfigError(f"{flag} {value}: {where} one of the inputs ({label} {src}); allowed: a path that "
                                  "is not one of the inputs")
            if out.name in ("meta.json", "meta.yaml") and out.parent in (folder, folder.parent, folder.parent.parent):
                raise ConfigError(f"{flag} {value}: is one of the inputs (the metadata read with {label} {src}); "
                                  "allowed: a path that is not one of the inputs")


def refuse_repeats(flag: str, values: list[str], ops: list[tuple[str, ...] | None] | None = None,
                   paths: list[str] | None = None) -> None:  # fmt: skip
    """The same input given twice (or a file and a folder holding it) would count its samples twice: refused.
    ``ops``: per value, the operators taken from it (inputs that share no operator do not repeat); ``paths``: per
    value, its path (default: the value)."""
    from sim.core.errors import ConfigError

    reals: list[Path | None] = []
    for v in paths if paths is not None else values:
        try:
            reals.append(real_path(v))
        except OSError:
            reals.append(None)
    for j, rj in enumerate(reals):
        for i in range(j):
            ri = reals[i]
            if ri is None or rj is None:
                continue
            if not (ri == rj or ri in rj.parents or rj in ri.parents):
                continue
            if ops is not None and ops[i] is not None and ops[j] is not None and not set(ops[i]) & set(ops[j]):
                continue
            same = "the same as" if ri == rj else ("inside" if ri in rj.parents else "holds")
            raise ConfigError(f"{flag} {values[j]}: {same} {values[i]}, given before (its data would count twice); "
                              "allowed: distinct inputs")


def refuse_with_list(args: argparse.Namespace) -> None:
    """``--list`` prints the catalogue's profiles and fits nothing: another fit flag given with it is refused."""
    from sim.core.errors import ConfigError

    given = [flag for flag, v in (("input paths", args.inputs), ("--recipe", args.recipe), ("--data", args.data),
                                  ("--gpu", args.gpu), ("--model", args.model), ("--base", args.base != "prior"),
                                  ("--freeze", args.freeze is not None), ("--from-base", args.from_base is not None),
                                  ("--out", args.out), ("--holdout", args.holdout), ("--from-run", args.from_run),
                                  ("--max-per-stage", args.max_per_stage is not None),
                                  ("--max-nfev", args.max_nfev is not None), ("--profile", args.profile),
                                  ("--set", args.overrides), ("--report", args.report), ("--json", args.json)) if v]  # fmt: skip
    if given:
        raise ConfigError(f"--list: {', '.join(given)} not used with --list (it lists the profiles and fits nothing)")
