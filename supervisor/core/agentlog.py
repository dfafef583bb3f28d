"""A launcher's log (torchrun's, nvidia-resiliency-ext's ft_launcher's) as one
failure per rank that it names.

What says which rank a line belongs to:

* ``[rank3]:`` (torch's prefix, a global rank) and ``[default3]:`` (torchrun's
  ``--tee``/mixed output: the role and the *local* rank);
* ``[RankMonServer<pid>@<host>:3]``: ft_launcher's per-rank monitor, named after
  the global rank it watches (``<none>`` before a rank connects);
* torchrun's agent: ``failed (exitcode: -9) local_rank: 1 (pid: 6087) of binary``,
  and the ``ChildFailedError`` report, whose ``[i]:`` entries (under
  ``Failures:`` and ``Root Cause (first observed failure):``) each name
  ``rank : 1 (local_rank: 1)`` and ``exitcode : -9 (pid: 6087)``;
* ft_launcher's closing ``Some rank(s) exited with non-zero exit code:
  {1: ProcessFailure(local_rank=1, pid=..., exitcode=-9, ..., message='...'), ...}``,
  split into one piece per rank.

A rank's exit code or signal becomes its ``ExitStatus``, so the exit and signal
rules see it; a rank the launcher stopped itself (``Sending process P closing
signal SIGTERM``) is marked terminated, as the daemon marks the ranks it stops.
A rank monitor's timeout line (``Section 'step' has been open for 3.32 seconds.
Timeout is 3.00 seconds.``, ``Did not get subsequent heartbeat. Waited 5.00
seconds.``, ``Was out of section for...``) is a hang; the monitor's kill that
follows is its consequence, so the lines that report that exit are not the hung
rank's evidence. Every other line is the launcher's own and goes with each rank.

Order, root cause first: the rank a monitor declared hung first, the rank under
"Root Cause", the rank of the first ``failed (exitcode...)`` line, then the rest.

Only the first failure is read (``first_failure``): a launcher that restarts
goes on writing the next generations' lines into the same log, and what they
say (a new generation's start-up errors, its own report) is not the first
failure's cause. The first failure is every line up to the launcher's first
``failed (exitcode...)`` (or ft_launcher's ``ProcessFailure`` summary); after it,
when its report (``Failures:``, ``Root Cause``) comes before any other process's
failure, the launcher gave up: every line to the report's end; else it restarted
and only what it still says of the same processes (by pid: ft_launcher repeats the
line, then sums up) and the stops it sends belong to the first failure. So a log
cut anywhere after that line names the same root as the whole log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.core.types import ExitStatus, RankExit, RankFailure
from supervisor.core.watch import Hang, HangKind

_RANK_LINE = re.compile(r"^\s*\[(rank|default)(\d+)\]:")
_MONITOR = re.compile(r"\[RankMonServer\d*@[^\]:]*:(\d+)\]")
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_CLOSING = re.compile(r"Sending process (\d+) closing signal")
_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
_ENTRY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ENTRY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_SEPARATOR = re.compile(r"^\s*(?:-{8,}|={8,})\s*$")
_PROCESS_FAILURE = re.compile(
    r"(\d+): ProcessFailure\(local_rank=(\d+), pid=(\d+), exitcode=(-?\d+).*?timestamp=\d+\)"
)
_SECTION = re.compile(r"Section '([^']*)' has been open for ([\d.]+) seconds\. Timeout is ([\d.]+) seconds")
_OUT_OF_SECTION = re.compile(r"Was out of section for ([\d.]+) seconds\. Timeout is ([\d.]+) seconds")
_HEARTBEAT = re.compile(r"Did not get (initial|subsequent) heartbeat\. Waited ([\d.]+) seconds")
ROOT_CAUSE = "Root Cause (first observed failure)"

# the launcher's lines that say who failed or hung, as lower-case words (one ends
# with the newline: a report's entry headers and rules): a scan keeps them even
# where they hold none of ``supervisor.core.notable``'s keywords
STRUCTURE = (
    "local_rank", "root cause (first observed", "closing signal", "heartbeat", "was out of section",
    "has been open for", "processfailure(", "failed (exitcode", "failures:\n", "]:\n", "--------\n",
    "========\n",
)  # fmt: skip
# what only a launcher prints: tells its log from a rank's
_MARKERS = re.compile(
    r"^[IWEF]\d{4} [\d:.]+ +\d+ torch/distributed/\S+:\d+\]|failed \(exitcode: -?\d+\) local_rank: |"
    r"errors\.ChildFailedError|Root Cause \(first observed failure\)|\[ft_launcher\d*@|\[RankMonServer\d*@"
)


def _failed_pids(line: str) -> set[int]:
    """The pids a launcher's failure line names (none: not one)."""
    if m := _FAILED.search(line):
        return {int(m.group(3))}
    return {int(m.group(3)) for m in _PROCESS_FAILURE.finditer(line)}


def first_failure(lines: Sequence[str]) -> list[str]:
    """The lines of the log's first failure (see the module's docstring)."""
    first = next(((i, pids) for i, ln in enumerate(lines) if (pids := _failed_pids(ln))), None)
    if first is None:
        return list(lines)
    start, pids = first
    # the next failure of other processes: a later generation's (its lines are its own)
    stop = next((i for i in range(start + 1, len(lines)) if (n := _failed_pids(lines[i])) and not n & pids),
                len(lines))  # fmt: skip
    report = next((i for i in range(start + 1, stop)
                   if lines[i].strip() == "Failures:" or ROOT_CAUSE in lines[i]), None)  # fmt: skip
    if report is not None:  # it gave up on this failure: what it said to its report's end
        return list(lines[: _report_end(lines, report, stop)])
    # it went on: the next generation's lines follow; of this failure only the launcher's
    # own words (ft_launcher stops the other ranks after its failed line; a stop names
    # a pid, and one of a later generation's names none of this failure's ranks)
    return [*lines[: start + 1], *(ln for ln in lines[start + 1 : stop] if _failed_pids(ln) & pids
                                   or _CLOSING.search(ln))]  # fmt: skip


def _report_end(lines: Sequence[str], start: int, stop: int) -> int:
    """Where torchelastic's report that begins at ``start`` ends (past its closing rule)."""
    for i in range(start + 1, stop):
        if lines[i].strip().startswith("=") and _SEPARATOR.match(lines[i]):
            return i + 1
    return stop


def is_launcher_log(lines: Sequence[str]) -> bool:
    """Does this text come from torchrun or ft_launcher (not from one rank)?"""
    return any(_MARKERS.search(line) for line in lines)


# whose a line is: ("own" | "exit", "rank" | "local", number); None: the launcher's own
_Owner = tuple[str, str, int] | None


@dataclass
class _Rank:
    local: int | None = None
    pid: int | None = None
    status: ExitStatus | None = None
    hang: Hang | None = None


@dataclass
class _Log:
    lines: list[tuple[str, _Owner]] = field(default_factory=list)  # in the log's order
    ranks: dict[int, _Rank] = field(default_factory=dict)  # global rank ->
    local_to_global: dict[int, int] = field(default_factory=dict)
    local_exits: dict[int, tuple[ExitStatus, int]] = field(default_factory=dict)
    stopped_pids: set[int] = field(default_factory=set)
    hung_order: list[int] = field(default_factory=list)
    failed_order: list[int] = field(default_factory=list)  # local ranks, as torchrun reported them
    root: int | None = None  # global rank under "Root Cause"

    def rank(self, number: int) -> _Rank:
        return self.ranks.setdefault(number, _Rank())

    def add(self, line: str, owner: _Owner = None) -> None:
        self.lines.append((line, owner))

    def owner_rank(self, owner: tuple[str, str, int]) -> int:
        _, space, number = owner
        return number if space == "rank" else self.local_to_global.get(number, number)


def _status(code: int) -> ExitStatus:
    return ExitStatus(signal=-code) if code < 0 else ExitStatus(code=code)


def _hang(rank: int, line: str) -> Hang | None:
    if m := _SECTION.search(line):
        open_for, timeout = float(m.group(2)), float(m.group(3))
        kind, section = HangKind.SECTION, m.group(1)
    elif m := _OUT_OF_SECTION.search(line):
        open_for, timeout = float(m.group(1)), float(m.group(2))
        kind, section = HangKind.OUT_OF_SECTION, None
    elif m := _HEARTBEAT.search(line):
        # the monitor says only how long it waited: the timeout, give or take its check interval
        open_for = timeout = float(m.group(2))
        kind = HangKind.INITIAL_HEARTBEAT if m.group(1) == "initial" else HangKind.HEARTBEAT
        section = None
    else:
        return None
    return Hang(
        rank=rank, kind=kind, section=section, timeout=timeout, open_for=open_for,
        late_by=max(0.0, open_for - timeout),
    )  # fmt: skip


def _entry(log: _Log, lines: list[str], root: bool) -> None:
    """One ``[i]:`` entry of torchelastic's failure report."""
    rank = local = pid = None
    status: ExitStatus | None = None
    for line in lines:
        if m := _ENTRY_RANK.match(line):
            rank, local = int(m.group(1)), int(m.group(2))
        elif m := _ENTRY_EXIT.match(line):
            status, pid = _status(int(m.group(1))), int(m.group(2)) if m.group(2) else None
    if rank is None or local is None:
        for line in lines:
            log.add(line)
        return
    log.local_to_global[local] = rank
    r = log.rank(rank)
    r.local = local
    for line in lines:
        log.add(line, ("exit", "rank", rank))
    if status is not None:  # the report's word beats the agent's earlier line
        r.status, r.pid = status, pid if pid is not None else r.pid
    if root and log.root is None:
        log.root = rank


def _report(log: _Log, lines: Sequence[str], start: int, root: bool) -> int:
    """torchelastic's report after ``Failures:`` (or its root cause's header, ``root``):
    its entries; where it ends."""
    entry: list[str] = []
    i = start
    while i < len(lines):
        line = lines[i]
        if _ENTRY.match(line) or _SEPARATOR.match(line) or ROOT_CAUSE in line:
            if entry:
                _entry(log, entry, root)
            entry = [line] if _ENTRY.match(line) else []
            if not entry:
                log.add(line)
            root = root or ROOT_CAUSE in line
            if line.strip().startswith("=") and _SEPARATOR.match(line):
                return i + 1  # the report's last line
        elif entry:
            entry.append(line)
        else:
            log.add(line)
        i += 1
    if entry:
        _entry(log, entry, root)
    return i


def _process_failures(log: _Log, line: str) -> bool:
    """ft_launcher's one-line summary: one piece per local rank."""
    found = list(_PROCESS_FAILURE.finditer(line))
    for m in found:
        local = int(m.group(2))
        log.add(m.group(0), ("exit", "local", local))
        log.local_exits.setdefault(local, (_status(int(m.group(4))), int(m.group(3))))
    return bool(found)


def _line(log: _Log, line: str) -> None:
    if m := _RANK_LINE.match(line):
        log.add(line, ("own", "rank" if m.group(1) == "rank" else "local", int(m.group(2))))
    elif m := _MONITOR.search(line):
        rank = int(m.group(1))
        r = log.rank(rank)
        log.add(line, ("own", "rank", rank))
        hang = _hang(rank, line)
        if hang is not None and r.hang is None:
            r.hang = hang
            log.hung_order.append(rank)
    elif m := _FAILED.search(line):
        local = int(m.group(2))
        log.add(line, ("exit", "local", local))
        log.local_exits.setdefault(local, (_status(int(m.group(1))), int(m.group(3))))
        if local not in log.failed_order:
            log.failed_order.append(local)
    elif not _process_failures(log, line):
        if m := _CLOSING.search(line):
            log.stopped_pids.add(int(m.group(1)))
        log.add(line)


def _parse(lines: Sequence[str]) -> _Log:
    log = _Log()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "Failures:" or ROOT_CAUSE in line:
            log.add(line)
            i = _report(log, lines, i + 1, root=ROOT_CAUSE in line)
            continue
        _line(log, line)
        i += 1
    for _, owner in log.lines:  # every rank named, by its global rank once the report said it
        if owner is not None:
            r = log.rank(log.owner_rank(owner))
            if owner[1] == "local" and r.local is None:
                r.local = owner[2]
    for local, (status, pid) in log.local_exits.items():
        r = log.rank(log.local_to_global.get(local, local))
        if r.status is None:
            r.status, r.pid = status, pid
    return log


def _order(log: _Log) -> list[int]:
    first = [*log.hung_order]
    if log.root is not None:
        first.append(log.root)
    first += [log.local_to_global.get(local, local) for local in log.failed_order]
    chosen = list(dict.fromkeys(first))
    return chosen + sorted(r for r in log.ranks if r not in chosen)


def _texts(log: _Log, rank: int, hung: bool) -> tuple[str, ...]:
    """The rank's lines and the launcher's own, in the log's order. A hung rank's
    exit is the monitor's kill: what reports it says nothing of the cause."""
    return tuple(
        line
        for line, owner in log.lines
        if owner is None or (log.owner_rank(owner) == rank and not (hung and owner[0] == "exit"))
    )


def launcher_ranks(lines: Sequence[str], progressed: bool | None = None) -> list[RankFailure]:
    """One failure per rank the launcher's log names in its first failure, the root cause first."""
    log = _parse(first_failure(lines))
    out = []
    for i, number in enumerate(_order(log)):
        r = log.ranks[number]
        stopped = r.hang is not None or (r.pid is not None and r.pid in log.stopped_pids)
        local = number if r.local is None else r.local
        status = r.status or ExitStatus()
        exit = RankExit(local, number, r.pid or 0, status, float(i), 0.0, terminated=stopped)
        texts = _texts(log, number, r.hang is not None)
        out.append(RankFailure(exit, log_tail=texts, hang=r.hang, progressed=progressed))
    return out
