"""scorelib's sweeper, ``hydra/sweeper=checked`` (the default of every entry point), and the
submitit launchers it runs the jobs through. A Hydra plugin: Hydra instantiates sweepers
and launchers only from the ``hydra_plugins`` namespace package, which this directory joins
beside hydra-submitit-launcher's.

* Before anything is written or submitted, every job's config is composed from its
  overrides (``load_sweep_config``, as the launchers compose it) and checked as the job
  checks it: fields added on the command line, then the entry point's ``check``
  (:func:`experiments.common.hydra_app`; ``experiments.train`` and ``distill`` build each
  run without training it). One invalid job refuses the sweep: a line per invalid job
  (``invalid: <its overrides>: <error line>``) and exit status 2.
* hydra-submitit-launcher's launchers (``hydra/launcher=slurm``, ``submitit_slurm``,
  ``submitit_local``) become :class:`SlurmLauncher` and :class:`LocalLauncher`: in the job a
  failure is raised as :class:`JobFailed` with its one-line reason, which submitit records
  as the job's error (the job exits 1: Slurm says FAILED); the sweep waits for every job
  and prints a line per failed job (``failed: <its overrides>: <error line> (log: ...)``),
  then exits 1, instead of raising the first job's ``UncompletedJobError`` with its log.
  A job that a time-limit signal (USR2) stopped after saving is requeued by submitit
  (``scorelib.parallel.requeue_after_stop``) and resumes: it is not a failure.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import HydraException
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from experiments.common import (
    CONFIG_ERRORS,
    USAGE_ERROR,
    CommandError,
    check_added_fields,
    error_line,
    one_line,
    shorten,
)
from scorelib import training

log = logging.getLogger(__name__)


def job_labels(jobs: Sequence[Sequence[str]]) -> list[str]:
    """What tells each job from the others: its overrides that not every job of the sweep
    shares (all of them for a sweep of one job), without ``hydra.*``."""
    jobs = [filter_overrides(list(job)) for job in jobs]
    common = set.intersection(*(set(j) for j in jobs)) if len(jobs) > 1 else set()
    return [" ".join(o for o in job if o not in common) or "(no overrides)" for job in jobs]


def check_jobs(config_loader, master: DictConfig, jobs, check=None) -> dict[int, str]:
    """``{job index: error line}`` of the jobs whose config is invalid: it does not compose,
    adds a field its schema does not have, or ``check(task_cfg)`` raises a config error.
    Each job's config is composed as ``hydra.core.utils.run_job`` composes it
    (``HydraConfig`` holds it meanwhile, with the job's output directory; restored after).

    Args:
      config_loader: Hydra's config loader.
      master: the sweep's config.
      jobs: each job's overrides.
      check: the entry point's check (:func:`experiments.common.hydra_app`), or ``None``.
    """
    bad = {}
    saved = HydraConfig.instance().cfg
    try:
        for num, overrides in enumerate(jobs):
            try:
                config = config_loader.load_sweep_config(master, list(overrides))
                with open_dict(config):
                    config.hydra.job.id = config.hydra.job.num = num
                HydraConfig.instance().set_config(config)
                out = os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))
                with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
                    config.hydra.runtime.output_dir = os.path.abspath(out)
                HydraConfig.instance().set_config(config)
                task_cfg = copy.deepcopy(config)
                with read_write(task_cfg), open_dict(task_cfg):
                    del task_cfg["hydra"]
                check_added_fields(task_cfg)
                if check is not None:
                    check(task_cfg)
            except CONFIG_ERRORS + (HydraException,) as e:
                if os.environ.get("SCORELIB_TRACEBACK"):
                    raise
                bad[num] = error_line(e)
    finally:
        HydraConfig.instance().cfg = saved
    return bad


class CheckedSweeper(BasicSweeper):
    """Hydra's basic sweeper (``a=1,2 b=x,y``: every combination, in one batch unless
    ``max_batch_size``) that checks every job before it writes ``multirun.yaml`` or starts
    a job, and runs hydra-submitit-launcher's jobs through :class:`LocalLauncher` and
    :class:`SlurmLauncher` (the module docstring)."""

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        target = OmegaConf.select(config, "hydra.launcher._target_")
        ours = REPORTING.get(target)
        if ours is not None:  # the same launcher config, our class (multirun.yaml says so)
            with read_write(config.hydra.launcher):
                config.hydra.launcher._target_ = ours
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.check = getattr(task_function, "check_config", None)

    def sweep(self, arguments: list[str]):
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = [job for batch in self.split_arguments(parsed, None) for job in batch]
        if isinstance(self.launcher, _Reporting):  # the jobs run elsewhere: no GPU here
            jax.config.update("jax_platforms", "cpu")
        bad = check_jobs(self.hydra_context.config_loader, self.config, jobs, self.check)
        if bad:
            labels = job_labels(jobs)
            for num, line in bad.items():
                print(f"invalid: {labels[num]}: {line}", file=sys.stderr)
            which = "it is" if len(jobs) == 1 else f"{len(bad)} of {len(jobs)} jobs are"
            refused = f"the sweep is refused: {which} invalid; no job was started"
            print(f"error: {refused}", file=sys.stderr)
            sys.exit(USAGE_ERROR)
        return super().sweep(arguments)


class JobFailed(Exception):
    """Raised in a submitit job that failed, with its one-line reason: submitit pickles it
    as the job's error (the last line of the traceback it keeps) and the job exits 1."""


def failure_line(job) -> str | None:
    """The one-line reason a finished submitit ``job`` failed, or ``None`` if it did not:
    the last line of the traceback submitit kept (``<type>: <message>``; for
    :class:`JobFailed`, the message alone), or, for a job that left no result (killed for
    its memory, by ``scancel``, at its time limit), its state."""
    from submitit.core.utils import FailedJobError, pickle_load  # see _Reporting.launch

    err = job.exception()
    if err is None:
        return None
    if not isinstance(err, FailedJobError):  # an UncompletedJobError
        return f"the job ended without a result (state: {job.state})"
    _, trace = pickle_load(job.paths.result_pickle)  # ("error", traceback.format_exc())
    last = trace.strip().splitlines()[-1]
    return shorten(last.removeprefix(f"{JobFailed.__module__}.{JobFailed.__qualname__}: "))


class _Reporting:
    """What :class:`LocalLauncher` and :class:`SlurmLauncher` add to hydra-submitit-launcher's
    launchers (pinned to 1.2.0 in constraints.txt)."""

    def __call__(self, *args) -> JobReturn:  # in the job
        try:
            ret = super().__call__(*args)
        except CommandError as e:  # clean_errors printed "error: <line>"
            raise JobFailed(e.line) from None
        except training.Interrupted as e:  # stopped after saving, and not requeued
            raise JobFailed(e.message) from None
        if ret.status == JobStatus.FAILED:  # an unexpected error: its traceback in the log
            err = ret._return_value
            line = shorten(f"{type(err).__name__}: {one_line(str(err))}")
            if isinstance(err.__context__, training.Interrupted):  # submitit did not requeue
                line = f"{err.__context__.message} (not requeued: {line})"
            raise JobFailed(line) from err
        return ret

    def launch(self, job_overrides, initial_job_idx: int) -> Sequence[JobReturn]:
        # BaseSubmititLauncher.launch up to the submission; then every job is waited for.
        # submitit is imported here, as there: importing it attaches logging handlers to the
        # sys.stderr of the moment (Hydra imports this module whenever it looks for plugins).
        import submitit

        init = {"max_num_timeout"}
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=self.params["submitit_folder"],
            **{f"{self._EXECUTOR}_{k}": v for k, v in self.params.items() if k in init},
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{
                k if k in shared else f"{self._EXECUTOR}_{k}": v
                for k, v in self.params.items()
                if k not in init | {"submitit_folder"}
            }
        )
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep_dir}")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        args = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            state = Singleton.get_state()
            args.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", state))
        jobs = executor.map_array(self, *zip(*args, strict=True))
        failed = [(n, line) for n, job in enumerate(jobs) if (line := failure_line(job))]
        if not failed:
            return [job.results()[0] for job in jobs]
        labels = job_labels(job_overrides)
        for n, line in failed:
            where = _display(Path(jobs[n].paths.stderr))
            print(f"failed: {labels[n]}: {line} (log: {where})", file=sys.stderr)
        print(f"error: {len(failed)} of {len(jobs)} jobs failed", file=sys.stderr)
        sys.exit(1)


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class LocalLauncher(_Reporting, submitit_launcher.LocalLauncher):
    """``hydra/launcher=submitit_local`` that reports every failed job (:class:`_Reporting`)."""


class SlurmLauncher(_Reporting, submitit_launcher.SlurmLauncher):
    """``hydra/launcher=slurm`` or ``submitit_slurm`` that reports every failed job
    (:class:`_Reporting`)."""


#: hydra-submitit-launcher's launchers, and ours that report every job.
REPORTING = {
    f"{submitit_launcher.__name__}.{cls.__name__}": f"{__name__}.{cls.__name__}"
    for cls in (LocalLauncher, SlurmLauncher)
}
