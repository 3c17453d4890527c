"""Inverse problems with a trained score as the prior:
``python -m experiments.reconstruct run_dir=<run> task=<operator> [task.<field>=...]
[method.names=[...]] [method.zeta=...] [sampler=<name>]``.

Measures ``task.num_images`` held-out clean examples (the run's test split; exact samples of
flat data) as ``y = A x0 + sigma_y n`` (``task.sigma_y`` in data units, images in
``[-1, 1]``; ``task.seed`` draws the noise and any random mask or projection), or reads
``task.measurements=<path.npz>`` (``y``: ``[num_images, m]``; ``x0`` optional), then draws
``task.draws`` posterior samples per measurement with each of ``method.names`` in turn
(``scorelib.scores.measured``: ``projection``, ``dps`` with ``method.zeta``, ``pigdm`` with
``method.sigma_data``, the run's ``data.sigma_data`` by default, and ``ddrm``), on the run's
own sampler and grid (``sampler=run``, as ``experiments.sample`` resolves it) or any
registered ``sampler=<name>``; DDRM is its own sampler (``scorelib.samplers.ddrm``) on the
same grid, with ``method.eta``/``method.eta_b``.

Tasks (``configs/task/``; ``task=inpaint_random`` unless given): ``denoise``,
``inpaint_box`` (``task.box``), ``inpaint_random`` (``task.keep``), ``downsample``
(``task.factor``), ``blur`` (``task.std``, ``task.size``), ``cs`` (``task.m``), ``colourise``
(RGB only), ``sensors`` (a ``task.factor`` downsampled image with noise ``task.sigma_y``
and a fraction ``task.keep`` of random pixels with noise ``task.sigma_y_points``). Flat
data (toys, targets): ``denoise``, ``inpaint_random``, ``cs``.

Writes, under ``<run_dir>/reconstructions/step<k>/<name>`` (``name``: the task, its
parameters, the methods, the sampler and the seeds, so no reconstruction overwrites
another): ``measurements.npz`` (``y``, ``x0``, ``sigma_y``, the operator's description,
the shown ``A^+ y``, the mask of an inpainting), ``reconstructions_<method>.npz``
(``reconstructions`` ``[num_images, draws, *data_shape]``, ``mean``, ``std``),
``metrics.json`` and ``metrics.md`` (per method, mean ± std over the examples: PSNR and SSIM
of the posterior mean and of single draws, the coverage of the draws' central 90% interval
beside what calibrated draws give, the mean posterior std, the data consistency
``||A x - y|| / sqrt(m)`` beside the truth's own, NFE and wall time), ``figure.png`` (truth,
``A^+ y``, each method's first draw, mean and std map), ``config.yaml`` and
``run_info.json``; prints the table. Bad input (a field out of range, a measurement file
of the wrong shape, an option no chosen method uses, ddrm without an SVD, a directory that
is not a score run) is refused in one line naming the field, exit status 2, before anything
is computed or written.

Examples::

    python -m experiments.reconstruct run_dir=outputs/digits_edm task=inpaint_random
    python -m experiments.reconstruct run_dir=outputs/digits_edm task=inpaint_box \\
        method.names=[projection,dps,pigdm,ddrm] method.zeta=1
    python -m experiments.reconstruct run_dir=outputs/digits_edm task=sensors task.keep=0.2
    python -m experiments.reconstruct run_dir=outputs/digits_edm task=cs task.m=32 \\
        task.sigma_y=0.01 sampler=dpmpp_2m sampler.steps=30
    python -m experiments.reconstruct run_dir=outputs/toy_dsm task=denoise task.sigma_y=0.5
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.common import clean_errors, hydra_app
from experiments.runs import configure_jax
from experiments.runs.reconstruction import plan, reconstruct
from experiments.schema import register_configs

register_configs()


@clean_errors
def run_reconstruction(cfg: DictConfig) -> Path:
    return reconstruct(cfg, list(HydraConfig.get().overrides.task))


def check_reconstruction(cfg: DictConfig) -> None:  # a sweep's check of each job
    configure_jax()
    plan(cfg, list(HydraConfig.get().overrides.task))


main = hydra_app("reconstruct", check=check_reconstruction)(run_reconstruction)


if __name__ == "__main__":
    main()
