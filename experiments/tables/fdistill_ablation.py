"""The ablation of the one-evaluation f-distill student on the digits:
``python -m experiments.reproduce table=fdistill_ablation`` (configs/table/fdistill_ablation.yaml).

The table of :mod:`experiments.tables.fdistill_digits` with its ablation options on: one
student per factor (``table.variants``), each sampled with and without its EMA, paired seed
by seed with the preset's student (``table.baseline``).
"""

from experiments.tables.fdistill_digits import run

__all__ = ["run"]
