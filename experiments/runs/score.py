"""Score training runs (``experiments.train``): an EDM-preconditioned network trained with
an objective on a process, sampled with any registered sampler.

What this kind adds to the lifecycle (:mod:`experiments.runs.base`): building the
process, data, objective, network, optimizer and sampler from the config; the
fingerprint a checkpoint must match (the model config and the data shape);
``init_from`` (start from another run's EMA weights); the run's own sampler (what
``experiments.sample`` draws with unless told otherwise).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
from omegaconf import DictConfig, OmegaConf

from experiments import schema
from experiments.build import (
    Sampling,
    build_data,
    build_model,
    build_objective,
    build_process,
    build_sampler,
    check_conditioning,
    check_trainer,
    label_dropout,
    make_ema,
    to_container,
)
from experiments.runs.base import TrainedRun, override_keys
from experiments.runs.conditioning import conditioned_source, sample_labels
from experiments.runs.layout import display_path, samples_name, saved_steps
from scorelib import parallel, training
from scorelib._checks import check_real
from scorelib.nets import Cascade
from scorelib.objectives import CascadeLoss, ClassifierLogRatio
from scorelib.samplers import draw_samples, get_sampler


def model_fingerprint(cfg: DictConfig, data_shape) -> dict:
    """What must match between a checkpoint and the model it is restored into."""
    return {"model": to_container(cfg.model), "data_shape": list(data_shape)}


def model_fingerprint_defaults(cfg: DictConfig) -> dict:
    """``{"model.<field>": default}`` of the model's schema: a field that a checkpoint's
    fingerprint lacks (written before the field existed) is the same model while it holds
    the library's default."""
    typ = OmegaConf.get_type(cfg.model)
    if not dataclasses.is_dataclass(typ):
        return {}
    defaults = OmegaConf.to_container(OmegaConf.structured(typ))
    return {f"model.{k}": v for k, v in defaults.items() if v != "???"}


def parse_init_from(value: str) -> tuple[Path, int | None]:
    """``'<run_dir>'`` or ``'<run_dir>@<step>'`` -> ``(run_dir, step or None)``."""
    head, sep, tail = str(value).rpartition("@")
    if sep and tail.isdigit():
        return Path(head), int(tail)
    return Path(value), None


def sampler_name_parts(record: dict) -> tuple[str, list[tuple[str, object]]]:
    """``(head, extras)`` of the samples name of a registered sampler's ``record``
    (:attr:`experiments.build.Sampling.record`): ``<name>_<steps>``, and the grid when it is
    not the sampler's default grid, each grid option given, each sampler option that differs
    from the sampler's default and ``float64`` (:func:`experiments.runs.layout.samples_name`
    adds ``num_samples`` and ``seed``)."""
    name = record["name"]
    extras = []
    if record["grid"] != get_sampler(name).default_grid:
        extras.append(("grid", record["grid"]))
    extras += [(k, record[k]) for k in schema.GRID_FIELDS if record.get(k) is not None]
    for key, (_, default) in schema.sampler_options(name).items():
        if key in record and record[key] != default:
            extras.append((key, record[key]))
    if record.get("float64"):
        extras.append(("float64", True))
    return f"{name}_{record['steps']}", extras + conditioning_name_parts(record)


def conditioning_name_parts(record: dict) -> list[tuple[str, object]]:
    """``[(field, value)]`` of the conditioning in a sampler ``record``: ``labels`` (a list
    joined by ``_``) and, for a guidance, its kind then each field that is not its default
    (``scale`` 1, ``filter`` none; a classifier run directory with ``/`` as ``~``)."""
    out = []
    labels = record.get("labels")
    if labels is not None:
        out.append(("labels", "_".join(map(str, labels)) if isinstance(labels, list) else labels))
    g = record.get("guidance")
    if g:
        out.append(("guidance", g["kind"]))
        if g.get("scale", 1.0) != 1.0:
            out.append(("scale", g["scale"]))
        if g.get("interval"):
            out.append(("interval", "_".join(f"{v:g}" for v in g["interval"])))
        if g.get("filter", "none") != "none":
            out.append(("filter", g["filter"]))
        if g.get("classifier"):
            out.append(("classifier", str(g["classifier"]).strip("/").replace("/", "~")))
    return out


def merge_guidance(out: DictConfig, given: DictConfig | None) -> None:
    """The fields of a command's ``sampler.guidance`` (``sampler=run``: null unless given) set
    on the run's ``out``; a new ``kind`` drops the run's other guidance fields (they belong to
    the old kind), as a new grid drops the old grid's options."""
    if given is None:
        return
    if given.get("kind") is not None and given.kind != out.kind:
        for key in schema.GUIDANCE_FIELDS:
            out[key] = None
    for key, value in given.items():
        if value is not None:
            out[key] = value


def check_sampler(sampling: Sampling, source, data_shape) -> None:
    """Run the sampler's argument checks (and trace it once, without compiling or computing)."""
    jax.eval_shape(lambda: sampling(source, jax.random.key(0), (1, *data_shape))[0])


@dataclasses.dataclass
class ScoreRun(TrainedRun):
    """Everything a score training run is made of, built and validated from its config.

    ``run.source(params)`` is the network's score source (a
    :class:`scorelib.scores.NetworkScore`); ``run.process``, ``run.data``, ``run.sampling``
    the run's process, data and sampler.
    """

    graphdef: Any
    sampling: Sampling
    optimizer: Any

    def source(self, params):
        """The score source of the network with ``params`` (e.g. the EMA parameters): a
        :class:`scorelib.scores.NetworkScore`, class-conditional when the model is (without
        labels bound it gives the null label's, unconditional, score)."""
        return training.network_source(self.process, self.graphdef, self.cfg.data.sigma_data)(
            params, None
        )

    @property
    def null_trained(self) -> bool:
        """Whether the run trained its null label (``objective.label_dropout > 0``): its
        unconditional score, what classifier-free guidance and unlabelled sampling use."""
        return float(self.cfg.objective.get("label_dropout") or 0.0) > 0

    def sampling_source(self, params):
        """:meth:`source` conditioned and guided as ``sampler.labels`` / ``sampler.guidance``
        say (:func:`experiments.runs.conditioning.conditioned_source`)."""
        return conditioned_source(
            self.sampling, self.source(params), null_trained=self.null_trained
        )

    @classmethod
    def build(cls, cfg: DictConfig, mesh=None) -> ScoreRun:
        """Build every object of the run; every config error surfaces here, before compiling.

        With a ``mesh`` (``scorelib.parallel.make_mesh``) the train step is data-parallel:
        ``trainer.batch_size`` is the global batch (a multiple of the device count), split
        along the mesh's ``data`` axis; the state is replicated on every device.

        Raises:
          ValueError, FileNotFoundError: naming the config field.
        """
        tc = cfg.trainer
        check_trainer(tc)
        if mesh is not None:
            parallel.check_batch_size(tc.batch_size, mesh)
        check_real(cfg.data.sigma_data, "data.sigma_data", low=0.0, low_open=True, high_open=True)
        process = build_process(cfg)
        data = build_data(cfg)
        check_conditioning(cfg, data)
        p_drop = label_dropout(cfg)
        objective = build_objective(cfg, process, data, tiw_log_ratio(cfg, process))
        sampling = build_sampler(cfg, process)
        model = build_model(cfg, data.data_shape, tc.seed)
        check_cascade(cfg, model, objective)
        oc = cfg.optim
        # a cascade's modules have separate losses: each is clipped by its own norm
        groups = ("first", "second") if isinstance(model, Cascade) else None
        optimizer = training.make_optimizer(
            oc.lr, oc.warmup_steps, oc.grad_clip, oc.b1, oc.b2, oc.eps, clip_groups=groups
        )
        graphdef, state = training.init_state(model, optimizer, tc.seed)
        if mesh is not None:
            state = parallel.shard(state, mesh)
        dropout = float(cfg.model.get("dropout") or 0.0) > 0
        make_source = training.network_source(
            process, graphdef, cfg.data.sigma_data, dropout=dropout
        )
        step_fn = training.make_train_step(
            objective,
            make_source,
            optimizer,
            make_ema(tc),
            data.batch_fn(tc.batch_size, tc.seed, mesh),
            lr_schedule=training.warmup_schedule(oc.lr, oc.warmup_steps),
            batch_sharding=None if mesh is None else parallel.batch_sharding(mesh),
            label_dropout=p_drop,
        )
        run = cls(
            cfg=cfg,
            data=data,
            state=state,
            step_fn=step_fn,
            fingerprint=model_fingerprint(cfg, data.data_shape),
            process=process,
            graphdef=graphdef,
            sampling=sampling,
            optimizer=optimizer,
        )
        check_sampler(sampling, run.sampling_source(state.params), data.data_shape)
        return run

    def initial_state(self) -> training.TrainState:
        """The fresh state, with params and EMA params from ``init_from``'s checkpoint
        (its EMA parameters for both) when given; the optimizer state and step stay new.

        Raises:
          FileNotFoundError: no such run or checkpoint.
          ValueError: the other run's model config differs (naming the fields).
        """
        init_from = self.cfg.get("init_from")
        if not init_from:
            return self.state
        src, step = parse_init_from(init_from)
        steps = saved_steps(src)
        if not steps:
            raise FileNotFoundError(
                f"init_from={init_from}: no checkpoint in {src / 'checkpoints'}"
            )
        if step is not None and step not in steps:
            raise FileNotFoundError(
                f"init_from={init_from}: no checkpoint at step {step}; have {steps}"
            )
        step = steps[-1] if step is None else step
        got = training.restore_params(
            src / "checkpoints",
            self.state,
            step=step,
            expected_fingerprint=self.fingerprint,
            fingerprint_defaults=self.fingerprint_defaults(),
        )
        ema = got.ema_params
        copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # noqa: E731
        return self.state.replace(params=copy(ema), ema_params=copy(ema))

    def fingerprint_defaults(self) -> dict:
        return model_fingerprint_defaults(self.cfg)

    def saved_config(self) -> DictConfig:
        """``cfg`` resolved, without the grid options that are not set (they are not used)."""
        tree = OmegaConf.to_container(self.cfg, resolve=True)
        tree["sampler"] = {
            k: v for k, v in tree["sampler"].items() if not (k in schema.GRID_FIELDS and v is None)
        }
        return OmegaConf.create(tree)

    def sample_params(self, state, use_ema: bool):
        return state.ema_params if use_ema else state.params

    def draw(self, params, *, progress: bool = True):
        """Samples of the network ``params`` with the run's sampler; each batch is split
        over this process's devices (``draw_samples(devices=...)``)."""
        source = self.sampling_source(params)
        key = jax.random.key(self.cfg.sampler.seed)
        x, info = draw_samples(
            self.sampling,
            source,
            key,
            self.data.data_shape,
            num_samples=self.cfg.sampler.num_samples,
            batch_size=self.cfg.sampler.batch_size,
            progress=progress,
            desc=f"sampling ({self.sampling.name})",
            devices=jax.local_devices(),
        )
        labels = sample_labels(source, key, len(x))
        return x, {
            "grid_ve_sigma": [float(s) for s in self.sampling.grid],
            **info,
            "labels": labels,
        }

    def title(self, run_dir: Path, step: int, info: dict, use_ema: bool) -> str:
        record = self.sampling.record
        weights = "EMA" if use_ema else "raw params"
        return (
            f"{display_path(run_dir)}\n{type(self.process).__name__}, {record['name']} "
            f"{record['steps']} steps (NFE {info.get('nfe')}), step {step}, {weights}"
        )

    # ------------------------------------------------------------------ the run's sampler

    @classmethod
    def stored_sampler(cls, cfg: DictConfig) -> DictConfig:
        """A run's stored sampler config, typed by its sampler's schema.

        Keys the schema lacks, and grid options the run's grid does not take, are dropped:
        configs written before the per-sampler schemas hold every option of every sampler.

        Raises:
          ValueError: naming ``sampler.name`` for an unknown sampler.
        """
        stored = OmegaConf.to_container(cfg.sampler, resolve=True)
        typ = schema.sampler_schema(stored["name"])
        fields = {f.name for f in dataclasses.fields(typ)}
        grid = stored.get("grid") or typ.__dataclass_fields__["grid"].default
        unused = set(schema.GRID_FIELDS) - set(schema.GRID_OPTIONS.get(grid, ()))
        kept = {k: v for k, v in stored.items() if k in fields and k not in unused}
        return OmegaConf.merge(OmegaConf.structured(typ), kept)

    @classmethod
    def sampler_config(cls, cmd: DictConfig, run_cfg: DictConfig, overrides: list[str]):
        """The sampler config to sample with.

        Args:
          cmd: the ``sample``/``evaluate`` command's config; ``cmd.sampler`` is
            ``sampler=run`` (every field null unless given) or the group the command line
            chose.
          run_cfg: the training run's ``config.yaml``.
          overrides: the command-line overrides.

        Returns:
          For ``sampler=run``, the run's sampler with each field given on top; for
          ``sampler=<name>``, ``cmd.sampler`` with the run's ``num_samples`` and
          ``batch_size`` unless the command line gives them, so results stay comparable.

        Raises:
          ValueError: a field the run's sampler does not have, or ``sampler.name`` changed.
        """
        if not issubclass(OmegaConf.get_type(cmd.sampler) or dict, schema.RunSamplerConfig):
            out = cmd.sampler.copy()
            keys = set(override_keys(overrides))
            for field in ("num_samples", "batch_size"):
                if f"sampler.{field}" not in keys and field in run_cfg.sampler:
                    out[field] = run_cfg.sampler[field]
            return out
        out = cls.stored_sampler(run_cfg)
        name = out.name
        for key, value in cmd.sampler.items():
            if key == "guidance":
                merge_guidance(out.guidance, value)
                continue
            if value is None:
                continue
            if key == "name" and value != name:
                raise ValueError(
                    f"sampler.name cannot change the run's sampler ({name}): choose another "
                    f"with sampler={value}; got sampler.name={value!r}"
                )
            if key not in out:
                options = sorted(schema.sampler_options(name))
                raise ValueError(
                    f"sampler.{key} is not an option of sampler={name}, the run's sampler (its "
                    f"options: {options or 'none'}); another sampler is chosen with "
                    "sampler=<name>"
                )
            out[key] = value
        if cmd.sampler.get("grid") is not None:  # a new grid: the old grid's options go
            for key in set(schema.GRID_FIELDS) - set(schema.GRID_OPTIONS.get(out.grid, ())):
                if cmd.sampler.get(key) is None:
                    out[key] = None
        return out

    @classmethod
    def samples_name(cls, sampling: Sampling, use_ema: bool = True) -> str:
        """``<name>_<steps>_n<num_samples>_seed<seed>`` plus ``+<field>-<value>`` for every
        other field that changes the samples and is not its default: the grid when it is
        not the sampler's default grid, each grid option given, each sampler option that
        differs from the sampler's default, ``float64``, and ``use_ema=false``."""
        record = sampling.record
        head, extras = sampler_name_parts(record)
        return samples_name(
            head,
            num_samples=record["num_samples"],
            seed=record["seed"],
            extras=extras,
            use_ema=use_ema,
        )

    @classmethod
    def sampling_of(cls, cfg: DictConfig) -> Sampling:
        return build_sampler(cfg, build_process(cfg))

    @classmethod
    def evaluation_source(cls, run_dir: Path, step: int | None, use_ema: bool):
        """The run's score source at checkpoint ``step`` (default the newest; EMA parameters
        unless ``use_ema=false``), for bits/dim; ``None`` when the run has no checkpoint
        (``samples=`` given for a run directory that holds only a config)."""
        if not saved_steps(run_dir):
            return None
        run, state = cls.load(run_dir, step=step)
        return run.source(state.ema_params if use_ema else state.params)


def check_cascade(cfg: DictConfig, model, objective) -> None:
    """Cas-DM's network and loss go together: ``objective=cascade`` reads the two modules of a
    ``scorelib.nets.Cascade`` (``model=cascade_digits``), and a cascade trained by another
    objective would pass that loss's gradient through the blend into both modules.

    Raises:
      ValueError: naming ``model`` or ``objective`` when one is a cascade's and the other not.
    """
    is_loss, is_net = isinstance(objective, CascadeLoss), isinstance(model, Cascade)
    if is_loss and not is_net:
        raise ValueError(
            f"model: objective=cascade trains the two modules of a scorelib.nets.Cascade "
            f"(model=cascade_digits); got {cfg.model._target_}"
        )
    if is_net and not is_loss:
        raise ValueError(
            f"objective: model=cascade_digits (scorelib.nets.Cascade) is trained by "
            f"objective=cascade (each module its own loss); got {cfg.objective._target_}"
        )


def tiw_log_ratio(cfg: DictConfig, process):
    """``objective=tiw``'s density ratio: a :class:`scorelib.objectives.ClassifierLogRatio` of
    the two-class classifier of ``objective.classifier_run`` (reference examples class 1) on
    ``process``, with ``objective.prior_log_odds``; ``None`` for any other objective.

    Raises:
      ValueError, FileNotFoundError: naming ``objective.classifier_run`` (no such run, not a
        classifier run, not two classes).
    """
    if cfg.objective.get("_target_") != "scorelib.objectives.TIWLoss":
        return None
    # the classifier run kind imports this module (its DLSM loss needs a score run)
    from experiments.runs.classifier import load_classifier

    run = cfg.objective.classifier_run
    try:
        classifier = load_classifier(run, cfg.objective.get("classifier_step"))
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(
            f"objective.classifier_run={run}: not a readable experiments.train_classifier run ({e})"
        ) from None
    if classifier.num_classes != 2:
        raise ValueError(
            f"objective.classifier_run={run}: a two-class classifier (reference 1, biased 0) "
            f"is needed; got {classifier.num_classes} classes"
        )
    return ClassifierLogRatio(
        classifier=classifier.with_process(process),
        prior_log_odds=float(cfg.objective.prior_log_odds),
    )
