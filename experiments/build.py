"""Build the library objects of a run from its config, validating everything up front.

Every check that can fail on a bad config runs here, before anything is compiled:
the process, objective and model constructors, the sampler's grid and options, the
data files. Errors name the config field. An option that the chosen component does
not use is refused, never dropped:

* a ``_target_`` node passes exactly its fields to its class; a field the class does not
  take is refused (``+model.foo=1``), and so is a ``_target_`` changed under a preset
  (``model._target_=`` needs ``model=custom``, which passes only what is given);
* a field that belongs to one value of a selector (a grid option, a mixture threshold)
  is ``null`` unless given, and refused with another value of the selector;
* the sampler's fields must be those of its schema (``experiments.schema``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from typing import Any

import jax
import numpy as np
from flax import nnx
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from experiments import schema
from experiments.classifier_schema import CLASSIFIER_OBJECTIVE_TARGETS
from scorelib import parallel, training
from scorelib._checks import check_choice, check_int, check_real, require
from scorelib.data import (
    get_batch,
    get_dequantised_batch,
    load_digits,
    load_mnist_subset,
    load_npz,
    toy_batch,
    toy_sample,
)
from scorelib.data.images import ImageDataset, level_spacing
from scorelib.data.noisy import check_noise_sigma, noisy_dataset
from scorelib.data.toy import TOY_NAMES, toy_classes
from scorelib.metrics import ClassifierConfig, FeatureExtractor, default_cache_dir
from scorelib.metrics.perceptual import digits_classifier_distance, lpips_vgg16
from scorelib.processes import Process
from scorelib.samplers import get_sampler, make_grid
from scorelib.scores import Labels
from scorelib.scores.guidance import FILTERS, check_interval
from scorelib.training.loop import NONFINITE_MODES

DATA_NAMES = ("digits", "mnist", "toy", "npz", "target")
GRIDS = tuple(schema.GRID_OPTIONS)
#: Seed of the noise of ``data.noise_sigma``: the noisy training set is one fixed draw, the
#: same for every ``trainer.seed`` (the noisy data are given, as in SURE-Score's setting).
NOISE_SEED = 0

#: Fields that belong to one value of a selector field of the same node:
#: ``{_target_: (selector, {field: values that use it})}``. ``null`` means "not given".
SELECTED_FIELDS = {
    "scorelib.objectives.MixedScoreMatching": (
        "kappa",
        {
            "sigma_switch": ("switch",),
            "sigma_lo": ("log_linear",),
            "sigma_hi": ("log_linear",),
            "sigma_d": ("gaussian_optimal",),
            "kappa_sigma_d": ("gaussian_optimal",),
        },
    ),
}


#: Fields of a ``_target_`` node that the builder takes itself (never passed to the class):
#: ``{group: fields}``. ``objective.label_dropout``: the train step's (:func:`label_dropout`).
BUILDER_FIELDS = {
    "objective": (
        "label_dropout",
        *(name for name, _, _ in schema.TIW_BUILDER_FIELDS),
        *(name for name, _, _ in schema.CASCADE_BUILDER_FIELDS),
    )
}
#: ``objective.metric`` of ``objective=cascade``: the metric functions it can build.
CASCADE_METRICS = ("digits_classifier", "lpips", "none")


def label_dropout(cfg: DictConfig) -> float:
    """``objective.label_dropout`` (0 when the objective has no such field): the probability in
    ``[0, 1)`` that a training example's label is the null label.

    Raises:
      ValueError: naming ``objective.label_dropout`` outside ``[0, 1)``, or > 0 without
        ``data.labels=true``.
    """
    p = cfg.objective.get("label_dropout")
    p = (
        0.0
        if p is None
        else check_real(p, "objective.label_dropout", low=0.0, high=1.0, high_open=True)
    )
    if p > 0 and not cfg.data.get("labels"):
        raise ValueError(
            "objective.label_dropout: label dropout replaces training labels by the null label; "
            f"it needs data.labels=true (a class-conditional model); got {p} with "
            "data.labels=false"
        )
    return p


@dataclasses.dataclass
class Data:
    """Training data of a run: a dataset (images) or a stream (toy), and a batch function."""

    name: str
    data_shape: tuple[int, ...]
    images: ImageDataset | None  # None for toy streams and targets
    target: Any = None  # a scorelib.data.targets target for name=target
    dequantise: bool = False  # images: batches dequantised over each grey level's bin
    num_classes: int = 0  # > 0: batches come with their class labels (data.labels=true)

    @property
    def labels(self) -> bool:
        """Whether the batches carry class labels (``data.labels=true``)."""
        return self.num_classes > 0

    def batch_fn(self, batch_size: int, seed: int, mesh=None):
        """A pure jnp function ``step -> x [batch_size, *data_shape]`` usable inside jit (the
        global batch; with a ``mesh`` the training images are replicated on it), or ``step ->
        (x, y)`` with ``y: [batch_size]`` int32 class labels when :attr:`labels`."""
        lab = self.labels
        if self.target is not None:
            return functools.partial(_target_batch, self.target, batch_size, seed, lab)
        if self.images is None:
            toy = self.name.split(":", 1)[1]
            return functools.partial(_toy_batch, toy, batch_size, seed, lab)
        place = jax.device_put if mesh is None else functools.partial(parallel.shard, mesh=mesh)
        train = place(self.images.train)
        y = place(self.images.train_labels) if lab else None
        if self.dequantise:
            delta = level_spacing(self.images.levels)
            return functools.partial(_dequantised_batch, train, y, delta, batch_size, seed)
        return functools.partial(_image_batch, train, y, batch_size, seed)

    def reference(self, n: int, seed: int = 12345) -> np.ndarray:
        """Held-out reference samples: the test split, or fresh toy or target samples."""
        if self.target is not None:
            key = jax.random.key(seed)
            return np.asarray(self.target.sample(key, n, needed_by="reference samples"))
        if self.images is None:
            return toy_sample(self.name.split(":", 1)[1], n, seed)
        return self.images.test


def _toy_batch(name, batch_size, seed, labels, step):
    return toy_batch(name, batch_size, seed=seed, step=step, labels=labels)


def _target_batch(target, batch_size, seed, labels, step):
    if labels:
        return target.batch(batch_size, seed=seed, step=step, labels=True)
    return target.batch(batch_size, seed=seed, step=step)


def _image_batch(train, labels, batch_size, seed, step):
    return get_batch(train, batch_size, seed=seed, step=step, labels=labels)


def _dequantised_batch(train, labels, delta, batch_size, seed, step):
    return get_dequantised_batch(train, batch_size, delta, seed=seed, step=step, labels=labels)


def build_data(cfg: DictConfig) -> Data:
    """Load the data named by ``cfg.data`` (ValueError/FileNotFoundError on a bad config)."""
    dc = cfg.data
    name = check_choice(dc.name, "data.name", DATA_NAMES)
    _check_own_name(dc, "data")
    labels = dc.get("labels", False)
    if not isinstance(labels, bool):
        raise ValueError(f"data.labels must be true or false; got {labels!r}")
    check_real(dc.sigma_data, "data.sigma_data", low=0.0, low_open=True, high_open=True)
    if name == "digits":
        ds = load_digits()
    elif name == "mnist":
        ds = load_mnist_subset()
    elif name == "npz":
        if not dc.get("path"):
            raise ValueError("data.path must name a .npz file for data=npz; got null")
        ds = load_npz(dc.path, key=dc.key)
    elif name == "target":
        if not dc.get("target"):
            raise ValueError("data.target must describe a target for data=target; got null")
        target = instantiate(dc.target, _convert_="all")
        target.require_samples("data=target (training batches)")
        k = 0
        if labels:
            k = int(getattr(target, "num_classes", 0) or 0)
            if k < 1:
                raise ValueError(
                    f"data.labels: the target {target.name} has no classes (a Gaussian mixture "
                    "target's component is its class); set data.labels=false"
                )
        return Data(
            f"target:{target.name}", (target.dim,), images=None, target=target, num_classes=k
        )
    else:  # toy
        check_choice(dc.toy, "data.toy", TOY_NAMES)
        k = toy_classes(dc.toy, labels) or 0
        return Data(name=f"toy:{dc.toy}", data_shape=(2,), images=None, num_classes=k)
    dequantise = bool(dc.get("dequantise", False))  # the schema admits true or false only
    if dc.get("holdout") is not None:
        ds = ds.hold_out(dc.holdout)
    if dc.get("noise_sigma") is not None:
        noise_sigma = check_noise_sigma(dc.noise_sigma)
        if dequantise:
            raise ValueError(
                "data.dequantise must be false with data.noise_sigma (noisy images are not on "
                "grey levels); got true"
            )
        ds = noisy_dataset(ds, noise_sigma, seed=NOISE_SEED)
    k = 0
    if labels:
        if ds.train_labels is None:
            raise ValueError(
                f"data.labels: the data set {name} has no class labels"
                + (f" (no 'labels' array in {dc.path})" if name == "npz" else "")
                + "; set data.labels=false"
            )
        k = int(np.max(ds.train_labels)) + 1
    return Data(
        name=name, data_shape=ds.data_shape, images=ds, dequantise=dequantise, num_classes=k
    )


def _check_own_name(node: DictConfig, group: str) -> None:
    """Refuse ``<group>.name=`` changed under a typed option (``sampler=heun sampler.name=pc``):
    the option's schema holds the fields of its own name only."""
    typ = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(typ) or "name" not in typ.__dataclass_fields__:
        return
    own = typ.__dataclass_fields__["name"].default
    if isinstance(own, str) and own != "???" and own != node.name:
        raise ValueError(
            f"{group}.name cannot change {group}={own}: choose {group}={node.name} instead; "
            f"got {group}.name={node.name!r}"
        )


# --------------------------------------------------------------------------- components


def component_kwargs(node: DictConfig, group: str) -> tuple[str, dict]:
    """``(target, kwargs)`` of a ``_target_`` config node, after the checks above.

    Args:
      node: e.g. ``cfg.model``.
      group: its config field (``'model'``), for the messages.

    Raises:
      ValueError: naming ``<group>.<field>``: a missing or unimportable ``_target_``, a
        ``_target_`` changed under a schema, a field the class does not take, a field
        given for a selector value that does not use it.
    """
    if OmegaConf.is_missing(node, "_target_"):
        raise ValueError(
            f"{group}._target_ must name your class for {group}=custom "
            f"(e.g. {group}._target_=mypackage.module.MyClass); got ???"
        )
    target = node._target_
    typ = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(typ):
        builds = typ.__dataclass_fields__["_target_"].default
        if target != builds:
            option = schema.describe_schema(typ) or group
            raise ValueError(
                f"{group}._target_: {option} builds {builds}, with its own fields; for your "
                f"own class use {group}=custom {group}._target_={target}; got {target!r}"
            )
    kwargs = OmegaConf.to_container(node, resolve=True)
    kwargs.pop("_target_")
    for key in BUILDER_FIELDS.get(group, ()):
        kwargs.pop(key, None)
    if target in SELECTED_FIELDS:
        selector, fields = SELECTED_FIELDS[target]
        value = kwargs.get(selector)
        for key, users in fields.items():
            if kwargs.get(key) is not None and value not in users:
                raise ValueError(
                    f"{group}.{key} is used only with {group}.{selector}="
                    f"{' | '.join(users)}; got {group}.{selector}={value} (remove "
                    f"{group}.{key} or set it to null)"
                )
            if kwargs.get(key) is None:
                kwargs.pop(key, None)  # not given: the class's default
    cls = _import_target(target, group)
    _check_arguments(cls, kwargs, group, target)
    return target, kwargs


def _import_target(target: str, group: str):
    """The class or function ``target`` names, through Hydra's ``get_object`` with its
    logger silenced: Hydra logs an ERROR block before raising, and the error here says the
    same in one line.

    Raises:
      ValueError: ``<group>._target_ must be an importable class or function`` with
        Hydra's reason, for a missing module or name, or a module.
    """
    log = logging.getLogger("hydra.utils")
    disabled, log.disabled = log.disabled, True
    try:
        obj = get_object(target)
    except Exception as e:  # noqa: BLE001 - Hydra raises ImportError or its own
        reason = "; ".join(line for line in str(e).splitlines()[1:] if line) or str(e)
        raise ValueError(
            f"{group}._target_ must be an importable class or function; got {target!r} ({reason})"
        ) from e
    finally:
        log.disabled = disabled
    if not callable(obj):
        raise ValueError(
            f"{group}._target_ must be an importable class or function; got {target!r}, a "
            f"{type(obj).__name__}"
        )
    return obj


def _check_arguments(cls, kwargs: dict, group: str, target: str, passed=()) -> None:
    fn = cls.__init__ if inspect.isclass(cls) else cls
    params = list(inspect.signature(fn).parameters.values())
    if inspect.isclass(cls):
        params = params[1:]  # self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in kwargs:
        if key not in names:
            takes = [n for n in names if n not in ("data_shape", "rngs", "process")]
            raise ValueError(
                f"{group}.{key} is not an argument of {target} (it takes {takes}); remove it"
                f" (~{group}.{key})"
            )


def _build(node: DictConfig, group: str, **extra):
    target, kwargs = component_kwargs(node, group)
    spec = {"_target_": target, **kwargs}
    return instantiate(spec, _convert_="all", **extra)


def build_process(cfg: DictConfig) -> Process:
    """The process of ``cfg.process`` (a ``scorelib.processes.Process``)."""
    process = _build(cfg.process, "process")
    if not isinstance(process, Process):
        raise ValueError(
            "process._target_ must build a scorelib.processes.Process; got "
            f"{type(process).__name__}"
        )
    return process


def build_model(cfg: DictConfig, data_shape: tuple[int, ...], seed: int) -> nnx.Module:
    """The network of ``cfg.model``, built as ``Class(data_shape=..., **fields, rngs=...)``."""
    # _partial_: Hydra would turn objects passed as kwargs into configs.
    target, kwargs = component_kwargs(cfg.model, "model")
    make = instantiate({"_target_": target, **kwargs}, _partial_=True, _convert_="all")
    model = make(data_shape=tuple(data_shape), rngs=nnx.Rngs(seed))
    if not isinstance(model, nnx.Module):
        raise ValueError(f"model._target_ must build a flax.nnx.Module; got {type(model).__name__}")
    return model


def build_objective(cfg: DictConfig, process, data: Data | None = None, log_ratio=None):
    """The objective of ``cfg.objective`` on ``process``, wrapped by ``cfg.penalty`` when one is
    chosen (``penalty=qc``); an objective whose builder takes ``train``
    (``objective=smoothed``) gets the training images of ``data``, one that takes
    ``sigma_n`` (``objective=sure``) their noise level ``data.noise_sigma``, one that takes
    ``log_ratio`` (``objective=tiw``) ``log_ratio`` (``experiments.runs.score.tiw_log_ratio``
    reads it from the classifier run), one that takes ``metric`` (``objective=cascade``) the
    metric function of :func:`build_metric`.

    Raises:
      ValueError: naming the field (``objective.train`` for such an objective without image
        data, ``objective.sigma_n`` for one without noisy image data,
        ``objective.classifier_run`` for one without a ratio, ``penalty.<field>``).
    """
    objective = _build_unpenalised_objective(cfg, process, data, log_ratio)
    if cfg.get("penalty") is None:
        return objective
    target, kwargs = component_kwargs(cfg.penalty, "penalty")
    return get_object(target)(objective, **kwargs)


def _build_unpenalised_objective(cfg: DictConfig, process, data: Data | None, log_ratio=None):
    if "target" in cfg.objective and "target" not in cfg.data:
        raise ValueError(
            f"objective.target: the objective {cfg.objective._target_} needs a target with a "
            f"known score, data=target; got data={cfg.data.name}"
        )
    target, kwargs = component_kwargs(cfg.objective, "objective")
    if target in CLASSIFIER_OBJECTIVE_TARGETS:
        option = CLASSIFIER_OBJECTIVE_TARGETS[target]
        raise ValueError(
            f"objective={option} trains a noise-conditional classifier, not a score model: "
            f"python -m experiments.train_classifier objective={option}; experiments.train "
            "takes a score objective (edm, dsm, tsm, mixed, smoothed, sure)"
        )
    if kwargs.get("weighting") == "fisher":
        raise ValueError(
            "objective.weighting: 'fisher' is the unit weight of a network behind the "
            "Fisher-scaled preconditioning (scorelib.nets.precond.fisher_precond), which "
            "experiments.train does not build (its networks are EDM-preconditioned); it is "
            "used by table=tsm_low_noise, or from Python with NetworkScore(sigma_fisher=...)"
        )
    make = instantiate({"_target_": target, **kwargs}, _partial_=True, _convert_="all")
    fn = get_object(target)
    params = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn).parameters
    if "log_ratio" in params:
        require(
            log_ratio is not None,
            "objective.classifier_run",
            "a two-class experiments.train_classifier run (the density ratio's classifier)",
            cfg.objective.get("classifier_run"),
        )
        return make(process=process, log_ratio=log_ratio)
    if "metric" in params:
        return make(process=process, metric=build_metric(cfg.objective, data))
    if "sigma_n" in params:
        noise = 0.0 if data is None or data.images is None else data.images.noise_sigma
        if not noise:
            raise ValueError(
                f"objective.sigma_n: {target} learns from noisy training images and takes their "
                "noise level from data.noise_sigma; set data.noise_sigma > 0 (image data); got "
                f"data={cfg.data.name}, data.noise_sigma={cfg.data.get('noise_sigma')}"
            )
        return make(process=process, sigma_n=noise)
    if "train" in params:
        if data is None or data.images is None:
            raise ValueError(
                f"objective.train: {target} regresses onto a score of the training set: it "
                "needs an image data set (data=digits | mnist | npz); got "
                f"data={cfg.data.name}"
            )
        if data.labels:
            return make(process=process, train=data.images.train, labels=data.images.train_labels)
        return make(process=process, train=data.images.train)
    return make(process=process)


def build_metric(oc: DictConfig, data: Data | None):
    """``objective=cascade``'s metric function of ``objective.metric`` (``CASCADE_METRICS``):
    the LPIPS-form distance on the bundled digits classifier's layers, LPIPS (VGG16) with its
    weights from ``objective.metric_weights``, or ``None``.

    Raises:
      ValueError: naming ``objective.metric`` (unknown; the digits classifier's on data that
        are not the 8x8 digits) or ``objective.metric_weights`` (given without
        ``metric=lpips``); ``FileNotFoundError`` for missing LPIPS weights.
    """
    name = check_choice(oc.get("metric"), "objective.metric", CASCADE_METRICS)
    weights = oc.get("metric_weights")
    if name != "lpips" and weights is not None:
        raise ValueError(
            "objective.metric_weights is used only with objective.metric=lpips; got "
            f"objective.metric={name} (remove objective.metric_weights or set it to null)"
        )
    if name == "none":
        return None
    shape = None if data is None else tuple(data.data_shape)
    if name == "lpips":
        require(
            weights is not None,
            "objective.metric_weights",
            "the LPIPS .npz (objective.metric=lpips reads its weights from it)",
            weights,
        )
        if shape is None or len(shape) != 3 or min(shape[:2]) < 16:
            raise ValueError(
                f"objective.metric: lpips (VGG16, four 2x2 poolings) needs images of at least "
                f"16 x 16 pixels; got data of shape {shape} (digits_classifier for the 8x8 "
                "digits, or none)"
            )
        return lpips_vgg16(weights)
    if shape != (8, 8, 1):
        raise ValueError(
            "objective.metric: digits_classifier reads the 8x8 digits (data=digits, or an .npz "
            f"of them); got data of shape {shape}: use objective.metric=lpips "
            "objective.metric_weights=<.npz> (images of 16 px or more) or objective.metric=none "
            "objective.metric_weight=0"
        )
    extractor = FeatureExtractor.load_or_train(ClassifierConfig(), default_cache_dir(os.environ))
    return digits_classifier_distance(extractor)


# --------------------------------------------------------------------------- sampler


@dataclasses.dataclass
class Sampling:
    """A sampler, its grid and options, validated.

    ``record`` is what the samples depend on (written to ``samples.json``): the sampler's
    name, steps, grid and the grid options given, every sampler option with its value,
    ``num_samples``, ``seed`` and ``float64`` (``batch_size`` is not: per-example keys), and
    the conditioning when there is one (``labels``, ``guidance``).

    ``labels`` is the ``sampler.labels`` value and ``guidance`` the ``sampler.guidance``
    fields given (``None`` for ``kind=none``); ``experiments.runs.conditioning`` applies
    them to the run's score source.
    """

    name: str
    fn: Any
    grid: np.ndarray
    opts: dict
    record: dict = dataclasses.field(default_factory=dict)
    labels: Any = None
    guidance: dict | None = None

    @property
    def conditional(self) -> bool:
        """Whether the samples are conditioned (``sampler.labels`` or a guidance given)."""
        return self.labels is not None or self.guidance is not None

    def __call__(self, source, key, shape, **kw):
        return self.fn(source, key, shape, grid=self.grid, **self.opts, **kw)


def build_guidance(gc) -> dict | None:
    """The ``sampler.guidance`` fields of its ``kind`` (``None`` for ``kind=none``), checked
    without the model: ``{"kind", "scale", "interval", "filter", "classifier"}`` with
    ``filter`` ``none`` unless given; ``scale`` is required.

    Raises:
      ValueError: naming ``sampler.guidance.<field>``: an unknown kind or filter, a field the
        kind does not use, a missing or non-finite scale, a bad interval, ``kind=classifier``
        without a classifier run.
    """
    if gc is None:
        return None
    given = {k: v for k, v in OmegaConf.to_container(gc, resolve=True).items() if v is not None}
    kind = check_choice(given.pop("kind", "none"), "sampler.guidance.kind", GUIDANCE_KINDS)
    for key in given:
        users = schema.GUIDANCE_FIELDS[key]
        if kind not in users:
            raise ValueError(
                f"sampler.guidance.{key} is used only with sampler.guidance.kind="
                f"{' | '.join(users)}; got sampler.guidance.kind={kind} (remove "
                f"sampler.guidance.{key})"
            )
    if kind == "none":
        return None
    if kind == "classifier" and not given.get("classifier"):
        raise ValueError(
            "sampler.guidance.classifier must name an experiments.train_classifier run "
            "directory for sampler.guidance.kind=classifier; got null"
        )
    if "scale" not in given:  # a guidance of scale 1 would silently be no guidance
        raise ValueError(
            f"sampler.guidance.scale must be given with sampler.guidance.kind={kind} (a real "
            f"number: {GUIDANCE_SCALES[kind]}); got null"
        )
    out = {"kind": kind, "scale": check_real(given["scale"], "sampler.guidance.scale")}
    if "interval" in given:
        out["interval"] = list(check_interval(given["interval"]))
    if kind == "cfg":
        out["filter"] = check_choice(
            given.get("filter", "none"), "sampler.guidance.filter", FILTERS
        )
    if kind == "classifier":
        out["classifier"] = str(given["classifier"])
    return out


GUIDANCE_KINDS = ("none", "cfg", "classifier")
#: What ``sampler.guidance.scale`` means for each kind (the error of a missing scale).
GUIDANCE_SCALES = {
    "cfg": "the lerp weight w, 1 the conditional model, 0 the unconditional, > 1 guides",
    "classifier": "s, 1 Bayes' conditional score, 0 unguided, > 1 guides",
}


def build_sampler(cfg: DictConfig, process) -> Sampling:
    """The sampler of ``cfg.sampler`` with its grid; raises ValueError naming the field."""
    sc = cfg.sampler
    name = sc.get("name")
    if name is None:
        raise ValueError(
            "sampler=run (the run's own sampler) is for experiments.sample and "
            "experiments.evaluate; choose a sampler with sampler=<name>"
        )
    get_sampler(name)  # sampler.name must be one of [...]
    options = schema.sampler_options(name)
    _check_own_name(sc, "sampler")
    allowed = {f.name for f in dataclasses.fields(schema.SamplerConfig)} | set(options)
    for key in sc:
        if key not in allowed:
            raise ValueError(
                f"sampler.{key} is not an option of sampler={name} (its options: "
                f"{sorted(options) or 'none'})"
            )
    steps = check_int(sc.steps, "sampler.steps", low=1)
    grid_name = check_choice(sc.grid, "sampler.grid", GRIDS)
    grid_opts = {k: sc[k] for k in schema.GRID_FIELDS if sc.get(k) is not None}
    unused = sorted(k for k in grid_opts if k not in schema.GRID_OPTIONS[grid_name])
    if unused:
        names = ", ".join(f"sampler.{k}" for k in unused)
        one = len(unused) == 1
        raise ValueError(
            f"{names} {'is not an option' if one else 'are not options'} of grid "
            f"{grid_name} (sampler.grid={grid_name} takes "
            f"{list(schema.GRID_OPTIONS[grid_name])}); remove {'it' if one else 'them'} "
            f"or set {'it' if one else 'them'} to null"
        )
    num_samples = check_int(sc.num_samples, "sampler.num_samples", low=1)
    check_int(sc.batch_size, "sampler.batch_size", low=1)
    seed = check_int(sc.seed, "sampler.seed", low=0)
    grid = make_grid(grid_name, steps, process, **grid_opts)
    opts = {k: sc.get(k, default) for k, (_, default) in options.items()}
    labels = sc.get("labels")
    if OmegaConf.is_config(labels):
        labels = OmegaConf.to_container(labels, resolve=True)
    guidance = build_guidance(sc.get("guidance"))
    record = {
        "name": name,
        "steps": steps,
        "grid": grid_name,
        **grid_opts,
        **opts,
        "num_samples": num_samples,
        "seed": seed,
        "float64": bool(sc.float64),
    }
    if labels is not None:
        record["labels"] = labels
    if guidance is not None:
        record["guidance"] = guidance
    opts["float64"] = bool(sc.float64)
    return Sampling(
        name=name,
        fn=get_sampler(name),
        grid=grid,
        opts=opts,
        record=record,
        labels=labels,
        guidance=guidance,
    )


#: ``sampler.labels`` values that name a rule (besides a class, a list of classes or null);
#: ``none`` is the null label (the unconditional score), e.g. over a run whose own sampler has
#: labels (``sampler=run`` reads ``null`` as "the run's value").
LABEL_RULES = ("balanced", "uniform", "none")


def build_labels(value, num_classes: int, field: str = "sampler.labels") -> Labels | None:
    """The :class:`scorelib.scores.Labels` rule of a ``sampler.labels`` config value: ``null``
    or ``none`` (no labels: the unconditional score, the null label), ``balanced`` (classes
    ``0 .. K-1`` in turn over the samples' global indices), ``uniform`` (a uniform class per
    sample from its own key), a class ``c`` (every sample), or a list of classes (sample
    ``i`` gets ``list[i % len]``).

    Raises:
      ValueError: naming ``field``: a value of another kind, a class outside
        ``[0, num_classes)``, labels asked of an unconditional model (``num_classes = 0``).
    """
    if value is None or value == "none":
        return None
    if num_classes < 1:
        raise ValueError(
            f"{field}: the model is unconditional (model.num_classes = 0): it takes no class "
            f"labels; remove {field} (got {value!r})"
        )
    if value == "balanced":
        return Labels.balanced(num_classes)
    if value == "uniform":
        return Labels.uniform(num_classes)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    values = [value] if not isinstance(value, (list, tuple)) else list(value)
    ok = bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if not ok or any(not 0 <= v < num_classes for v in values):
        raise ValueError(
            f"{field} must be null, {' | '.join(LABEL_RULES)}, a class in [0, {num_classes - 1}] "
            f"or a list of such classes; got {value!r}"
        )
    return Labels.given(values, num_classes)


def check_conditioning(cfg: DictConfig, data: Data) -> None:
    """The model's classes must be the data's: ``model.num_classes`` equals the number of
    classes of the labelled data (``data.labels=true``), 0 without labels.

    Raises:
      ValueError: naming ``model.num_classes`` or ``data.labels``.
    """
    k = cfg.model.get("num_classes")
    k = 0 if k is None else check_int(k, "model.num_classes", low=0)
    if data.labels and k != data.num_classes:
        if "num_classes" not in cfg.model:
            raise ValueError(
                f"data.labels: the model {cfg.model.get('_target_')} takes no class labels (no "
                "num_classes argument); set data.labels=false"
            )
        raise ValueError(
            f"model.num_classes must be {data.num_classes} (the classes of data={cfg.data.name}) "
            f"with data.labels=true; got {k}"
        )
    if not data.labels and k > 0:
        raise ValueError(
            f"data.labels: model.num_classes={k} is a class-conditional network, trained on "
            "labelled batches: set data.labels=true (or model.num_classes=0); got "
            "data.labels=false"
        )


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def make_ema(tc: DictConfig) -> training.EMA:
    return training.EMA(
        batch_size=tc.batch_size,
        decay=tc.ema_decay,
        halflife_nimg=tc.ema_halflife_nimg,
        rampup_ratio=tc.ema_rampup_ratio,
        warmup=bool(tc.ema_warmup),
    )


#: ``trainer.matmul_precision``: JAX's names (``jax_default_matmul_precision``) for float32
#: matmuls in full float32, in one TF32 pass and in one bfloat16 pass.
MATMUL_PRECISIONS = ("highest", "tensorfloat32", "bfloat16")
#: A run's precision unless its ``trainer.matmul_precision`` says otherwise: full float32
#: (no TF32 or bf16 passes on GPUs, which lose digits in scores and likelihoods; EDM's
#: training sets ``allow_tf32 = False`` likewise).
MATMUL_PRECISION = MATMUL_PRECISIONS[0]


def check_trainer(tc: DictConfig) -> None:
    """Raise ValueError naming the ``trainer.<field>`` out of range."""
    for field in ("steps", "batch_size", "log_every", "ckpt_every", "keep_last"):
        check_int(tc[field], f"trainer.{field}", low=1)
    check_int(tc.seed, "trainer.seed", low=0)
    check_choice(tc.nonfinite, "trainer.nonfinite", NONFINITE_MODES)
    check_choice(
        tc.get("matmul_precision", MATMUL_PRECISION), "trainer.matmul_precision", MATMUL_PRECISIONS
    )
    if tc.get("keep_every") is not None:
        check_int(tc.keep_every, "trainer.keep_every", low=1)
    if tc.get("ema_decay") is not None:
        check_real(tc.ema_decay, "trainer.ema_decay", low=0.0, high=1.0, high_open=True)
    if tc.get("ema_halflife_nimg") is not None:
        check_real(tc.ema_halflife_nimg, "trainer.ema_halflife_nimg", low=0.0, low_open=True)
    if tc.get("ema_rampup_ratio") is not None:
        check_real(tc.ema_rampup_ratio, "trainer.ema_rampup_ratio", low=0.0, low_open=True)
