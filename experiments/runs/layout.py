"""A run directory's layout: its config, its checkpoint steps, the names of its samples
directories, and the writing of samples (``.npz`` arrays, ``samples.json`` and a PNG: an
image grid, or a scatter plot for 2-D data).

One naming rule serves every kind of run: ``<head>_n<num_samples>_seed<seed>`` plus
``+<field>-<value>`` for every other field that changes the samples, where ``head`` says
how they were drawn (``heun_18``, ``onestep_1``, ``cfdm_T0.95_S100``). Samples of a
trained checkpoint live under ``samples/step<k>/<name>``, training-free samples under
``samples/<name>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from scorelib._io import atomic_open, atomic_savez, atomic_write_text
from scorelib.data.images import quantise


def read_config(run_dir: str | Path) -> DictConfig:
    """The ``config.yaml`` of ``run_dir``.

    Raises:
      FileNotFoundError: naming ``run_dir`` when the file is not there.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        free = training_free_samples(run_dir)
        if free is not None:
            raise FileNotFoundError(
                f"run_dir={run_dir} is a training-free run (score={free['score']}; no "
                f"config.yaml, no checkpoint): draw it again with {free['command']}"
            )
        raise FileNotFoundError(
            f"{path}: not found; run_dir must be a training run directory (written by "
            "experiments.train or experiments.distill)"
        )
    return OmegaConf.load(path)


def training_free_samples(run_dir: str | Path) -> dict | None:
    """``{"score", "command"}`` of the newest samples of a training-free run in ``run_dir``
    (``samples/<name>/samples.json`` with a ``score``, as ``experiments.sample
    experiment=cfdm_*`` or ``rdmc_*`` writes them): the score's name and the command that
    draws them again (the recorded one; for samples written before it was recorded, the
    preset named by their title). ``None`` when ``run_dir`` holds none."""
    found = []
    for meta_path in Path(run_dir).glob("samples/*/samples.json"):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("score"), dict):
            found.append((meta_path.stat().st_mtime, meta))
    if not found:
        return None
    meta = max(found, key=lambda f: f[0])[1]
    command = meta.get("command")
    if not command:
        name = str(meta.get("title") or "").split(":", 1)[0] or Path(run_dir).name
        command = f"python -m experiments.sample experiment={name} run_dir={run_dir}"
    return {"score": meta["score"].get("name", "?"), "command": command}


def saved_steps(run_dir: str | Path) -> list[int]:
    """Steps of the checkpoints in ``run_dir/checkpoints``, ascending (read from the names
    of the step directories; nothing is opened or written)."""
    ckpt = Path(run_dir) / "checkpoints"
    if not ckpt.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit())


def fmt_value(value) -> str:
    """A field value as it appears in a directory name: ``true``, ``0.1``, ``heun``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def samples_name(
    head: str,
    *,
    num_samples: int,
    seed: int,
    extras: Iterable[tuple[str, object]] = (),
    use_ema: bool = True,
) -> str:
    """``<head>_n<num_samples>_seed<seed>`` plus ``+<field>-<value>`` for each of ``extras``
    and ``+use_ema-false`` for raw parameters.

    A pure function of what the samples depend on (``batch_size`` is not: per-example
    keys), so the same sampling always finds the same directory and another never
    overwrites it.
    """
    extras = list(extras) + ([] if use_ema else [("use_ema", False)])
    base = f"{head}_n{num_samples}_seed{seed}"
    return base + "".join(f"+{k}-{fmt_value(v)}" for k, v in extras)


def samples_dir(run_dir: str | Path, name: str, step: int | None = None) -> Path:
    """``run_dir/samples/step<step>/<name>`` (``run_dir/samples/<name>`` without a step:
    training-free samples)."""
    base = Path(run_dir) / "samples"
    return base / name if step is None else base / f"step{step}" / name


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def save_samples(
    out_dir: Path,
    samples: np.ndarray,
    meta: dict,
    reference: np.ndarray | None = None,
    *,
    levels: int | None = None,
    labels: np.ndarray | None = None,
):
    """Write ``samples.npz`` (key ``samples``, and ``labels`` for conditional samples),
    ``samples.json`` (meta) and ``samples.png``.

    Args:
      out_dir: directory (created).
      samples: ``[n, *data_shape]``: images ``[n, H, W, C]`` in ``[-1, 1]`` or points ``[n, 2]``.
      meta: JSON-serialisable metadata (sampler, NFE, seed, checkpoint step ...).
      reference: optional real data drawn beside 2-D samples.
      levels: the data's grey levels (images): the PNG shows the samples clipped and
        quantised to them, as evaluation sees them; ``samples.npz`` keeps the raw values.
      labels: ``[n]`` int class of each sample (conditional samples), or ``None``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {"samples": np.asarray(samples)}
    if labels is not None:
        arrays["labels"] = np.asarray(labels, np.int32)
    atomic_savez(out_dir / "samples.npz", **arrays)
    atomic_write_text(out_dir / "samples.json", json.dumps(meta, indent=2, default=str))
    plot_samples(
        out_dir / "samples.png",
        np.asarray(samples),
        title=meta.get("title"),
        reference=reference,
        levels=levels,
    )


def count_nonfinite(samples) -> int:
    """How many of ``samples: [n, ...]`` hold a NaN or an inf."""
    return int(np.sum(~np.isfinite(np.reshape(samples, (len(samples), -1))).all(axis=1)))


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend.

    Imported on first use, not at module level: pyplot costs about 1.5 s of start-up that
    the commands which never plot (a refused config, evaluation, a table's checks) should
    not pay.
    """
    # on first use, not at module level (above)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), which must come first

    return plt


def save_figure(fig, path: Path, *, dpi: int = 120) -> None:
    """Lay out ``fig``, write it to ``path`` as a PNG atomically (never half-written) and
    close it."""
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=dpi, format="png")
    pyplot().close(fig)


def plot_samples(
    path: Path, samples: np.ndarray, *, title=None, reference=None, max_images=100, levels=None
):
    """A grid of up to ``max_images`` images ``[n, H, W, C]`` in ``[-1, 1]`` (clipped; with
    ``levels``, quantised by :func:`scorelib.data.images.quantise`), or a scatter of 2-D points
    over ``reference``."""
    plt = pyplot()
    if samples.ndim == 4:
        if levels is not None:
            samples = quantise(samples, levels)
        n = min(max_images, samples.shape[0])
        cols = int(math.ceil(math.sqrt(n)))
        rows = int(math.ceil(n / cols))
        h, w, c = samples.shape[1:]
        canvas = np.ones((rows * (h + 1) + 1, cols * (w + 1) + 1, c), np.float32)
        for i in range(n):
            r, q = divmod(i, cols)
            canvas[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + q * (w + 1) : 1 + q * (w + 1) + w] = (
                np.clip(samples[i], -1, 1) + 1
            ) / 2
        fig, ax = plt.subplots(figsize=(6, 6 * canvas.shape[0] / canvas.shape[1]))
        ax.imshow(
            canvas[..., 0] if c == 1 else canvas,
            cmap="gray" if c == 1 else None,
            interpolation="nearest",
            vmin=0,
            vmax=1,
        )
        ax.axis("off")
    else:
        pts = samples.reshape(samples.shape[0], -1)
        fig, ax = plt.subplots(figsize=(5, 5))
        if reference is not None:
            ref = np.asarray(reference).reshape(reference.shape[0], -1)
            ax.scatter(ref[:, 0], ref[:, 1], s=1, alpha=0.3, c="grey", label="data")
        ax.scatter(pts[:, 0], pts[:, 1], s=1, alpha=0.5, c="C0", label="samples")
        ax.set_aspect("equal")
        ax.legend(loc="upper right", markerscale=8)
    if title:
        ax.set_title(title)
    save_figure(fig, path)
