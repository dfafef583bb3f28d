"""``ft-supervisor classify`` and ``ft-supervisor plugins``: the classifier chain,
offline, for post-mortems and for writing rules.

``logs`` reads logs of any size in one pass; ``runlog`` reads a run directory's
event log; ``replay`` judges a run directory again as the daemon judged it;
``agree`` compares that with the daemon's reason file; ``command`` and ``render``
are the commands.
"""

from supervisor.postmortem.agree import disagreements
from supervisor.cli.classify import add_commands, gather
from supervisor.postmortem.logs import KEEP_FIRST, KEEP_LAST, TAIL, scan
from supervisor.postmortem.replay import Settings, Verdict, judge_run

__all__ = [
    "KEEP_FIRST",
    "KEEP_LAST",
    "TAIL",
    "Settings",
    "Verdict",
    "add_commands",
    "disagreements",
    "gather",
    "judge_run",
    "scan",
]
