"""What every training entry point does on a cluster (``experiments.train``,
``experiments.distill``): join the run's processes and check its devices before any JAX
computation, and run the training loop so that a time-limit signal saves and requeues.

* :func:`start_devices`: ``cfg.cluster`` (absent: one process, no GPU required) to
  ``scorelib.parallel``: the processes (explicit ``cluster.coordinator_address``/
  ``num_processes``/``process_id``, else the ``srun`` step), the roll call and
  ``jax.distributed``, every process and device present, no CPU-only JAX when GPUs were
  asked for (unless ``cluster.allow_cpu``), the GPUs each process sees.
* :func:`train_loop`: ``scorelib.training.train`` stopping also on submitit's time-limit
  signal (USR2 inside a submitit job); after the loop saved its step on SIGUSR1 (the batch
  script's ``--signal=USR1@90``) or on submitit's signal, the Slurm job is requeued
  (``scorelib.parallel.requeue_after_stop``) and ``Interrupted`` is re-raised.
"""

from __future__ import annotations

import sys

import jax
from omegaconf import DictConfig

from scorelib import parallel, training


def start_devices(cfg: DictConfig):
    """Join the run's processes and check its devices; the data-parallel mesh over every
    device, or ``None`` on a single device. Call before any JAX computation.

    Args:
      cfg: the run's config; reads ``cfg.cluster``.

    Raises:
      ValueError: a bad ``cluster.*`` field; GPUs asked for and a CPU-only JAX (unless
        ``cluster.allow_cpu``).
      RuntimeError: a missing process or device, or fewer GPUs than
        ``cluster.gpus_per_node``.
    """
    cc = cfg.get("cluster") or {}
    settings = parallel.process_settings(
        coordinator_address=cc.get("coordinator_address"),
        num_processes=cc.get("num_processes"),
        process_id=cc.get("process_id"),
    )
    parallel.initialize(settings)
    parallel.check_devices(settings)
    gpus = cc.get("gpus_per_node", 0)
    allow_cpu = cc.get("allow_cpu", False)
    if parallel.check_accelerator(gpus, allow_cpu=allow_cpu) != "cpu":
        parallel.check_gpus(gpus, tasks_per_node=cc.get("tasks_per_node", 1))
    if jax.device_count() == 1:
        return None
    return parallel.make_mesh()


def train_loop(state, step_fn, **kwargs):
    """``scorelib.training.train(state, step_fn, **kwargs)`` with the cluster's stop
    signals (``STOP_SIGNALS`` and submitit's time-limit signal); requeues the Slurm job
    after a time-limit stop (a line on stderr says so) and re-raises.

    Raises:
      scorelib.training.Interrupted: a signal stopped the loop after saving a step.
    """
    try:
        return training.train(
            state,
            step_fn,
            stop_signals=training.STOP_SIGNALS + parallel.preempt_signals(),
            **kwargs,
        )
    except training.Interrupted as e:
        if e.signum in parallel.preempt_signals() and e.step is not None:  # submitit's signal
            print(f"saved step {e.step} on {e.signum.name}", file=sys.stderr, flush=True)
        requeued = parallel.requeue_after_stop(e.signum)
        if requeued:
            print(requeued, file=sys.stderr, flush=True)
        raise
