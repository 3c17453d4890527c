"""The shared table writer of ``python -m experiments.reproduce``.

A table is ``{"name", "caption", "columns": [str], "rows": [[cell]]}``; cells are
numbers, strings or ``None``. :func:`write_report` writes, into the run directory,

* ``<table>_<name>.md``, ``.csv`` and ``.tex`` for every table (CSV keeps full
  precision; markdown and LaTeX show 3 significant digits);
* ``<table>.md``: every table, the notes, the seeds, the exact command and the
  figure(s), in one file;
* ``metadata.json``: the resolved table config, the command, the seeds, package
  versions, the git revision, the wall time and the machine.

A ``paper`` column holds the paper's value or claim where one exists (empty
otherwise); tables add it themselves.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from experiments.common import CONFIG_DIR, git_revision, package_versions
from experiments.runs import ScoreRun, train_run
from experiments.schema import register_configs
from scorelib._checks import check_int
from scorelib._io import atomic_write_text, portable_path, portable_text

Cell = Any


# ------------------------------------------------------------------------- formatting
def fmt(v: Cell, sig: int = 3) -> str:
    """A cell as text: floats with ``sig`` significant digits, ``None`` empty."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0:
            return "0"
        if 1e-3 <= abs(v) < 1e4:
            return f"{v:.{sig}g}"
        return f"{v:.{sig - 1}e}"
    try:  # numpy scalars
        if isinstance(v, np.integer):
            return str(int(v))
        if isinstance(v, np.floating):
            return fmt(float(v), sig)
    except ImportError:  # pragma: no cover
        pass
    return str(v)


def scaled(cfg: DictConfig, base: str = "full") -> DictConfig:
    """The table config resolved, with its ``smoke`` section merged over it when
    ``table.scale=smoke`` (the scale the tests run).

    Args:
      cfg: the table config.
      base: the name of the scale its top-level fields give (``full``; ``small`` for a
        table sized for a laptop CPU).

    Raises:
      ValueError: ``table.scale`` is neither ``base`` nor ``smoke``.
    """
    tc = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    scale = tc.get("scale", base)
    if scale not in (base, "smoke"):
        raise ValueError(f"table.scale must be '{base}' or 'smoke'; got {scale!r}")
    return OmegaConf.merge(tc, tc.get("smoke") or {}) if scale == "smoke" else tc


def compose_config(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config of an entry point (``configs/<config_name>.yaml``: ``train``, ``distill``)
    composed with ``overrides``, as its command line would (the schemas registered first;
    inside the ``reproduce`` app, in its Hydra context)."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name=config_name, overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def check_digits_run(field: str, path) -> None:
    """Refuse ``<field>=<path>`` (a table's ``table.model``, ``table.teacher``) unless it is
    an ``experiments.train`` score run of the digits.

    Raises:
      FileNotFoundError: ``<field>=<path>: not an experiments.train run (no <path>/config.yaml)``.
      ValueError: ``<field>=<path>: a distillation run ...`` or ``... a run of data=<name>; the
        table needs a run of the digits ...``.
    """
    config = Path(path) / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{field}={path}: not an experiments.train run (no {config})")
    run_cfg = OmegaConf.load(config)
    if "distill" in run_cfg:
        raise ValueError(f"{field}={path}: a distillation run; the table needs a score run")
    name = OmegaConf.select(run_cfg, "data.name")
    if name != "digits":
        raise ValueError(
            f"{field}={path}: a run of data={name}; the table needs a run of the digits "
            "(python -m experiments.train experiment=digits_edm)"
        )


def given_or_trained(given, overrides: Sequence[str], out: Path, log) -> Path:
    """A table's score run: ``given`` (a run directory, checked by the caller), or, when it
    is ``None``, ``experiments.train`` with ``overrides`` trained (or resumed) into ``out``."""
    if given is not None:
        return Path(given)
    log(f"[{Path(out).name}] training {out} ({list(overrides)})")
    cfg = compose_config("train", overrides)
    train_run(ScoreRun, cfg, out, progress=False, handle_signals=False, tensorboard=False)
    return Path(out)


def run_revision(run_dir: Path) -> str:
    """The git revision a run's first launch recorded (``run_info.json``), short, with
    ``(dirty)`` for uncommitted changes; ``unknown`` without one."""
    info = Path(run_dir) / "run_info.json"
    git = {}
    if info.is_file():
        git = (json.loads(info.read_text()).get("launches") or [{}])[0].get("git") or {}
    return git.get("commit", "unknown")[:7] + (" (dirty)" if git.get("dirty") else "")


def quoted_path(path) -> str:
    """``path`` as a single-quoted Hydra override value: a table's run directory is named by
    its overrides and holds ``[``, ``]``, ``=`` and ``,``, which the override grammar would
    parse; backslashes and quotes escaped."""
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def pm(mean: float, std: float, sig: int = 3) -> str:
    """``"mean ± std"`` for tables that report a spread over seeds."""
    return f"{fmt(float(mean), sig)} ± {fmt(float(std), 2)}"


def seed_cell(rows: Sequence[dict], key: str) -> Cell:
    """``rows[i][key]`` over the seeds' rows as one cell: the value alone for one seed,
    ``"mean ± std"`` (population std) for more."""
    v = np.array([r[key] for r in rows], float)
    return float(v[0]) if v.size == 1 else pm(v.mean(), v.std())


def paired_difference(rows: Sequence[dict], base_rows: Sequence[dict], key: str) -> dict:
    """Seed-by-seed ``rows[key] - base_rows[key]`` (rows matched on ``"seed"``): ``{"mean",
    "se", "n", "diffs"}``, ``se`` the standard error of the mean (``ddof=1``; ``nan`` for one
    seed). Both runs of a seed share their seed's draws, so the paired spread is the
    honest error of the comparison.

    Raises:
      KeyError: a seed of ``rows`` has no base row.
    """
    base = {r["seed"]: r[key] for r in base_rows}
    d = np.array([r[key] - base[r["seed"]] for r in rows], float)
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else math.nan
    return {"mean": float(d.mean()), "se": se, "n": int(d.size), "diffs": d.tolist()}


def paired_cell(rows: Sequence[dict], base_rows: Sequence[dict], key: str) -> str:
    """:func:`paired_difference` as a cell: ``"+mean ± se"``, or the one difference."""
    p = paired_difference(rows, base_rows, key)
    if p["n"] == 1:
        return f"{p['mean']:+.3g}"
    return f"{p['mean']:+.3g} ± {p['se']:.2g}"


def paired_verdict(differences: Sequence[dict], lower_is_better: Sequence[bool]) -> str:
    """A verdict from :func:`paired_difference` results, one per metric: a metric *moves*
    when its two-sided paired t-test rejects at 0.05 (``|mean| > t_{0.975, n-1} se``; 4.30
    se at 3 seeds, 2.78 at 5); ``'better'`` / ``'worse'`` when every metric that moves
    moves that way, ``'mixed'`` when they disagree, ``'same'`` when none moves, ``'n/a'``
    with fewer than 2 seeds. ``lower_is_better[i]`` is the direction of metric ``i``."""
    from scipy import stats  # scipy's import is paid by the tables that report a verdict

    signs = set()
    for p, lower in zip(differences, lower_is_better, strict=True):
        if p["n"] < 2:
            return "n/a"
        if abs(p["mean"]) > stats.t.ppf(0.975, p["n"] - 1) * p["se"]:
            signs.add((p["mean"] < 0) == lower)
    if not signs:
        return "same"
    return "mixed" if len(signs) > 1 else ("better" if signs.pop() else "worse")


def relative_path(path, run_dir) -> str:
    """``path`` relative to the table's ``run_dir`` when inside it, else as
    :func:`scorelib._io.portable_path` shows it: what committed results record (no machine
    paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        return portable_path(path)


def check_seeds(seeds) -> list[int]:
    """``table.seeds`` as distinct integers >= 0, at least one.

    Raises:
      ValueError: naming ``table.seeds``.
    """
    out = [check_int(s, "table.seeds", low=0) for s in seeds]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"table.seeds must be distinct integers, at least one; got {list(seeds)}")
    return out


def _check(columns: Sequence[str], rows: Sequence[Sequence[Cell]], name: str) -> None:
    for i, r in enumerate(rows):
        if len(r) != len(columns):
            raise ValueError(
                f"table {name!r}: row {i} has {len(r)} cells for {len(columns)} columns"
            )


def to_markdown(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """A GitHub markdown table (``|`` in cells escaped)."""
    esc = lambda s: str(s).replace("|", "\\|")
    lines = [
        "| " + " | ".join(esc(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(esc(fmt(v)) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """CSV with full precision (``repr`` of floats), ``None`` empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if v is None else (repr(float(v)) if _is_float(v) else v) for v in r])
    return buf.getvalue()


def _is_float(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, float):
        return True
    try:
        return isinstance(v, np.floating)
    except ImportError:  # pragma: no cover
        return False


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "≪": r"$\ll$",
    "≈": r"$\approx$",
    "σ": r"$\sigma$",
    "κ": r"$\kappa$",
}


def tex_escape(s: str) -> str:
    """``s`` with LaTeX's special characters escaped and ``± ≪ ≈ σ κ`` as math."""
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def to_latex(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], caption: str, label: str
) -> str:
    """A ``booktabs`` table (needs ``\\usepackage{booktabs}``)."""
    spec = "l" * len(columns)
    out = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_escape(caption)}}}",
        rf"\label{{{label}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(tex_escape(c) for c in columns) + r" \\",
        r"\midrule",
    ]
    out += [" & ".join(tex_escape(fmt(v)) for v in r) + r" \\" for r in rows]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------- provenance
def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reproduces this run: ``python -m experiments.reproduce <overrides>``.

    Overrides are shell-quoted (values with spaces, ``=``, ``@`` or ``%`` survive
    copy-paste); Hydra's own ``hydra.run.dir=...`` is kept, since it names the output.
    Absolute paths are recorded as :func:`scorelib._io.portable_path` writes them: relative
    to the working directory (the repository root, where tables are run) when inside it,
    else ``<outside>/<name>`` (committed results hold no machine's paths).
    """
    argv = [portable_text(a) for a in (sys.argv[1:] if argv is None else argv)]
    return " ".join(["python", "-m", "experiments.reproduce"] + [shlex.quote(a) for a in argv])


def portable_config(value):
    """A resolved config (nested dicts and lists) with every absolute path string made
    portable (:func:`scorelib._io.portable_text`)."""
    if isinstance(value, dict):
        return {k: portable_config(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable_config(v) for v in value]
    return portable_text(value) if isinstance(value, str) else value


def metadata(cfg: DictConfig | dict, *, command: str, seeds: Sequence[int], wall_s: float) -> dict:
    """Run metadata: resolved config, command, seeds, versions, git revision, machine."""
    conf = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    conf = portable_config(conf)
    try:
        backend, devices = jax.default_backend(), [str(d) for d in jax.devices()]
    except Exception:  # pragma: no cover - metadata must never fail the run
        backend, devices = None, []
    return {
        "command": command,
        "seeds": [int(s) for s in seeds],
        "wall_s": float(wall_s),
        "config": conf,
        "versions": package_versions(),
        "git": git_revision(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "backend": backend,
        "devices": devices,
    }


# ---------------------------------------------------------------------------- writing
def write_table(
    run_dir: Path,
    stem: str,
    table: dict,
    *,
    command: str,
    seeds: Sequence[int],
) -> str:
    """Write one table as ``<stem>.md``, ``.csv``, ``.tex``; returns its markdown section.

    Raises:
      ValueError: when a row's length differs from the number of columns.
    """
    cols, rows = list(table["columns"]), [list(r) for r in table["rows"]]
    _check(cols, rows, stem)
    caption = table.get("caption", "")
    seed_text = ", ".join(str(int(s)) for s in seeds)
    md = (
        f"### {stem}\n\n{caption}\n\n{to_markdown(cols, rows)}\n"
        f"Seeds: {seed_text}. Command: `{command}`\n"
    )
    atomic_write_text(run_dir / f"{stem}.md", md)
    atomic_write_text(run_dir / f"{stem}.csv", to_csv(cols, rows))
    tex_caption = f"{caption} Seeds: {seed_text}. Command: {command}"
    atomic_write_text(run_dir / f"{stem}.tex", to_latex(cols, rows, tex_caption, f"tab:{stem}"))
    return md


def write_report(
    run_dir: Path,
    name: str,
    result: dict,
    cfg: DictConfig | dict,
    *,
    command: str,
    wall_s: float,
) -> Path:
    """Write every table of ``result`` (see the module docstring), ``<name>.md`` and
    ``metadata.json`` into ``run_dir``; returns the path of ``<name>.md``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seeds = list(result.get("seeds", []))
    sections = []
    for table in result.get("tables", []):
        stem = f"{name}_{table['name']}"
        sections.append(write_table(run_dir, stem, table, command=command, seeds=seeds))
    figures = result.get("figure") or []
    if isinstance(figures, (str, Path)):
        figures = [figures]
    figs = "".join(f"![{Path(f).stem}]({os.path.relpath(Path(f), run_dir)})\n\n" for f in figures)
    notes = "".join(f"- {n}\n" for n in result.get("notes", []))
    smoke = isinstance(cfg, (dict, DictConfig)) and cfg.get("scale") == "smoke"
    banner = (
        "**Smoke scale: a check of the pipeline. These numbers are not results.**\n\n"
        if smoke
        else ""
    )
    head = (
        f"# {name}\n\n{banner}Reproduce with:\n\n```\n{command}\n```\n\n"
        f"Seeds: {', '.join(str(int(s)) for s in seeds)}. "
        f"Wall time of this launch: {wall_s:.0f} s.\n\n"
    )
    body = (
        head
        + (f"## Notes\n\n{notes}\n" if notes else "")
        + figs
        + "## Tables\n\n"
        + "\n".join(sections)
    )
    path = run_dir / f"{name}.md"
    atomic_write_text(path, body)
    meta = metadata(cfg, command=command, seeds=seeds, wall_s=wall_s)
    atomic_write_text(run_dir / "metadata.json", json.dumps(meta, indent=2, default=str))
    return path
