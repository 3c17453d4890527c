"""Noise processes ``x_t = alpha(t) x_0 + sigma(t) eps``: VE, VP, sub-VP and EDM."""

from scorelib.processes.base import Process, broadcast_to_data
from scorelib.processes.edm import EDM
from scorelib.processes.ve import VE
from scorelib.processes.vp import VP, SubVP, ornstein_uhlenbeck

PROCESSES = {"ve": VE, "vp": VP, "subvp": SubVP, "edm": EDM}

__all__ = [
    "Process",
    "VE",
    "VP",
    "SubVP",
    "EDM",
    "PROCESSES",
    "broadcast_to_data",
    "ornstein_uhlenbeck",
]
