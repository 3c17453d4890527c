"""Training objectives: ``objective(source, x0, key) -> (loss, metrics)``."""

from scorelib.objectives.base import Objective, reduce_per_example
from scorelib.objectives.dsm import DSM, EDMLoss

OBJECTIVES = {"dsm": DSM, "edm": EDMLoss}

__all__ = ["Objective", "DSM", "EDMLoss", "OBJECTIVES", "reduce_per_example"]
