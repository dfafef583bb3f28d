"""The node's fork server: one process pays the preload, every rank is forked from it.

``import torch`` costs 2.5-3.5 CPU-s here and more on a GPU node; spawned ranks pay
it once per rank per generation (standbys included), all on the node's CPUs. The
fork server (``bootstrap.py`` with the ``fork-server`` flag) imports the preload
once; each rank is then a copy-on-write fork of it that is ready in milliseconds,
sharing the preloaded pages until it writes them. A forked rank is reparented to
the daemon (its subreaper), which waits for it through a pidfd, so it ends, is
signalled and is reaped exactly like a spawned one.

A forked rank inherits what the preload left: the same hash seed on every rank (a
spawned rank draws its own) and libraries initialised under the server's
environment (what every rank of the node shares; the rank's own variables are set
before its program runs). NumPy's global generator is reseeded; Python's
``random`` reseeds itself. ``--no-fork-server`` spawns every rank afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path

import orjson

from supervisor.core.program import Program
from supervisor.core.states import RankState
from supervisor.core.topology import RankSlot
from supervisor.process.cgroups import UNCONTAINED, Containment
from supervisor.process.spawn import (
    RankFiles,
    RankProcess,
    boot_channel,
    connect_boot,
    exec_bootstrap,
    rank_argv,
)

READY_TIMEOUT = 120.0  # the server's preload: a cold import of torch on a busy node
PID_TIMEOUT = 10.0  # from a fork request to the rank's pid (the bootstrap waits 10 s for adoption)


class ForkedProcess:
    """A forked rank's process, which the daemon adopted: ``wait()`` and ``returncode``
    as ``asyncio.subprocess.Process`` has them, through a pidfd."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._fd = os.pidfd_open(pid)
        loop.add_reader(self._fd, self._check)
        self._check()  # it may have died before the reader was in place

    def _check(self) -> None:
        try:
            got, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            got, status = self.pid, 255 << 8  # reaped by someone else: its status is lost
        if got != self.pid:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self.returncode = os.waitstatus_to_exitcode(status)
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ForkServer:
    """The daemon's end of one fork server, for one program."""

    def __init__(self, proc: asyncio.subprocess.Process, channel: socket.socket) -> None:
        self.proc = proc
        self._channel = channel
        self._lock = asyncio.Lock()
        self.ready_after: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, program: Program, env: Mapping[str, str], log: Path) -> ForkServer:
        """Start the server in its own session, outside any generation's cgroup (a
        generation's end must not end it); ``env`` is what every rank shares."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with boot_channel(socket.SOCK_SEQPACKET) as (ours, theirs), log.open("ab") as out:
            argv = rank_argv(program, theirs.fileno(), os.getpid(), fork_server=True)
            proc = await exec_bootstrap(argv, theirs, out, out, env)
        ours.setblocking(False)
        return cls(proc, ours)

    async def ready(self, timeout: float = READY_TIMEOUT) -> str | None:
        """Wait for the server's preload: None once it is ready, else why it is not."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                said = await loop.sock_recv(self._channel, 64)
        except TimeoutError:
            return f"it took over {timeout:.0f} s to preload"
        except OSError as exc:
            return f"its channel failed: {exc.strerror or exc}"
        if said == b"ready\n":
            return None
        if said.startswith(b"unforkable "):
            device = said.split()[1].decode(errors="replace")
            return f"the preload initialised {device}, which a forked process cannot use"
        return "it died while preloading"

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def fork(
        self,
        slot: RankSlot,
        env: Mapping[str, str],
        files: RankFiles,
        *,
        now: float,
        standby: bool,
        containment: Containment = UNCONTAINED,
    ) -> RankProcess:
        """A rank forked from the server; raises OSError when the server cannot
        give one (dead, or no answer within ``PID_TIMEOUT``)."""
        files.dir.mkdir(parents=True, exist_ok=True)
        request = orjson.dumps(
            {"env": dict(env), "cgroup": "" if containment.cgroup is None else str(containment.cgroup)}
        )
        with boot_channel() as (ours, theirs), files.stdout.open("ab") as out, files.stderr.open("ab") as err:
            async with self._lock:
                socket.send_fds(self._channel, [request], [theirs.fileno(), out.fileno(), err.fileno()])
        ours.setblocking(False)
        boot = await connect_boot(ours)
        reader, writer = boot
        try:
            async with asyncio.timeout(PID_TIMEOUT):
                line = await reader.readline()
            pid = int(line.removeprefix(b"pid ").strip())
            proc = ForkedProcess(pid)
        except (TimeoutError, ValueError, OSError) as exc:
            writer.close()
            raise OSError(f"the fork server gave no rank: {exc or type(exc).__name__}") from exc
        state = RankState.STANDBY if standby else RankState.RUNNING
        return RankProcess(slot=slot, proc=proc, boot=boot, files=files, spawned_at=now, state=state,
                           containment=containment)  # fmt: skip

    def kill(self) -> None:
        """End it now (the event loop reaps it)."""
        with contextlib.suppress(OSError):
            self._channel.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self, timeout: float) -> None:
        """EOF ends the server; it is killed if it has not gone within ``timeout``."""
        with contextlib.suppress(OSError):
            self._channel.close()
        try:
            async with asyncio.timeout(timeout):
                await self.proc.wait()
        except TimeoutError:
            self.kill()
            await self.proc.wait()
