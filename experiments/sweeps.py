"""Sweeps (``python -m experiments.<app> -m ...``): every job is checked before any starts,
and the sweep ends with one line per job.

The sweeper of every entry point is ``hydra/sweeper=checked``
(:class:`hydra_plugins.scorelib_sweeps.CheckedSweeper`: Hydra's basic sweeper with
:class:`CheckJobs`):

* Before the first job starts, every job's config is composed from the overrides the sweep
  gives it (``config_loader.load_sweep_config``, as Hydra's launchers do) and checked as
  the job's first step checks it (the entry point's ``check``,
  :func:`experiments.common.hydra_app`; for ``train`` and ``distill``
  :func:`check_trained_run` builds the run without training it). One invalid job refuses
  the sweep: one ``invalid:`` line per invalid job (its overrides and error line), exit
  status 2, nothing started or submitted.
* The jobs run through the launcher the command chose (``basic``, the default;
  ``submitit_local``; ``slurm`` or ``submitit_slurm``), made to report each job
  (:class:`ReportInProcess`, :class:`ReportSubmitit`): one line per job, ``done:`` (its run
  directory), ``failed:`` (its error line and log) or ``stopped:`` (a signal stopped it
  after saving a step: the same command resumes it), instead of Hydra's and submitit's
  tracebacks. The sweep exits 0 when every job is done, 1 when a job failed, else the
  stopped job's status (130, 138, 143).
* In a submitit job, submitit's time-limit signal (USR2) saves the step, then submitit
  requeues the job (Slurm: ``scorelib.parallel.requeue_after_stop``; the local executor:
  :func:`_after_stop`), which resumes from that step; the sweep reports it ``done`` and
  that it was requeued. Another stop signal (USR1 outside Slurm, SIGTERM, SIGINT) saves the
  step and ends the job: ``stopped``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import HydraException
from hydra.utils import instantiate
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from experiments.common import (
    CONFIG_ERRORS,
    INTERRUPTED,
    USAGE_ERROR,
    CommandError,
    check_added_fields,
    error_line,
    one_line,
    shorten,
)
from scorelib import parallel, training

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- checks


def check_trained_run(kind, cfg: DictConfig) -> None:
    """What ``experiments.runs.train_run`` checks before it computes, but the devices:
    ``kind.build(cfg)`` (every config field: it loads the data, builds the networks and
    initialises their parameters, traces the sampler once and compiles no train step), and
    that the job's run directory (``HydraConfig``'s output directory) holds no run of
    another config.

    Args:
      kind: :class:`experiments.runs.ScoreRun` or :class:`experiments.runs.DistillRun`.
      cfg: the job's composed config (without ``hydra``).

    Raises:
      ValueError, FileNotFoundError: naming the config field.
    """
    from experiments.runs.identity import check_same_run

    kind.build(cfg)
    check_same_run(Path(HydraConfig.get().runtime.output_dir), cfg)


def job_config(config_loader, master: DictConfig, overrides: Sequence[str], num: int):
    """The task config (without ``hydra``) of the sweep's job number ``num`` with
    ``overrides``, composed as Hydra's launchers and ``run_job`` compose it; leaves
    ``HydraConfig`` holding the job's config, ``runtime.output_dir`` set."""
    config = config_loader.load_sweep_config(master, list(overrides))
    with open_dict(config):
        config.hydra.job.id = num
        config.hydra.job.num = num
    HydraConfig.instance().set_config(config)
    out = os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(out)
    HydraConfig.instance().set_config(config)
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def check_jobs(config_loader, master: DictConfig, jobs, check=None) -> dict[int, str]:
    """``{job index: error line}`` of the jobs whose config is invalid: it does not
    compose, adds a field its schema does not have, or ``check(task_cfg)`` raises a config
    error (``HydraConfig`` holds the job's config meanwhile, and is restored after).

    Args:
      config_loader: Hydra's config loader (``hydra_context.config_loader``).
      master: the sweep's config.
      jobs: each job's overrides.
      check: the entry point's check (:func:`experiments.common.hydra_app`), or ``None``.
    """
    bad = {}
    saved = HydraConfig.instance().cfg
    try:
        for num, overrides in enumerate(jobs):
            try:
                task_cfg = job_config(config_loader, master, overrides, num)
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


def job_labels(jobs: Sequence[Sequence[str]]) -> list[str]:
    """What tells each job from the others: its overrides that not every job of the sweep
    shares (all of them for a sweep of one job), without ``hydra.*``."""
    jobs = [filter_overrides(list(job)) for job in jobs]
    common = set.intersection(*(set(j) for j in jobs)) if len(jobs) > 1 else set()
    return [" ".join(o for o in job if o not in common) or "(no overrides)" for job in jobs]


class _SweepDir:
    """What a refused sweep undoes: Hydra's sweeper writes ``<sweep dir>/multirun.yaml``
    (making the directory) before the jobs are checked."""

    def __init__(self, config: DictConfig):
        try:
            self.path = Path(str(config.hydra.sweep.dir)).resolve()
        except Exception:  # an interpolation that does not resolve: nothing to undo
            self.path = None
            return
        self.made = [p for p in (self.path, *self.path.parents) if not p.exists()]
        yaml = self.path / "multirun.yaml"
        self.old = yaml.read_bytes() if yaml.is_file() else None

    def restore(self) -> None:
        if self.path is None:
            return
        yaml = self.path / "multirun.yaml"
        if self.old is None:
            yaml.unlink(missing_ok=True)
        else:
            yaml.write_bytes(self.old)
        for p in self.made:  # deepest first
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()


class CheckJobs:
    """What ``CheckedSweeper`` adds to Hydra's basic sweeper (the jobs of ``a=1,2 b=x,y``:
    every combination):

    * every job of the sweep is checked before the first starts (:func:`check_jobs`); when
      one is invalid, one line per invalid job and exit status 2, nothing started;
    * the launcher Hydra made from ``hydra.launcher`` is replaced by its subclass that
      reports each job, with the same config (``reporting``: Hydra's basic launcher and
      hydra-submitit-launcher's local and Slurm ones; another launcher is kept).

    The checks run in this process. When the jobs run elsewhere (a submitit launcher), JAX
    is kept on the CPU here: the checks take no GPU memory on a GPU login node.
    """

    #: ``{qualified name of a launcher class: its subclass that reports each job}``
    reporting: dict = {}

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.check = getattr(task_function, "check_config", None)
        self.sweep_dir = _SweepDir(config)
        self.checked = False
        kind = type(self.launcher)
        cls = self.reporting.get(f"{kind.__module__}.{kind.__qualname__}")
        if cls is not None:
            self.launcher = instantiate(config.hydra.launcher, _target_=cls)
            self.launcher.setup(
                hydra_context=hydra_context, task_function=task_function, config=config
            )

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if self.checked:  # the first call checked every batch
            return
        self.checked = True
        jobs = [job for b in self.overrides for job in b]
        if not getattr(self.launcher, "runs_in_process", False):
            import jax

            jax.config.update("jax_platforms", "cpu")
        bad = check_jobs(self.hydra_context.config_loader, self.config, jobs, self.check)
        if not bad:
            return
        labels = job_labels(jobs)
        for num, line in bad.items():
            print(f"invalid: {labels[num]}: {line}", file=sys.stderr)
        which = "it is" if len(jobs) == 1 else f"{len(bad)} of {len(jobs)} jobs are"
        print(f"error: the sweep is refused: {which} invalid; no job was started", file=sys.stderr)
        self.sweep_dir.restore()
        sys.exit(USAGE_ERROR)


# --------------------------------------------------------------------------- outcomes


@dataclasses.dataclass
class Outcome:
    """How a job of a sweep ended.

    Attributes:
      state: ``done``, ``failed``, ``stopped`` (a signal stopped it after saving a step) or
        ``not started`` (an earlier job of an in-process sweep was stopped).
      line: the run directory (done), the error line (failed) or the stop line (stopped).
      log: the job's log file, when there is one.
      code: the exit status of a stopped job (128 + the signal's number).
      ret: Hydra's ``JobReturn`` of a done job.
    """

    state: str
    line: str = ""
    log: Path | None = None
    code: int = 1
    ret: JobReturn | None = None


def _display(path) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def done(ret: JobReturn, note: str = "") -> Outcome:
    """The outcome of a job that returned: its output (run) directory, and ``note``."""
    out = _display(ret.hydra_cfg.hydra.runtime.output_dir)
    return Outcome("done", out + (f" ({note})" if note else ""), ret=ret)


#: The lines a job prints when it ends early: ``error: ...`` (``clean_errors``, or an
#: unexpected error) and ``saved step N on SIG...; ...`` (a signal stopped training).
_STATUS = re.compile(r"^(error: |saved step \d+|stopped by SIG)")


def status_lines(path: Path, tail: int = 1 << 16) -> list[str]:
    """The status lines (``error: ...``, ``saved step N ...``) in the last ``tail`` bytes of
    a job's log, in order (a progress bar's carriage returns split lines too)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = (s.strip() for s in re.split(r"[\r\n]", text))
    return [s for s in lines if _STATUS.match(s)]


def report(outcomes: Sequence[Outcome], jobs: Sequence[Sequence[str]]) -> list[JobReturn]:
    """Print one line per job: ``done: <overrides> -> <run dir>`` on stdout; ``failed:``,
    ``stopped:`` or ``not started: <overrides>: <line> (log: <path>)`` and a closing
    ``error:`` line on stderr.

    Returns:
      Every job's ``JobReturn``, when every job is done.

    Raises:
      SystemExit: 1 when a job failed, else the status of the first stopped job.
    """
    for label, o in zip(job_labels(jobs), outcomes, strict=True):
        if o.state == "done":
            print(f"done: {label} -> {o.line}", flush=True)
        else:
            where = f" (log: {_display(o.log)})" if o.log is not None else ""
            print(f"{o.state}: {label}: {o.line}{where}", file=sys.stderr, flush=True)
    counts = {}
    for o in outcomes:
        if o.state != "done":
            counts[o.state] = counts.get(o.state, 0) + 1
    if not counts:
        return [o.ret for o in outcomes]
    parts = ", ".join(f"{n} {state}" for state, n in counts.items())
    again = "; the same command resumes the stopped jobs" if "stopped" in counts else ""
    print(
        f"error: {sum(counts.values())} of {len(outcomes)} jobs did not finish ({parts}){again}",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(1 if "failed" in counts else next(o.code for o in outcomes if o.state == "stopped"))


def unexpected_error_line(err: BaseException) -> str:
    """``<Type>: <message>`` in one line, for an error no check anticipated."""
    return shorten(f"{type(err).__name__}: {one_line(str(err))}".rstrip(": "))


# --------------------------------------------------------------------------- in-process jobs


class ReportInProcess:
    """What ``hydra_plugins.scorelib_sweeps.BasicLauncher`` adds to Hydra's basic launcher
    (the jobs one after another in this process): every job runs even when one fails, and
    each is reported (:func:`report`). A signal that stops a job (Ctrl-C, SIGTERM) stops the
    sweep: the jobs after it are not started. An unexpected error's traceback goes to the
    job's log (``SCORELIB_TRACEBACK=1``: raised)."""

    runs_in_process = True

    def launch(self, job_overrides, initial_job_idx: int) -> Sequence[JobReturn]:
        outcomes: list[Outcome] = []
        labels = job_labels(job_overrides)
        stop = None
        for num, overrides in enumerate(job_overrides):
            if stop is not None:
                outcomes.append(Outcome("not started", f"the sweep stopped at {stop}"))
                continue
            try:
                (ret,) = super().launch([overrides], initial_job_idx=initial_job_idx + num)
            except CommandError as e:  # its error line is printed; its output dir cleaned up
                outcomes.append(Outcome("failed", e.line, log=e.log))
                continue
            except training.Interrupted as e:
                outcomes.append(Outcome("stopped", e.message, code=e.code))
                stop = labels[num]
                continue
            except KeyboardInterrupt:
                outcomes.append(Outcome("stopped", "interrupted (Ctrl-C)", code=INTERRUPTED))
                stop = labels[num]
                continue
            if ret.status == JobStatus.COMPLETED:
                outcomes.append(done(ret))
                continue
            err = ret._return_value
            if os.environ.get("SCORELIB_TRACEBACK"):
                raise err
            hc = ret.hydra_cfg.hydra
            path = Path(hc.runtime.output_dir) / f"{hc.job.name}.log"
            if path.is_file():
                with open(path, "a") as f:
                    traceback.print_exception(err, file=f)
            where = path if path.is_file() else None
            outcomes.append(Outcome("failed", unexpected_error_line(err), log=where))
        return report(outcomes, job_overrides)


# --------------------------------------------------------------------------- submitit jobs


class ReportSubmitit:
    """What ``hydra_plugins.scorelib_sweeps.LocalLauncher`` and ``SlurmLauncher`` add to
    hydra-submitit-launcher's launchers, on both sides of the submission.

    In the job (:meth:`__call__`): a job that fails prints ``error: <line>`` and exits
    non-zero (Slurm's accounting says FAILED); a signal that stopped training after saving
    prints ``saved step N on SIG...; <what next>`` (:func:`_after_stop`). In the sweep
    (:meth:`launch`): every job's outcome is gathered (:func:`outcome`) and reported
    (:func:`report`).
    """

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state):
        try:
            ret = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        except training.Interrupted as e:
            _after_stop(e)
            raise
        except SystemExit as e:  # submitit's handler requeued the job after the step was saved
            if isinstance(e.__context__, training.Interrupted):
                _say(f"{_saved(e.__context__)}; submitit requeued the job")
            raise
        if ret.status == JobStatus.FAILED:
            err = ret._return_value
            if isinstance(err.__context__, training.Interrupted):  # submitit did not requeue
                _say(_not_requeued(err.__context__, err))
            else:
                traceback.print_exception(err)
                _say(f"error: {unexpected_error_line(err)}")
            raise err
        return ret

    def launch(self, job_overrides, initial_job_idx: int) -> Sequence[JobReturn]:
        # hydra-submitit-launcher 1.2.0's BaseSubmititLauncher.launch (pinned in
        # constraints.txt), but every job's outcome is gathered, not the first failure raised.
        import submitit

        assert self.config is not None
        params = self.params
        init = {"folder": params["submitit_folder"]}
        if "max_num_timeout" in params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = params["max_num_timeout"]
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{
                k if k in shared else f"{self._EXECUTOR}_{k}": v
                for k, v in params.items()
                if k not in ("max_num_timeout", "submitit_folder")
            }
        )
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {self.config.hydra.sweep.dir}")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        args = []
        for num, overrides in enumerate(job_overrides):
            idx = initial_job_idx + num
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            state = Singleton.get_state()
            args.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", state))
        jobs = executor.map_array(self, *zip(*args, strict=True))
        return report([outcome(job) for job in jobs], job_overrides)


def outcome(job) -> Outcome:
    """The :class:`Outcome` of a submitit job (waits for it): from its result, else from
    the last status line of its log (:func:`status_lines`), else from submitit's error.
    A done job's ``saved step`` lines say that it was stopped, saved and resumed."""
    from submitit.core.utils import UncompletedJobError

    path = Path(job.paths.stderr)
    try:
        ret = job.results()[0]
    except UncompletedJobError as e:
        last = (status_lines(path) or [""])[-1]
        if last.startswith("saved step"):
            return Outcome("stopped", last, log=path, code=_stop_status(last))
        if last.startswith("error: "):
            return Outcome("failed", shorten(last[len("error: ") :]), log=path)
        text = [line for line in str(e).splitlines() if line.strip()]
        return Outcome("failed", shorten(text[-1] if text else repr(e)), log=path)
    if ret.status != JobStatus.COMPLETED:
        return Outcome("failed", unexpected_error_line(ret._return_value), log=path)
    saves = [line for line in status_lines(path) if line.startswith("saved step")]
    notes = [s.split(";")[0] + (", requeued" if "requeued the job" in s else "") for s in saves]
    return done(ret, shorten("; ".join(notes), 150))


def _stop_status(line: str) -> int:
    """128 + the number of the signal a ``saved step N on SIG...`` line names, or 1."""
    name = re.search(r" on (SIG[A-Z0-9]+)", line)
    try:
        return training.exit_status(signal.Signals[name[1]]) if name else 1
    except KeyError:
        return 1


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _saved(e: training.Interrupted) -> str:
    if e.step is None:
        return e.message.split(";")[0]
    return f"saved step {e.step} on {e.signum.name}"


def _not_requeued(e: training.Interrupted, why: BaseException) -> str:
    return f"{_saved(e)}; not requeued ({one_line(str(why))}); rerun the same command to resume"


def _after_stop(e: training.Interrupted) -> None:
    """In a submitit job that a signal stopped after saving, and that was not requeued
    (``scorelib.parallel.requeue_after_stop`` requeues Slurm jobs): submitit's time-limit
    signal in a local job has submitit's handler requeue it (the local executor restarts
    the job, which resumes from the saved step); otherwise the job says how to resume.

    Raises:
      SystemExit: submitit requeued the job.
    """
    handler = signal.getsignal(e.signum)
    local = parallel.slurm_job_id() is None
    if local and e.signum in parallel.preempt_signals() and callable(handler):
        from submitit.core.utils import UncompletedJobError

        try:
            handler(e.signum, None)  # task 0: requeues and exits; another task returns
        except UncompletedJobError as why:  # e.g. timed out max_num_timeout times
            _say(_not_requeued(e, why))
            return
        except SystemExit:
            _say(f"{_saved(e)}; submitit requeued the job")
            raise
        return
    _say(f"{_saved(e)}; rerun the same command to resume")


__all__ = [
    "CheckJobs",
    "Outcome",
    "ReportInProcess",
    "ReportSubmitit",
    "check_jobs",
    "check_trained_run",
    "job_labels",
    "outcome",
    "report",
    "status_lines",
]
