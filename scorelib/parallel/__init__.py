"""Several devices and processes: the mesh, sharding, ``jax.distributed``, Slurm.

The only package of the library that reads the cluster environment. Wiring (what
``experiments.cluster_run`` does for ``experiments.train`` and ``experiments.distill``)::

    settings = process_settings()                # Slurm srun step, explicit config, or 1
    initialize(settings)                          # roll call, then jax.distributed
    check_devices(settings)                       # every process and device present
    check_accelerator(gpus_per_node, allow_cpu=False)
    check_gpus(gpus_per_node, tasks_per_node=...)  # this process sees the GPUs asked for
    mesh = make_mesh()                            # all devices of all processes, axis 'data'
    state = shard(state, mesh)                    # replicated parameters and optimizer state
    step = make_train_step(..., batch_sharding=batch_sharding(mesh))
    try:
        train(state, step, ..., stop_signals=STOP_SIGNALS + preempt_signals())
    except Interrupted as e:
        requeue_after_stop(e.signum)              # time limit: requeue the Slurm job
        raise

``scorelib.parallel.local``: free ports and forced-CPU-device environments for local
multi-process or multi-device runs (tests, benchmarks).
"""

from scorelib.parallel.cluster import (
    CONNECT_TIMEOUT_S,
    ProcessSettings,
    check_accelerator,
    check_devices,
    check_gpus,
    initialize,
    preempt_signals,
    process_settings,
    requested_gpus,
    requeue_after_stop,
    roll_call,
    slurm_job_id,
)
from scorelib.parallel.local import forced_devices_env, free_ports
from scorelib.parallel.mesh import (
    DATA_AXIS,
    REPLICATE_ALL,
    batch_sharding,
    check_batch_size,
    leaf_shardings,
    make_mesh,
    replicated,
    shard,
    to_host,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "ProcessSettings",
    "check_accelerator",
    "check_devices",
    "check_gpus",
    "initialize",
    "preempt_signals",
    "process_settings",
    "requested_gpus",
    "requeue_after_stop",
    "roll_call",
    "slurm_job_id",
    "forced_devices_env",
    "free_ports",
    "DATA_AXIS",
    "REPLICATE_ALL",
    "batch_sharding",
    "check_batch_size",
    "leaf_shardings",
    "make_mesh",
    "replicated",
    "shard",
    "to_host",
]
