"""Writing samples: ``.npz`` arrays and a PNG (an image grid, or a scatter plot for 2-D data)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

# Sampler fields that do not change the samples (per-example keys: any batch size).
_NOT_IN_IDENTITY = ("batch_size",)


def samples_dir(out_root: Path, sampler: dict) -> Path:
    """Where samples drawn with the sampler config ``sampler`` go, never over other samples.

    ``<name>_<steps>_seed<seed>`` unless that directory holds samples of a different
    sampler config (another ``snr``, ``num_samples``, ...); then the name gets
    ``_<8 hex digits>``, a hash of the config, so the same command always finds the
    same directory and a different one never overwrites it.
    """
    ident = {k: v for k, v in sampler.items() if k not in _NOT_IN_IDENTITY}
    base = out_root / f"{sampler['name']}_{sampler['steps']}_seed{sampler['seed']}"
    meta = base / "samples.json"
    if not meta.is_file():
        return base
    old = json.loads(meta.read_text()).get("sampler", {})
    if {k: v for k, v in old.items() if k not in _NOT_IN_IDENTITY} == ident:
        return base
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    return base.with_name(f"{base.name}_{digest[:8]}")


def save_samples(
    out_dir: Path, samples: np.ndarray, meta: dict, reference: np.ndarray | None = None
):
    """Write ``samples.npz`` (key ``samples``), ``samples.json`` (meta) and ``samples.png``.

    Args:
      out_dir: directory (created).
      samples: ``[n, *data_shape]``: images ``[n, H, W, C]`` in ``[-1, 1]`` or points ``[n, 2]``.
      meta: JSON-serialisable metadata (sampler, NFE, seed, checkpoint step ...).
      reference: optional real data drawn beside 2-D samples.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "samples.tmp.npz"
    np.savez(tmp, samples=np.asarray(samples))
    os.replace(tmp, out_dir / "samples.npz")
    (out_dir / "samples.json").write_text(json.dumps(meta, indent=2, default=str))
    plot_samples(
        out_dir / "samples.png", np.asarray(samples), title=meta.get("title"), reference=reference
    )


def plot_samples(path: Path, samples: np.ndarray, *, title=None, reference=None, max_images=100):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if samples.ndim == 4:
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
