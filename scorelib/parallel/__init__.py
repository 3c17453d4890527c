"""Several devices and processes: the mesh, sharding, ``jax.distributed``, Slurm.

The only package of the library that reads the cluster environment. Wiring (what
``experiments.train`` does)::

    settings = process_settings()                # Slurm srun step, explicit config, or 1
    initialize(settings)                          # jax.distributed when several processes
    check_devices(settings)                       # every process and device present
    check_accelerator(gpus_per_node, allow_cpu=False)
    mesh = make_mesh()                            # all devices of all processes, axis 'data'
    state = shard(state, mesh)                    # replicated parameters and optimizer state
    step = make_train_step(..., batch_sharding=batch_sharding(mesh))
    try:
        train(state, step, ..., stop_signals=STOP_SIGNALS + preempt_signals())
    except Interrupted as e:
        requeue_after_stop(e.signum)              # time limit: requeue the Slurm job
        raise
"""

from scorelib.parallel.cluster import (
    CONNECT_TIMEOUT_S,
    ProcessSettings,
    check_accelerator,
    check_devices,
    initialize,
    preempt_signals,
    process_settings,
    requested_gpus,
    requeue_after_stop,
    slurm_job_id,
)
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
    "initialize",
    "preempt_signals",
    "process_settings",
    "requested_gpus",
    "requeue_after_stop",
    "slurm_job_id",
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
