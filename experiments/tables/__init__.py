"""Paper reproductions run by ``python -m experiments.reproduce table=<name>``.

Each module ``experiments/tables/<name>.py`` (selected by ``configs/table/<name>.yaml``,
whose ``name`` field is the module name) provides::

    run(cfg: DictConfig, run_dir: Path, log=print) -> dict

which runs the library (``scorelib.training``, ``scorelib.metrics``, ``scorelib.samplers``;
a table computes no estimator itself), writes what it computed into ``run_dir`` and
returns ``{"tables": [{"name", "caption", "columns", "rows"}], "notes": [str], "seeds":
[int], "figure": path or list of paths}``. The app (:mod:`experiments.reproduce`) writes
every table as markdown, CSV and LaTeX with the seeds and the exact command, and the run
metadata, with :mod:`experiments.tables.common`. docs/tables.md ("Adding a table") has the steps.
"""
