"""The kernel's log, read live: /dev/kmsg itself where this machine lets us, and its
record format."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import pytest

from supervisor.core.catalogue import Event
from supervisor.core.kmsg import about, parse_record
from supervisor.runtime.services.kernellog import KernelLog


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def emit(
        self, event: Event | str, level: int | None = None, *, quiet: tuple[str, ...] = (), **fields: Any
    ) -> None:
        if isinstance(event, Event):
            event, fields = event.NAME, event.values()
        self.seen.append((event, fields))


def test_a_record_as_dev_kmsg_hands_it_out() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    record = f"3,4711,12345678,-,caller=T1;{xid}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
    line = parse_record(record.encode())
    assert line is not None
    assert (line.seq, line.at, line.text) == (4711, 12.345678, xid)
    assert parse_record(b"garbage") is None and parse_record(b"3,x,1,-;t") is None
    assert len(parse_record(b"6,1,1,-;" + b"a" * 10_000).text) == 512  # type: ignore[union-attr]


OOM_KILL = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
            "oom_memcg={cg},task_memcg={cg},task=python3,pid={pid},uid=0")
KILLED = "Memory cgroup out of memory: Killed process {pid} (python3) total-vm:9000kB, anon-rss:8000kB"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


def test_the_oom_killer_is_evidence_only_about_our_own_processes() -> None:
    """Another job's process killed by the OOM killer is not why our rank failed; one of
    our ranks, or a process in our generation's cgroup (a rank's data loader), is.
    Hardware lines (an Xid names whatever process used the GPU) are the node's."""
    ours = "/sys/fs/cgroup/unified/ft-supervisor/run-ab12/gen-3"
    theirs = [OOM_KILL.format(cg="/slurm/job_7/step_0", pid=900), KILLED.format(pid=900)]
    by_rank = [KILLED.format(pid=77)]
    by_worker = [OOM_KILL.format(cg="/ft-supervisor/run-ab12/gen-3", pid=78), KILLED.format(pid=78)]
    lines = [*theirs, *by_rank, *by_worker, XID, "eth0: link up"]
    assert about(lines, {77}, {ours}) == (*by_rank, *by_worker, XID, "eth0: link up")
    # where there are no cgroups only the ranks themselves are known to be ours
    assert about(lines, {77}, set()) == (*by_rank, XID, "eth0: link up")
    # a cgroup whose name merely ends the same is another one
    assert about(by_worker, set(), {"/sys/fs/cgroup/other/gen-3"}) == ()
    assert about(by_worker, set(), {ours + "/"}) == tuple(by_worker)


KMSG_RW = os.access("/dev/kmsg", os.R_OK | os.W_OK)


@pytest.mark.skipif(not KMSG_RW, reason="/dev/kmsg is not readable and writable here")
@pytest.mark.asyncio
async def test_dev_kmsg_is_read_from_the_runs_start() -> None:
    """A line logged before the reader started is not the run's; one after it is. The
    line matches no rule: a test beside this one cannot be misled by it."""
    marker = f"ft-supervisor kernel log test {uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as k:
        k.write(f"before {marker}\n")
    sink = Sink()
    log = KernelLog(sink)
    assert log.start(), sink.seen
    try:
        since = time.monotonic() - 5.0
        with open("/dev/kmsg", "w") as k:
            k.write(f"after {marker}\n")
        deadline = time.monotonic() + 10.0
        while not any(marker in line for line in log.since(since)):
            assert time.monotonic() < deadline, "the line logged after the start never arrived"
            await asyncio.sleep(0.02)
        lines = [line for line in log.since(since) if marker in line]
        assert lines == [f"after {marker}"]
    finally:
        log.close()


@pytest.mark.asyncio
async def test_an_unreadable_kernel_log_is_said_once_and_supervision_goes_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sink = Sink()
    log = KernelLog(sink, path=str(tmp_path / "no-such-kmsg"))
    assert not log.start()
    assert [name for name, _ in sink.seen] == ["kernel_log_unavailable"]
    assert log.since(0.0) == ()
    log.close()
