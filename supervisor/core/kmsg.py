"""The kernel's log as /dev/kmsg hands it out: one record per read,
``PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];TEXT`` then continuation lines
(`` KEY=value``, dropped here). Pure: bytes in, a line out."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

TEXT_MAX = 512  # characters of a kernel line kept: an Xid line is under 200
# The OOM killer names its victim: "oom-kill:...,task_memcg=/a/b,task=python3,pid=N,uid=0",
# then "[Memory cgroup ]Out of memory: Killed process N (python3) ...", and the reaper's
# "oom_reaper: reaped process N (python3)..."
_OOM_KILL = re.compile(r"\boom-kill:.*\btask_memcg=(?P<memcg>[^,]*),.*\bpid=(?P<pid>\d+)")
_VICTIM = re.compile(r"\b(?:Killed|reaped) process (?P<pid>\d+)|\boom-kill:.*\bpid=(?P<kpid>\d+)")


@dataclass(frozen=True, slots=True)
class KernelLine:
    seq: int
    at: float  # seconds since boot (the kernel's clock; CLOCK_MONOTONIC in practice)
    text: str


def parse_record(raw: bytes) -> KernelLine | None:
    """One record, or None for anything that is not one."""
    header, sep, body = raw.partition(b";")
    if not sep:
        return None
    fields = header.split(b",")
    if len(fields) < 3:
        return None
    try:
        seq, micros = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    text = body.split(b"\n", 1)[0].decode("utf-8", "replace")
    return KernelLine(seq, micros / 1e6, text[:TEXT_MAX])


def _under(memcg: str, cgroups: Iterable[str]) -> bool:
    """Whether the kernel's memory cgroup ``memcg`` (named from its hierarchy's root) is
    one of ``cgroups`` or below one (absolute paths, under wherever the hierarchy is
    mounted: /sys/fs/cgroup, /sys/fs/cgroup/unified...)."""
    parts = [p for p in memcg.split("/") if p]
    heads = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(c.rstrip("/").endswith(head) for c in cgroups for head in heads)


def about(lines: Iterable[str], pids: Collection[int], cgroups: Collection[str]) -> tuple[str, ...]:
    """The kernel lines that may concern the processes ``pids`` (a generation's ranks)
    and the cgroups holding them and their descendants: the OOM killer's lines about
    another process on the node are not this generation's evidence (a job beside ours
    that ran out of memory must not make our rank's failure an OOM kill). Lines that
    name no process (an Xid, an ECC error: the node's hardware) are everyone's."""
    lines = list(lines)
    ours = set(pids)
    for line in lines:
        m = _OOM_KILL.search(line)
        if m is not None and _under(m["memcg"], cgroups):
            ours.add(int(m["pid"]))
    kept = []
    for line in lines:
        m = _VICTIM.search(line)
        if m is None or int(m["pid"] or m["kpid"]) in ours:
            kept.append(line)
    return tuple(kept)
