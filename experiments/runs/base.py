"""The run lifecycle, written once for every kind of run.

A run is built from its config (every check before anything is compiled or written), has
a directory that is a pure function of the command, and draws samples that are named by
what they depend on. A *trained* run (:class:`TrainedRun`: score training, distillation)
also has an identity checked against an existing directory, an exclusive lock, a
checkpointed state it resumes bit for bit (falling back past unreadable checkpoints), a
training loop that saves and stops cleanly on a signal, and can be loaded at any saved
step. Each kind implements only what differs: :meth:`TrainedRun.build` (from its config),
its ``fingerprint`` (what a checkpoint must match), its ``step_fn`` and :meth:`Run.draw`.

* :func:`train_run`: train (or resume, or find complete) a run in its directory;
  :func:`check_run`: its checks alone (a sweep checks every job with them first);
* :meth:`TrainedRun.load` (:func:`experiments.runs.load_run`): a run directory's run and
  its state at a checkpoint;
* :meth:`TrainedRun.save_samples` / :meth:`Run.write_samples`: draw and write samples
  under ``samples/`` (:mod:`experiments.runs.layout`);
* :meth:`TrainedRun.find_samples`: the samples an ``experiments.evaluate`` command means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from omegaconf import DictConfig, OmegaConf

from experiments.build import MATMUL_PRECISION, Data
from experiments.common import write_run_info
from experiments.runs.cluster import start_devices, train_loop
from experiments.runs.evaluation import (
    eval_paths,
    evaluate_and_write,
    load_samples,
    sample_meta,
    saved_evaluation,
)
from experiments.runs.identity import check_same_run, exclusive
from experiments.runs.layout import (
    count_nonfinite,
    display_path,
    read_config,
    samples_dir,
    save_samples,
    saved_steps,
)
from scorelib import parallel, training


def configure_jax(precision: str = MATMUL_PRECISION) -> None:
    """Set the process-wide JAX options: float32 matmuls at ``precision`` (one of
    :data:`experiments.build.MATMUL_PRECISIONS`, checked by the run's config); idempotent."""
    jax.config.update("jax_default_matmul_precision", precision)


def run_precision(cfg: DictConfig) -> str:
    """The run's ``trainer.matmul_precision`` (:data:`MATMUL_PRECISION` for a run written
    before the field existed, or a config without ``trainer``)."""
    trainer = cfg.get("trainer") or {}
    return trainer.get("matmul_precision") or MATMUL_PRECISION


@dataclasses.dataclass
class Run:
    """What every run has: its config, its data and how it draws samples.

    ``sampling`` (each kind's) has ``record``: the dict ``samples.json`` stores as
    ``sampler``, what the samples depend on; :meth:`samples_name` names its directory.
    """

    cfg: DictConfig
    data: Data

    @classmethod
    def samples_name(cls, sampling, use_ema: bool = True) -> str:
        """The name of the directory of samples drawn with ``sampling``
        (:func:`experiments.runs.layout.samples_name`)."""
        raise NotImplementedError

    def draw(self, params, *, progress: bool = True) -> tuple[np.ndarray, dict]:
        """``(samples [num_samples, *data_shape], info)`` drawn with ``self.sampling`` from
        ``params`` (what the kind samples from); ``info`` holds ``nfe`` and
        ``num_nonfinite``."""
        raise NotImplementedError

    def write_samples(
        self,
        x: np.ndarray,
        meta: dict,
        run_dir: Path,
        *,
        step: int | None,
        use_ema: bool = True,
        labels: np.ndarray | None = None,
    ) -> Path:
        """Write ``x`` (and the class ``labels`` of conditional samples) and ``meta`` under
        ``samples/[step<step>/]<name>`` of ``run_dir``; returns the directory. Non-finite
        samples are kept, with a warning line."""
        out = samples_dir(run_dir, self.samples_name(self.sampling, use_ema), step)
        images = self.data.images
        ref = self.data.reference(2000) if images is None else None
        save_samples(
            out,
            x,
            meta,
            reference=ref,
            levels=None if images is None else images.levels,
            labels=labels,
        )
        bad = count_nonfinite(x)
        if bad:
            print(
                f"warning: {bad} of {len(x)} samples are not finite (their trajectories "
                "diverged); they are kept in samples.npz"
            )
        return out


@dataclasses.dataclass
class TrainedRun(Run):
    """A run with a training loop and checkpoints (:class:`experiments.runs.ScoreRun`,
    :class:`experiments.runs.DistillRun`).

    Attributes:
      process: the noise process (``scorelib.processes``) the run's scores live on.
      state: the fresh training state (a :class:`scorelib.training.TrainState`-like pytree).
      step_fn: the jitted ``step(state) -> (state, metrics)``.
      fingerprint: what a checkpoint must match to be restored into this run.
    """

    process: Any
    state: Any
    step_fn: Any
    fingerprint: dict

    # ------------------------------------------------------------------ what each kind writes

    @classmethod
    def build(cls, cfg: DictConfig, mesh=None) -> TrainedRun:
        """Build every object of the run from ``cfg``; every config error surfaces here.

        With a ``mesh`` (``scorelib.parallel.make_mesh``) the step is data-parallel.

        Raises:
          ValueError, FileNotFoundError: naming the config field.
        """
        raise NotImplementedError

    def initial_state(self):
        """The state a new run starts from (default: the fresh ``state``)."""
        return self.state

    def fingerprint_defaults(self) -> dict:
        """Dotted fingerprint key -> the value a checkpoint written before that key existed
        stands for (``Checkpointer(config_defaults=...)``; default: none)."""
        return {}

    def saved_config(self) -> DictConfig:
        """The config written to ``config.yaml`` (default: ``cfg`` resolved)."""
        return OmegaConf.create(OmegaConf.to_container(self.cfg, resolve=True))

    def announce(self) -> None:
        """Print what the user should know before training starts (default: nothing)."""

    def title(self, run_dir: Path, step: int, info: dict, use_ema: bool) -> str:
        """The title of the samples' PNG."""
        raise NotImplementedError

    def sample_params(self, state, use_ema: bool):
        """What :meth:`draw` samples from at ``state``: EMA or raw parameters."""
        raise NotImplementedError

    @classmethod
    def stored_sampler(cls, cfg: DictConfig) -> DictConfig:
        """The sampler config a loaded run draws with unless given another (default: the
        run's ``sampler`` as stored)."""
        return cfg.sampler

    @classmethod
    def sampler_config(cls, cmd: DictConfig, run_cfg: DictConfig, overrides: list[str]):
        """The sampler config of an ``experiments.sample`` / ``evaluate`` command ``cmd`` on
        a run of config ``run_cfg`` (``overrides``: the command line's).

        Raises:
          ValueError: a sampler field that does not apply to this kind of run.
        """
        raise NotImplementedError

    @classmethod
    def sampling_of(cls, cfg: DictConfig):
        """The run's ``sampling`` from its config alone, without building the run (to find
        its samples)."""
        raise NotImplementedError

    @classmethod
    def data_config(cls, run_cfg: DictConfig) -> DictConfig:
        """A config whose ``data`` and ``process`` are those the run's samples are compared
        against (default: the run's own)."""
        return run_cfg

    @classmethod
    def evaluation_source(cls, run_dir: Path, step: int | None, use_ema: bool):
        """The score source whose bits/dim the evaluation reports, or ``None``."""
        return None

    @classmethod
    def comparison_rows(cls, run_cfg: DictConfig, *, num_samples: int, seed: int) -> dict:
        """``{label: (nfe, samples)}``: other samplers' samples the evaluation of this run's
        samples shows beside them, by every metric (default: none)."""
        return {}

    # ------------------------------------------------------------------ the lifecycle

    def checkpointer(self, run_dir: Path) -> training.Checkpointer:
        """The run's :class:`scorelib.training.Checkpointer` over ``run_dir/checkpoints``."""
        tc = self.cfg.trainer
        return training.Checkpointer(
            Path(run_dir) / "checkpoints",
            save_every=tc.ckpt_every,
            keep_last=tc.keep_last,
            keep_every=tc.keep_every,
            config=self.fingerprint,
            config_defaults=self.fingerprint_defaults(),
        )

    def resume(self, ckpt: training.Checkpointer, run_dir: Path):
        """The state of the newest readable checkpoint of ``ckpt``, or ``None`` when it has
        none. A damaged checkpoint is skipped with a warning naming it and the reason, and
        the one before it is tried (:meth:`scorelib.training.Checkpointer.restore_latest`).

        Raises:
          ValueError: the restored step is past ``trainer.steps`` (naming it, and how to
            sample an earlier checkpoint), or the checkpoint does not match the run
            (:class:`scorelib.training.IncompatibleCheckpoint`, naming the fields).
          scorelib.training.CheckpointError: checkpoints exist and none is readable.
        """
        state = ckpt.restore_latest(training.abstract_state(self.state))
        if state is None:
            return None
        step, want = int(parallel.to_host(state.step)), self.cfg.trainer.steps
        if step > want:
            raise ValueError(
                f"trainer.steps must be >= {step}, the step this run has saved "
                f"({run_dir}); got {want} (to sample an earlier checkpoint: python -m "
                f"experiments.sample run_dir={run_dir} step=<one of {saved_steps(run_dir)}>)"
            )
        return state

    def restore(self, run_dir: Path, step: int | None = None):
        """The state saved at ``step`` in ``run_dir`` (default: the newest readable
        checkpoint, falling back past unreadable ones).

        Raises:
          scorelib.training.CheckpointError: the checkpoint cannot be read.
          ValueError: the checkpoint does not match the run.
        """
        ckpt = self.checkpointer(run_dir)
        try:
            abstract = training.abstract_state(self.state)
            return ckpt.restore_latest(abstract) if step is None else ckpt.restore(step, abstract)
        finally:
            ckpt.close()

    @classmethod
    def load(cls, run_dir, step: int | None = None, sampler_cfg: DictConfig | None = None):
        """``(run, state)``: the run of ``run_dir``'s ``config.yaml`` and its state at
        checkpoint ``step`` (default: the newest readable one). Sets JAX's float32 matmul
        precision to the run's ``trainer.matmul_precision``.

        Args:
          run_dir: a directory written by ``experiments.train`` or ``experiments.distill``.
          step: a checkpoint step.
          sampler_cfg: the sampler to build the run with (default: the run's own).

        Raises:
          FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``).
          ValueError: the checkpoint does not match the run's config.
        """
        configure_jax()
        run = cls.prepare(run_dir, step, sampler_cfg)
        # after prepare: a distillation's teacher, loaded there, set its own
        configure_jax(run_precision(run.cfg))
        return run, run.restore(Path(run_dir), step)

    @classmethod
    def prepare(cls, run_dir, step: int | None = None, sampler_cfg: DictConfig | None = None):
        """What :meth:`load` checks and builds before it restores the checkpoint: the run
        of ``run_dir``'s ``config.yaml`` with ``sampler_cfg``, once checkpoint ``step`` is
        known to be there (a sweep of ``experiments.sample`` checks every job with it).

        Raises:
          as :meth:`load`, but for the checkpoint's contents.
        """
        run_dir = Path(run_dir)
        cfg = read_config(run_dir)
        cfg.sampler = sampler_cfg if sampler_cfg is not None else cls.stored_sampler(cfg)
        steps = saved_steps(run_dir)
        if not steps:
            raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint to sample from")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"step={step}: no such checkpoint in {run_dir}; have {steps}")
        return cls.build(cfg)

    def save_samples(
        self, state, run_dir: Path, *, use_ema: bool = True, progress: bool = True
    ) -> Path:
        """Draw samples from ``state`` (EMA parameters unless ``use_ema=False``) with the
        run's sampling and write them under ``samples/step<k>/<name>``; returns the
        directory. ``samples.json`` records the sampler, the checkpoint step, the weights
        and the draw's info (NFE, non-finite count, wall time)."""
        step = int(parallel.to_host(state.step))
        params = self.sample_params(state, use_ema)
        if jax.device_count() > 1:  # the draw splits batches over local devices itself
            params = parallel.to_host(params)
        x, info = self.draw(params, progress=progress)
        labels = info.pop("labels", None)
        meta = {
            "sampler": self.sampling.record,
            "use_ema": use_ema,
            "checkpoint_step": step,
            **info,
            "title": self.title(Path(run_dir), step, info, use_ema),
        }
        return self.write_samples(x, meta, run_dir, step=step, use_ema=use_ema, labels=labels)

    def saved_samples(self, state, run_dir: Path, *, use_ema: bool = True) -> Path | None:
        """The directory of the samples :meth:`save_samples` would draw from ``state`` when
        they were drawn before (``samples.npz``, ``.json`` and ``.png`` there, from the same
        checkpoint step and weights; the name holds every other field they depend on), else
        ``None``."""
        step = int(parallel.to_host(state.step))
        out = samples_dir(run_dir, self.samples_name(self.sampling, use_ema), step)
        if not all((out / f).is_file() for f in ("samples.npz", "samples.json", "samples.png")):
            return None
        meta = sample_meta(out / "samples.npz")
        return (
            out if (meta.get("checkpoint_step"), meta.get("use_ema")) == (step, use_ema) else None
        )

    def evaluate_samples(self, out: Path, *, seed: int = 0) -> dict | None:
        """Evaluate the samples in ``out`` as ``experiments.evaluate`` would (2-D and target
        data: against fresh data, beside another draw of it and the prior); an evaluation of
        them with ``seed`` written after them is printed instead (``None`` returned)."""
        title = f"{self.cfg.name}: {display_path(out)}"
        saved = saved_evaluation(out / "samples.npz", seed)
        if saved is not None:
            md = display_path(eval_paths(out / "samples.npz")[1])
            print(f"\n{title}\n\n{saved}\n\nevaluation: {md} (of these samples, earlier)")
            return None
        x = load_samples(out / "samples.npz")
        prior = np.asarray(self.process.prior_sample(jax.random.key(seed), x.shape))
        return evaluate_and_write(x, self.data, out, seed=seed, prior=prior, title=title)

    @classmethod
    def find_samples(cls, cmd: DictConfig, overrides: list[str]) -> Path:
        """The ``samples.npz`` that ``experiments.sample`` writes for the same ``sampler``/
        ``step``/``use_ema`` arguments of ``cmd`` (an ``experiments.evaluate`` config).

        Raises:
          FileNotFoundError: no checkpoint, or no samples there (the message names the
            directory and the command that draws them).
        """
        run_dir = Path(cmd.run_dir)
        run_cfg = read_config(run_dir)
        steps = saved_steps(run_dir)
        if not steps:
            raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint, so no samples")
        step = steps[-1] if cmd.step is None else cmd.step
        cfg = run_cfg.copy()
        cfg.sampler = cls.sampler_config(cmd, run_cfg, overrides)
        name = cls.samples_name(cls.sampling_of(cfg), cmd.use_ema)
        path = samples_dir(run_dir, name, step) / "samples.npz"
        if not path.is_file():
            keys = override_keys(overrides)
            given = [o for o, k in zip(overrides, keys, strict=True) if selects_samples(k)]
            # the command first: a long line is shortened in its middle (common.shorten)
            raise FileNotFoundError(
                f"no samples for these arguments; draw them with python -m experiments.sample "
                f"run_dir={run_dir}{''.join(' ' + o for o in given)}, or give samples=<path> "
                f"(looked for {path})"
            )
        return path


def override_keys(overrides: list[str]) -> list[str]:
    """The field of each command-line override (``+sampler.steps=3`` -> ``sampler.steps``)."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides]


def selects_samples(key: str) -> bool:
    """Whether the override field ``key`` chooses which samples a command means."""
    return key in ("sampler", "step", "use_ema") or key.startswith("sampler.")


def run_config(run: TrainedRun, run_dir: Path) -> DictConfig:
    """The ``config.yaml`` to write for this launch: ``run.saved_config()``, with the sampler
    of the run's existing ``config.yaml`` unless ``set_default_sampler=true``: a command that
    draws with another sampler does not change which samples later ``experiments.sample``
    and ``experiments.evaluate`` commands pick by default. A run without a sampler (a
    classifier run) writes its config as it is."""
    out = run.saved_config()
    path = Path(run_dir) / "config.yaml"
    if path.is_file() and "sampler" in out and not run.cfg.get("set_default_sampler"):
        stored = read_config(run_dir).sampler
        if OmegaConf.to_container(stored) != OmegaConf.to_container(out.sampler):
            print(
                f"the run's own sampler stays the one in {path} (this command's becomes the "
                "run's own with set_default_sampler=true)",
                flush=True,
            )
            out.sampler = stored
    return out


def train_run(
    kind: type[TrainedRun],
    cfg: DictConfig,
    run_dir: Path,
    *,
    progress: bool = True,
    handle_signals: bool = True,
    tensorboard: bool = True,
    extra: dict | None = None,
):
    """Train (or resume, or find complete) the run of ``cfg`` in ``run_dir``.

    Every check runs before anything is written (the config, an existing run's identity,
    the resumed checkpoint against the run); then ``run_info.json`` and ``config.yaml``
    are written and :func:`scorelib.training.train` runs under an exclusive lock on
    ``run_dir``, saving and requeueing on a cluster's stop signals.

    JAX's float32 matmul precision is the run's ``trainer.matmul_precision`` from here on
    (the run's final sampling included).

    Several processes (``srun`` tasks, or explicit ``cluster.*`` settings) all run this:
    data-parallel over every device of every process; process 0 alone writes
    ``run_info.json``, ``config.yaml``, the logs and holds the lock, and all of them save
    the checkpoints together.

    Args:
      kind: :class:`experiments.runs.ScoreRun` or :class:`experiments.runs.DistillRun`.
      cfg: the run's composed config.
      run_dir: its directory.
      progress, handle_signals, tensorboard: as :func:`scorelib.training.train`.
      extra: more fields for ``run_info.json``.

    Returns:
      ``(run, state)``: the built run and the final state.

    Raises:
      ValueError, FileNotFoundError: naming the config field, before anything is written;
      FloatingPointError: ``non-finite loss at step N`` (``trainer.nonfinite=stop``);
      scorelib.training.Interrupted: a signal stopped training after saving a step (after
        a time-limit signal in a Slurm job, the job is requeued first).
    """
    configure_jax()
    run_dir = Path(run_dir)
    mesh = start_devices(cfg)
    run = kind.build(cfg, mesh)  # checks trainer.matmul_precision
    # after build: a distillation's teacher, loaded there, set its own
    configure_jax(run_precision(cfg))
    lead = jax.process_index() == 0
    if lead:
        run.announce()
        precision = run_precision(cfg)
        # said on GPUs and TPUs; XLA:CPU computes float32 dots in float32 whatever the setting
        if precision != MATMUL_PRECISION or jax.default_backend() != "cpu":
            print(f"float32 matmuls: {precision} (trainer.matmul_precision)", flush=True)
    check_same_run(run_dir, cfg)
    # a new run's start (init_from's checkpoint) is checked before the lock makes run_dir
    fresh = None if saved_steps(run_dir) else run.initial_state()
    with exclusive(run_dir) if lead else contextlib.nullcontext():
        ckpt = run.checkpointer(run_dir)
        try:
            # under the lock: a command that waited for it continues where the other stopped
            state = run.resume(ckpt, run_dir)
            if state is not None:
                step = int(parallel.to_host(state.step))
                if lead and step < cfg.trainer.steps:
                    print(f"resuming {run_dir} from step {step} of {cfg.trainer.steps}", flush=True)
            else:
                state = fresh if fresh is not None else run.initial_state()
            if mesh is not None:
                state = parallel.shard(state, mesh)
            if lead:
                write_run_info(
                    run_dir, run_config(run, run_dir), seed=cfg.trainer.seed, extra=extra
                )
            start, t0 = int(parallel.to_host(state.step)), time.perf_counter()
            state = train_loop(
                state,
                run.step_fn,
                num_steps=cfg.trainer.steps,
                ckpt=ckpt,
                resume=False,
                log_dir=str(run_dir) if lead else None,
                log_every=cfg.trainer.log_every,
                nonfinite=cfg.trainer.nonfinite,
                desc=cfg.name,
                progress=progress and lead,
                handle_signals=handle_signals,
                tensorboard=tensorboard,
            )
        finally:
            ckpt.close()
    done = cfg.trainer.steps - start
    if lead and done > 0:  # wall time of the loop: compilation, steps, logs, checkpoints
        wall = time.perf_counter() - t0
        per_step = 1000 * wall / done
        steps = f"{done} step" + ("s" if done != 1 else "")
        print(f"trained {steps} in {wall:.0f} s ({per_step:.1f} ms per step with compiling)")
    return run, state


def check_run(kind: type[TrainedRun], cfg: DictConfig, run_dir: Path) -> None:
    """What :func:`train_run` checks before it writes or compiles anything, without the
    devices and the checkpoint: ``kind.build(cfg)`` (every config field; it loads the data
    and initialises the networks) and that ``run_dir`` holds no run of another config.
    A sweep runs it on every job before the first starts (``hydra_app(check=)``).

    Raises:
      ValueError, FileNotFoundError: naming the config field.
    """
    kind.build(cfg)
    check_same_run(Path(run_dir), cfg)


def train_and_sample(kind: type[TrainedRun], cfg: DictConfig, run_dir: Path) -> Path:
    """What ``experiments.train`` and ``experiments.distill`` do: :func:`train_run`, then
    (process 0 alone) draw the run's samples from the EMA parameters, print where they are
    and whether they are good: the evaluation of 2-D and target samples (a second), the
    ``experiments.evaluate`` command for images. Samples this checkpoint and sampler drew
    before (a finished run's command run again, ``make demo``) are reused, and said to be.
    Returns ``run_dir``."""
    run, state = train_run(kind, cfg, run_dir)
    if jax.process_index() == 0:
        out = run.saved_samples(state, run_dir)
        if out is None:
            out = run.save_samples(state, run_dir)
            print(f"run directory: {display_path(run_dir)}\nsamples: {display_path(out)}")
        else:
            print(
                f"run directory: {display_path(run_dir)}\nsamples: {display_path(out)} (drawn "
                "earlier from this checkpoint with this sampler: reused; experiments.sample "
                "draws anew)"
            )
        if run.data.images is None:  # points: the evaluation takes a second, show it
            run.evaluate_samples(out)
        else:
            print(f"evaluate them: python -m experiments.evaluate run_dir={display_path(run_dir)}")
    return run_dir
