"""Paper reproductions: ``python -m experiments.reproduce table=<name> [table.<field>=...]``.

The ``table`` config group (``configs/table/<name>.yaml``; required) selects the reproduction; its
``name`` field is the module ``experiments/tables/<name>.py`` whose
``run(cfg, run_dir, log=print)`` computes it (an optional ``runner: module:function``
field overrides the lookup). The app writes every table as markdown, CSV and LaTeX with
the seeds and this exact command, the figure(s), and ``metadata.json`` (resolved config,
versions, git revision, wall time) into Hydra's run directory,
``outputs/reproduce/<name>/<overrides>`` (a pure function of the command line).

Examples::

    python -m experiments.reproduce table=tsm_low_noise
    python -m experiments.reproduce table=tsm_low_noise table.scale=smoke
    python -m experiments.reproduce table=gaussian_teleport
"""

from __future__ import annotations

import importlib
import re
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.common import CONFIG_DIR, clean_errors, hydra_app
from experiments.tables.common import command_line, write_report
from scorelib._checks import require

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TABLE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "table"


def table_names() -> list[str]:
    """The reproductions on offer: the ``configs/table/<name>.yaml`` files, sorted."""
    return sorted(p.stem for p in TABLE_CONFIGS.glob("*.yaml"))


def require_table(cfg: DictConfig) -> DictConfig:
    """``cfg.table``, or a ``ValueError`` saying ``table=`` is required and listing the names."""
    table = cfg.get("table")
    if table is None:
        raise ValueError(f"table= is required; choose one of: {', '.join(table_names())}")
    return table


def check_table_fields(table: DictConfig, choice: str) -> None:
    """Refuse a field added on the command line (``+table.foo=1``) that the table's config
    file ``configs/table/<choice>.yaml`` does not have: the table would ignore it.

    Raises:
      ValueError: naming ``table.<field>`` and listing the table's fields.
    """
    path = CONFIG_DIR / "table" / f"{choice}.yaml"
    if not path.is_file():
        return
    known = set(OmegaConf.load(path)) - {"defaults"}
    extra = sorted(set(table) - known)
    if extra:
        raise ValueError(
            f"table.{extra[0]} is not a field of table={choice} (its fields: "
            f"{', '.join(sorted(known))}); the table would ignore it"
        )


def _kind(value) -> str | None:
    """``'list'``, ``'mapping'`` or ``None`` (a scalar or null) for a plain config value."""
    if isinstance(value, list | tuple):
        return "list"
    return "mapping" if isinstance(value, dict) else None


def _flow(value) -> str:
    """A config value as the command line writes it: ``[0.1, 0.5]``, ``{T: 0.95, S: 100}``."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value)


def _check_kinds(value: dict, schema: dict, where: str) -> None:
    """Refuse a field of ``value`` that is not a list where ``schema`` (the table's config
    file) has a list, or not a mapping where it has a mapping; the same inside mappings
    and for the items of a list whose every item is a list (or every item a mapping)."""
    for key, default in schema.items():
        if key not in value:
            continue
        want, got, field = _kind(default), value[key], f"{where}.{key}"
        if want is None or (want == "list" and got is None and default == []):
            continue
        example = _flow(default)
        if len(example) > 60:
            example = example[:57] + "..."
        what = "a list" if want == "list" else "a mapping"
        require(_kind(got) == want, field, f"{what} (as its default, {example})", got)
        if want == "mapping":
            _check_kinds(got, default, field)
            continue
        kinds = {_kind(item) for item in default}
        if len(kinds) == 1 and None not in kinds:
            (item_kind,) = kinds
            for i, item in enumerate(got):
                what = "list" if item_kind == "list" else "mapping"
                require(_kind(item) == item_kind, f"{field}[{i}]", f"a {what}", item)
                if item_kind == "mapping" and len(default) and isinstance(default[0], dict):
                    _check_kinds(item, default[0], f"{field}[{i}]")


def check_table_kinds(table: DictConfig, choice: str) -> None:
    """Refuse a scalar where the table's config file has a list (``table.weights=0.5`` for
    ``weights: [1.0]``), or a mapping: every table's list and mapping settings are checked
    against ``configs/table/<choice>.yaml`` before the table runs (its ``smoke`` block
    against the same fields), so a table never iterates over a number.

    Raises:
      ValueError: ``table.<field> must be a list (as its default, [1.0]); got 0.5``.
    """
    path = CONFIG_DIR / "table" / f"{choice}.yaml"
    if not path.is_file():
        return
    schema = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    schema.pop("defaults", None)
    value = OmegaConf.to_container(table, resolve=True)
    smoke = schema.pop("smoke", None)
    _check_kinds(value, schema, "table")
    if isinstance(value.get("smoke"), dict):
        _check_kinds(value["smoke"], {**schema, **(smoke or {})}, "table.smoke")
    elif "smoke" in value and value["smoke"] is not None:
        require(False, "table.smoke", "a mapping of the fields a smoke run changes", value["smoke"])


def check_smoke_overrides(table: DictConfig, choice: str) -> None:
    """Refuse, at ``table.scale=smoke``, a top-level field changed from the table's file that
    the ``smoke`` block also sets: the smoke block replaces it (``experiments.tables.common.
    scaled``), so the change would be ignored while ``metadata.json`` recorded it.

    Raises:
      ValueError: ``table.<field> is replaced by table.smoke.<field> at table.scale=smoke ...``.
    """
    path = CONFIG_DIR / "table" / f"{choice}.yaml"
    if table.get("scale") != "smoke" or not path.is_file():
        return
    smoke = table.get("smoke")
    if not OmegaConf.is_dict(smoke):
        return
    stored = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    given = OmegaConf.to_container(table, resolve=True)
    _check_replaced(given, stored, OmegaConf.to_container(smoke, resolve=True), "table")


def _check_replaced(given: dict, stored: dict, smoke: dict, field: str) -> None:
    # the smoke merge replaces leaves and lists and recurses into mappings (OmegaConf.merge)
    for key, sub in smoke.items():
        if key not in stored or key not in given:
            continue
        if isinstance(sub, dict) and isinstance(given[key], dict) and isinstance(stored[key], dict):
            _check_replaced(given[key], stored[key], sub, f"{field}.{key}")
        elif given[key] != stored[key]:
            smoke_field = field.replace("table", "table.smoke", 1)
            raise ValueError(
                f"{field}.{key} is replaced by {smoke_field}.{key} at table.scale=smoke: give "
                f"{smoke_field}.{key}=... to change a smoke run; got {field}.{key}={given[key]}"
            )


def resolve_runner(table_cfg: DictConfig):
    """The ``run`` function of a table config.

    Raises:
      ValueError: when ``table.name`` is missing or not an identifier, or the module or
        function cannot be imported (the message names the field).
    """
    runner = table_cfg.get("runner")
    name = table_cfg.get("name")
    if runner:
        mod_name, _, fn_name = str(runner).partition(":")
        fn_name = fn_name or "run"
        field = "table.runner"
    else:
        if not name or not _NAME.match(str(name)):
            raise ValueError(f"table.name must name a module of experiments/tables; got {name!r}")
        mod_name, fn_name, field = f"experiments.tables.{name}", "run", "table.name"
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            raise ValueError(f"{field}: no table module {mod_name!r}") from e
        raise
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"{field}: {mod_name} has no function {fn_name!r}")
    return fn


def check_table(cfg: DictConfig):
    """The ``run`` function of the table ``cfg`` selects, after checking its fields.

    Raises:
      ValueError: as :func:`require_table`, :func:`check_table_fields`,
        :func:`check_table_kinds`, :func:`check_smoke_overrides`, :func:`resolve_runner`.
    """
    table = require_table(cfg)
    choice = HydraConfig.get().runtime.choices.get("table")
    check_table_fields(table, choice)
    check_table_kinds(table, choice)
    check_smoke_overrides(table, choice)
    return resolve_runner(table)


@clean_errors
def reproduce(cfg: DictConfig) -> Path:
    """Run the selected table and write its report; returns the path of ``<name>.md``.

    Raises:
      ValueError: when no ``table=`` is given, or as :func:`resolve_runner`.
    """
    run = check_table(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    command = command_line()
    t0 = time.perf_counter()
    result = run(cfg.table, run_dir, log=lambda msg: print(msg, flush=True))
    wall = time.perf_counter() - t0
    path = write_report(
        run_dir, str(cfg.table.name), result, cfg.table, command=command, wall_s=wall
    )
    print(f"wrote {path} ({wall:.0f} s)", flush=True)
    return path


main = hydra_app("reproduce", check=check_table)(reproduce)


if __name__ == "__main__":
    main()
