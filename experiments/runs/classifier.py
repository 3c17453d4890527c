"""Classifier runs (``experiments.train_classifier``): a noise-conditional classifier
``log p_t(c | x_t)`` of labelled images, trained by cross-entropy on noised inputs
(``objective=ce``) or by DLSM against the frozen score of a score run (``objective=dlsm
score_run=<run>``), for classifier guidance (``sampler.guidance.kind=classifier
sampler.guidance.classifier=<this run>``).

What this kind adds to the lifecycle (:mod:`experiments.runs.base`: identity and lock,
resume with checkpoint fallback, the signal-aware loop): the labelled data (images and their
labels drawn with one index, :func:`scorelib.data.batch_indices`), the network
(``scorelib.nets.ClassifierMLP``, its classes the data's), DLSM's frozen score (the score
run's EMA network, its null label when class-conditional; same data and process required),
the step (``scorelib.training.classifier``), and at the end the accuracy on the test split,
clean and at :data:`EVAL_SIGMAS` (``accuracy.json``). It draws no samples: ``experiments.sample``
and ``evaluate`` refuse it, and guide a score run with it instead.

The score checkpoint a DLSM run trains against is pinned at its first launch: ``score_step``
null means the score run's newest checkpoint *then*, written into the run's ``config.yaml``
(and ``run_info.json``), so the same command resumes against the same frozen score, bit for
bit, even after the score run saved newer checkpoints.

From Python::

    from experiments.runs.classifier import load_classifier
    classifier = load_classifier("outputs/digits_classifier_ce")   # EMA parameters
    classifier.class_log_prob(x, t, labels)                       # [batch]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from experiments import build
from experiments.classifier_schema import CLASSIFIER_OBJECTIVE_TARGETS
from experiments.runs.base import TrainedRun, configure_jax, run_precision, train_run
from experiments.runs.layout import display_path, read_config, saved_steps
from experiments.runs.score import ScoreRun
from scorelib import parallel, training
from scorelib._checks import check_int, check_real
from scorelib._io import atomic_write_text
from scorelib.data import batch_indices
from scorelib.metrics import noisy_classifier_accuracy
from scorelib.nets import ClassifierMLP
from scorelib.objectives.classifier import DLSM
from scorelib.scores import NoisyClassifier
from scorelib.training.classifier import classifier_source, make_classifier_step

#: VE noise levels of the final report besides the clean data (the process's lowest level).
EVAL_SIGMAS = (0.1, 0.5, 1.0, 2.0)
#: Seed of the noise of the final report (the same draws for every classifier of a data set).
EVAL_SEED = 0


def _refuse_sampling(run_dir=None):
    where = f"run_dir={run_dir}: " if run_dir is not None else ""
    return ValueError(
        f"{where}an experiments.train_classifier run draws no samples; guide a score run with "
        "it: python -m experiments.sample run_dir=<score run> sampler.guidance.kind=classifier "
        "sampler.guidance.classifier=<this run> sampler.labels=balanced"
    )


@dataclasses.dataclass(frozen=True)
class Labelled:
    """The labelled images of a classifier run (data units, NHWC; int32 labels)."""

    train: np.ndarray
    train_labels: np.ndarray
    test: np.ndarray | None
    test_labels: np.ndarray | None
    num_classes: int


def labelled_data(cfg: DictConfig, data: build.Data) -> Labelled:
    """The training and test images of ``data`` with their labels.

    Raises:
      ValueError: naming ``data`` for data without labels (toys, targets, an ``.npz``
        without ``labels``), negative labels, or fewer than 2 classes.
    """
    ds = data.images
    if ds is None or ds.train_labels is None:
        raise ValueError(
            f"data: a classifier needs labelled images (data=digits | mnist | npz with a "
            f"'labels' array); got data={cfg.data.name}, which has no class labels"
        )
    y = np.asarray(ds.train_labels).astype(np.int64)
    ty = None if ds.test_labels is None else np.asarray(ds.test_labels).astype(np.int64)
    top = int(max(y.max(), ty.max() if ty is not None and ty.size else 0))
    if int(y.min()) < 0 or (ty is not None and ty.size and int(ty.min()) < 0):
        raise ValueError(f"data: class labels must be >= 0; got {min(y.min(), ty.min())}")
    if top < 1:
        raise ValueError(f"data: a classifier needs at least 2 classes; got {top + 1}")
    return Labelled(
        train=ds.train,
        train_labels=y.astype(np.int32),
        test=ds.test if ty is not None else None,
        test_labels=None if ty is None else ty.astype(np.int32),
        num_classes=top + 1,
    )


def build_classifier_net(cfg: DictConfig, data_shape, num_classes: int, seed: int) -> nnx.Module:
    """``ClassifierMLP(data_shape, num_classes, **cfg.classifier)`` (errors name
    ``classifier.<field>``)."""
    kwargs = OmegaConf.to_container(cfg.classifier, resolve=True)
    return ClassifierMLP(tuple(data_shape), num_classes, **kwargs, rngs=nnx.Rngs(seed))


def _objective_class(cfg: DictConfig):
    """The objective class of ``cfg.objective`` (``objective=ce | dlsm``)."""
    target, kwargs = build.component_kwargs(cfg.objective, "objective")
    if target not in CLASSIFIER_OBJECTIVE_TARGETS:
        raise ValueError(
            f"objective must be ce or dlsm for experiments.train_classifier (a classifier "
            f"objective); got objective._target_={target} (a score objective: experiments.train)"
        )
    return get_object(target), kwargs


def _check_score_fields(cfg: DictConfig, dlsm: bool) -> None:
    if not dlsm:
        for key in ("score_run", "score_step"):
            if cfg.get(key) is not None:
                raise ValueError(
                    f"{key} is used only with objective=dlsm (its frozen score); got {key}="
                    f"{cfg.get(key)} with objective=ce (remove it)"
                )
        return
    if not cfg.get("score_run"):
        raise ValueError(
            "score_run must be an experiments.train run directory with objective=dlsm (its EMA "
            "score is DLSM's frozen score; same data and process); got null"
        )
    if cfg.get("score_step") is not None:
        check_int(cfg.score_step, "score_step", low=0)


def score_record(cfg: DictConfig) -> dict | None:
    """``{"score_run", "score_step"}``: the score run (absolute path) and the checkpoint step a
    DLSM run trains against (``score_step``, else the score run's newest); ``None`` for
    ``objective=ce``. Reads only directory names.

    Raises:
      ValueError, FileNotFoundError: naming ``score_run`` or ``score_step``.
    """
    dlsm = _objective_class(cfg)[0] is DLSM
    _check_score_fields(cfg, dlsm)
    if not dlsm:
        return None
    run_dir = Path(cfg.score_run)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(
            f"score_run={run_dir}: no config.yaml; it must be an experiments.train run directory"
        )
    steps = saved_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"score_run={run_dir}: no checkpoint in {run_dir / 'checkpoints'}")
    step = cfg.get("score_step")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"score_step={step}: no such checkpoint in {run_dir}; have {steps}")
    return {"score_run": str(run_dir.resolve()), "score_step": steps[-1] if step is None else step}


def _load_score(cfg: DictConfig, record: dict, process, data: build.Data):
    """The score run's EMA score source (DLSM's frozen score), after checking that it is a
    score run of the classifier's data and process.

    Raises:
      ValueError: naming ``score_run``: another kind of run, other data, another process.
    """
    run_dir = Path(cfg.score_run)
    run_cfg = read_config(run_dir)
    if "distill" in run_cfg or "classifier" in run_cfg:
        kind = "experiments.distill" if "distill" in run_cfg else "experiments.train_classifier"
        raise ValueError(
            f"score_run={run_dir}: an {kind} run; DLSM's frozen score must be an "
            "experiments.train run"
        )
    theirs = OmegaConf.to_container(run_cfg.data, resolve=True)
    ours = OmegaConf.to_container(cfg.data, resolve=True)
    same = theirs.get("name") == ours.get("name") and theirs.get("path") == ours.get("path")
    if not same:
        raise ValueError(
            f"score_run={run_dir}: a score run of data={theirs.get('name')}; this classifier's "
            f"data is data={ours.get('name')} (DLSM needs the score of the classifier's data)"
        )
    their_process = build.build_process(run_cfg)
    if their_process != process:
        raise ValueError(
            f"score_run={run_dir}: a score run on the process {their_process!r}; this "
            f"classifier's is {process!r} (give the run's process=...)"
        )
    run, state = ScoreRun.load(run_dir, step=record["score_step"])
    if tuple(run.data.data_shape) != tuple(data.data_shape):
        raise ValueError(
            f"score_run={run_dir}: examples of shape {list(run.data.data_shape)}; this "
            f"classifier's are {list(data.data_shape)}"
        )
    source = run.source(state.ema_params)
    if source.num_classes > 0 and not getattr(run, "null_trained", True):
        raise ValueError(
            f"score_run={run_dir}: a class-conditional run whose null label was not trained "
            "(objective.label_dropout = 0): its unconditional score, DLSM's frozen score, is "
            "untrained; use a run trained with label dropout or an unconditional one"
        )
    return source


@dataclasses.dataclass
class ClassifierRun(TrainedRun):
    """Everything a classifier run is made of, built and validated from its config.

    ``run.classifier(params)`` is the :class:`scorelib.scores.NoisyClassifier` of
    ``params`` (e.g. the EMA parameters); ``run.labelled`` the labelled images;
    ``run.objective`` the objective (``None`` for a run loaded to be used, not trained);
    ``run.score`` DLSM's record of its frozen score (``None`` for ``objective=ce``).
    """

    graphdef: Any
    labelled: Labelled
    objective: Any = None
    score: dict | None = None

    @property
    def sigma_data(self) -> float:
        return float(self.cfg.data.sigma_data)

    def classifier(self, params) -> NoisyClassifier:
        """The classifier of the network with ``params``."""
        return NoisyClassifier(
            process=self.process, graphdef=self.graphdef, params=params, sigma_data=self.sigma_data
        )

    @classmethod
    def build(cls, cfg: DictConfig, mesh=None) -> ClassifierRun:
        """Build every object of the run (DLSM's frozen score included); every config error
        surfaces here, before compiling.

        Raises:
          ValueError, FileNotFoundError: naming the config field.
        """
        return cls._make(cfg, mesh, train=True)

    @classmethod
    def _make(cls, cfg: DictConfig, mesh, *, train: bool) -> ClassifierRun:
        tc = cfg.trainer
        build.check_trainer(tc)
        if mesh is not None:
            parallel.check_batch_size(tc.batch_size, mesh)
        check_real(cfg.data.sigma_data, "data.sigma_data", low=0.0, low_open=True, high_open=True)
        objective_cls, kwargs = _objective_class(cfg)
        process = build.build_process(cfg)
        data = build.build_data(cfg)
        labelled = labelled_data(cfg, data)
        net = build_classifier_net(cfg, data.data_shape, labelled.num_classes, tc.seed)
        graphdef, params = nnx.split(net, nnx.Param)
        oc = cfg.optim
        optimizer = training.make_optimizer(
            oc.lr, oc.warmup_steps, oc.grad_clip, oc.b1, oc.b2, oc.eps
        )
        state = training.create_state(params, optimizer, tc.seed)
        fingerprint = {
            "classifier": build.to_container(cfg.classifier),
            "num_classes": labelled.num_classes,
            "data_shape": list(data.data_shape),
        }
        run = cls(
            cfg=cfg,
            data=data,
            process=process,
            state=state,
            step_fn=None,
            fingerprint=fingerprint,
            graphdef=graphdef,
            labelled=labelled,
        )
        if not train:
            return run
        record = score_record(cfg)
        if objective_cls is DLSM:
            score = _load_score(cfg, record, process, data)
            configure_jax(run_precision(cfg))  # the score run's load set its own
            objective = objective_cls(process=process, score=score, **kwargs)
        else:
            objective = objective_cls(process=process, **kwargs)
        if mesh is not None:
            state, objective = parallel.shard(state, mesh), parallel.shard(objective, mesh)
        step_fn = make_classifier_step(
            objective,
            classifier_source(run.classifier(params)),
            optimizer,
            build.make_ema(tc),
            _labelled_batches(data, labelled, tc.batch_size, tc.seed, mesh),
            lr_schedule=training.warmup_schedule(oc.lr, oc.warmup_steps),
            batch_sharding=None if mesh is None else parallel.batch_sharding(mesh),
        )
        return dataclasses.replace(
            run, state=state, step_fn=step_fn, objective=objective, score=record
        )

    @classmethod
    def prepare(cls, run_dir, step: int | None = None, sampler_cfg: DictConfig | None = None):
        """The run of ``run_dir``'s ``config.yaml``, built to be used (no objective, no step,
        DLSM's score not loaded), once checkpoint ``step`` is known to be there.

        Raises:
          FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``).
          ValueError: ``run_dir`` is not a classifier run; a sampler given.
        """
        if sampler_cfg is not None:
            raise _refuse_sampling(run_dir)
        run_dir = Path(run_dir)
        cfg = read_config(run_dir)
        if "classifier" not in cfg or "objective" not in cfg:
            raise ValueError(
                f"run_dir={run_dir}: not an experiments.train_classifier run (its config has no "
                "classifier)"
            )
        steps = saved_steps(run_dir)
        if not steps:
            raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoint of the classifier")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"step={step}: no such checkpoint in {run_dir}; have {steps}")
        return cls._make(cfg, None, train=False)

    def announce(self) -> None:
        c = self.cfg.classifier
        what = (
            f"classifier: ClassifierMLP {c.width}x{c.depth} on {list(self.data.data_shape)}, "
            f"{self.labelled.num_classes} classes, {len(self.labelled.train)} training images"
        )
        if self.score is not None:
            what += (
                f"; DLSM against the EMA score of {display_path(Path(self.score['score_run']))} "
                f"at step {self.score['score_step']}"
            )
        print(what, flush=True)

    def sample_params(self, state, use_ema: bool):
        return state.ema_params if use_ema else state.params

    def evaluate(self, state, run_dir: Path, *, use_ema: bool = True) -> dict:
        """The accuracy on the test split (the training split when the data have no test
        labels), clean (the process's lowest noise level) and at :data:`EVAL_SIGMAS`; written
        to ``accuracy.json`` and printed. Returns the record."""
        lab = self.labelled
        x, y, split = lab.test, lab.test_labels, "test"
        if x is None:
            x, y, split = lab.train, lab.train_labels, "training"
        clean = float(self.process.ve_sigma(self.process.t_min))
        sigmas = (clean, *EVAL_SIGMAS)
        params = parallel.to_host(self.sample_params(state, use_ema))
        key = jax.random.key(EVAL_SEED)
        acc = noisy_classifier_accuracy(self.classifier(params), x, y, sigmas, key)
        record = {
            "step": int(parallel.to_host(state.step)),
            "split": split,
            "num_examples": int(len(y)),
            "use_ema": use_ema,
            "clean_sigma": clean,
            "sigma": [float(s) for s in sigmas],
            "accuracy": [float(a) for a in acc["accuracy"]],
            "stderr": [float(s) for s in acc["stderr"]],
        }
        atomic_write_text(Path(run_dir) / "accuracy.json", json.dumps(record, indent=2))
        levels = ", ".join(
            f"sigma {s:g}: {a:.3f}"
            for s, a in zip(EVAL_SIGMAS, record["accuracy"][1:], strict=True)
        )
        print(
            f"accuracy on the {len(y)} {split} images: clean {record['accuracy'][0]:.3f}, {levels}",
            flush=True,
        )
        return record

    # ------------------------------------------------------------------ no samples

    @classmethod
    def stored_sampler(cls, cfg: DictConfig) -> DictConfig:
        raise _refuse_sampling()

    @classmethod
    def sampler_config(cls, cmd: DictConfig, run_cfg: DictConfig, overrides: list[str]):
        raise _refuse_sampling(cmd.get("run_dir"))

    @classmethod
    def sampling_of(cls, cfg: DictConfig):
        raise _refuse_sampling()

    @classmethod
    def samples_name(cls, sampling, use_ema: bool = True) -> str:
        raise _refuse_sampling()


def _labelled_batches(data: build.Data, labelled: Labelled, batch_size: int, seed: int, mesh):
    """``step -> (x [B, ...], labels [B])``: the run data's own batch (dequantised or noisy as
    configured) and the labels of its rows, drawn with the same index
    (:func:`scorelib.data.batch_indices` of ``(seed, step)``)."""
    rows = data.batch_fn(batch_size, seed, mesh)
    labels = jnp.asarray(labelled.train_labels)
    n = labels.shape[0]

    def batch_fn(step):
        out = rows(step)
        if isinstance(out, tuple):  # data.labels=true: the batch holds its labels already
            return out
        return out, jnp.take(labels, batch_indices(n, batch_size, seed=seed, step=step))

    return batch_fn


def load_classifier(run_dir: str | Path, step: int | None = None) -> NoisyClassifier:
    """The noise-conditional classifier of an ``experiments.train_classifier`` run: its EMA
    parameters at checkpoint ``step`` (default: the newest readable one).

    Raises:
      FileNotFoundError: no ``config.yaml`` or no checkpoint (at ``step``).
      ValueError: ``run_dir`` is not a classifier run, or the checkpoint does not match it.
    """
    run, state = ClassifierRun.load(run_dir, step=step)
    return run.classifier(jax.device_get(state.ema_params))


def pin_score_step(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """``cfg`` with a DLSM run's ``score_step`` pinned when it is null: the step in the run's
    own ``config.yaml`` (a run that exists, for the same ``score_run``), else the score run's
    newest checkpoint now (module docstring). ``cfg`` as it is otherwise."""
    if _objective_class(cfg)[0] is not DLSM or cfg.get("score_step") is not None:
        return cfg
    if not cfg.get("score_run"):
        return cfg  # refused by score_record, naming score_run
    stored = Path(run_dir) / "config.yaml"
    step = None
    if stored.is_file():
        old = read_config(run_dir)
        if old.get("score_run") == cfg.score_run:
            step = old.get("score_step")
    if step is None:
        steps = saved_steps(cfg.score_run)
        step = steps[-1] if steps else None
    out = cfg.copy()
    out.score_step = step
    return out


def train_and_evaluate(cfg: DictConfig, run_dir: Path) -> Path:
    """What ``experiments.train_classifier`` does: train (or resume, or find complete) the
    classifier run of ``cfg`` in ``run_dir`` (:func:`experiments.runs.train_run`), its DLSM
    score step pinned (:func:`pin_score_step`), then report its accuracy
    (:meth:`ClassifierRun.evaluate`) and how to guide with it. Returns ``run_dir``."""
    cfg = pin_score_step(cfg, run_dir)
    record = score_record(cfg)
    run, state = train_run(ClassifierRun, cfg, run_dir, extra=record)
    if jax.process_index() == 0:
        run.evaluate(state, run_dir)
        shown = display_path(run_dir)
        print(
            f"run directory: {shown}\nguide a score run with it: python -m experiments.sample "
            f"run_dir=<score run> sampler.guidance.kind=classifier "
            f"sampler.guidance.classifier={shown} sampler.labels=balanced"
        )
    return run_dir
