"""scorelib's sweeper as a Hydra plugin (``hydra/sweeper=checked``, the default of every
entry point), with the launchers it reports each job through.

Hydra instantiates a sweeper or a launcher only from a class of the ``hydra_plugins``
namespace package, which this directory joins (beside hydra-submitit-launcher's). The
classes are defined here, where Hydra's plugin scan re-executes them after the classes they
extend (a subclass made before the scan would extend a stale class); what they add is in
:mod:`experiments.sweeps`.
"""

from hydra._internal.core_plugins.basic_launcher import BasicLauncher as _Basic
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit

from experiments.sweeps import CheckJobs, ReportInProcess, ReportSubmitit


class BasicLauncher(ReportInProcess, _Basic):
    """Hydra's basic launcher, reporting each job (:class:`experiments.sweeps.ReportInProcess`)."""


class LocalLauncher(ReportSubmitit, _submitit.LocalLauncher):
    """``hydra/launcher=submitit_local``, reporting each job
    (:class:`experiments.sweeps.ReportSubmitit`)."""


class SlurmLauncher(ReportSubmitit, _submitit.SlurmLauncher):
    """``hydra/launcher=slurm`` (``submitit_slurm``), reporting each job
    (:class:`experiments.sweeps.ReportSubmitit`)."""


def _name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class CheckedSweeper(CheckJobs, BasicSweeper):
    """Hydra's basic sweeper, checking every job before any starts and reporting each
    (:class:`experiments.sweeps.CheckJobs`)."""

    reporting = {
        _name(_Basic): BasicLauncher,
        _name(_submitit.LocalLauncher): LocalLauncher,
        _name(_submitit.SlurmLauncher): SlurmLauncher,
    }
