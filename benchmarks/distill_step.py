"""One f-distill step: the ``lax.cond`` step against the branch the host's step selects.

``scorelib.distill.DistillStep`` runs the compiled student or critic branch chosen by the
training loop's step number; called without it, the same step runs as one ``lax.cond``
over both branches. On XLA:CPU convolutions inside a conditional are slow, so the two
differ for a teacher whose discriminator heads are convolutions (``model=local_digits``:
8x8 feature maps). Times the mean ms per step over ``--steps`` steps after compiling,
for each teacher run given (e.g. the main job's, ``make demo``), in one process.

    .venv/bin/python benchmarks/distill_step.py outputs/digits_edm [<other run> ...]
        [--steps 20] [--override distill.disc_width=8 ...]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
from hydra import compose, initialize_config_dir

from experiments.runs import DistillRun

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")


def ms_per_step(step, state, steps: int, host_step: bool):
    """Mean wall ms of ``steps`` steps from ``state`` (each branch compiled first)."""
    call = (lambda s, i: step(s, i)) if host_step else (lambda s, i: step(s))  # noqa: E731
    state, _ = call(state, 0)
    state, _ = call(state, 1)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for i in range(2, 2 + steps):
        state, _ = call(state, i)
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / steps * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("teachers", nargs="+", help="experiments.train run directories")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--override", nargs="*", default=[], help="extra distill overrides")
    a = ap.parse_args()
    print(f"# jax {jax.__version__}, {jax.devices()[0].platform}; load {os.getloadavg()}")
    print("| teacher | lax.cond (ms/step) | host-chosen branch (ms/step) | ratio |")
    print("|---|---|---|---|")
    with initialize_config_dir(config_dir=os.path.abspath(CONFIGS), version_base=None):
        for run in a.teachers:
            over = ["experiment=fdistill_digits", f"teacher.run_dir={run}", *a.override]
            times = []
            for host_step in (False, True):
                r = DistillRun.build(compose("distill", overrides=over))  # a fresh state each
                times.append(ms_per_step(r.step_fn, r.state, a.steps, host_step))
            print(f"| {run} | {times[0]:.1f} | {times[1]:.1f} | {times[0] / times[1]:.1f}x |")


if __name__ == "__main__":
    main()
