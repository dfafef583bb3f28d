"""The classifier chain, offline, for post-mortems and for writing rules
(``ft-supervisor classify`` and ``plugins``).

``logs`` reads logs of any size in one pass; ``runlog`` reads a run directory's
event log; ``replay`` judges a run directory again as the daemon judged it;
``agree`` compares that with the daemon's reason file; ``render`` prints
what was replayed. The commands are in supervisor.cli.classify.
"""

from supervisor.postmortem.agree import disagreements
from supervisor.postmortem.logs import KEEP_FIRST, KEEP_LAST, TAIL, scan
from supervisor.postmortem.replay import ReplayedRun, Settings, judge_run

__all__ = [
    "KEEP_FIRST",
    "KEEP_LAST",
    "TAIL",
    "ReplayedRun",
    "Settings",
    "disagreements",
    "judge_run",
    "scan",
]
