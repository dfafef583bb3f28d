"""Fake ranks for the runtime's fast tier: the workload, not our components.

A fake rank stands where a rank's process would: the daemon spawns it through the
``Processes`` seam, hands it its go over a real socket pair (the boot channel),
signals it through the signaller, waits for its exit and reads its log and error
files. What it does is a script: an ``async def`` that talks to the daemon with the
client's own messages (signed with the rank's key, admitted by the real inbox),
sleeps on the daemon's clock (virtual time), writes its logs, and exits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from supervisor.core.program import Program
from supervisor.core.standby_start import CpuRoom
from supervisor.core.states import RankState
from supervisor.core.topology import ENV_KEY, RankSlot
from supervisor.process.cgroups import Containment
from supervisor.process.spawn import RankFiles, RankProcess, connect_boot
from supervisor.process.terminate import Signaller
from supervisor.runtime.lifecycle.processes import Processes
from supervisor.transport.schema import encode

# above any pid_max (2**22 at most on Linux): a signal or a /proc read never reaches a real process
FAKE_PIDS = itertools.count(1 << 23)


@dataclass
class Behaviour:
    """How a fake rank answers what the daemon does to it."""

    preload: float = 0.0  # seconds before it says it is ready (a standby preloading)
    ignores_term: bool = False  # only SIGKILL ends it (a teardown stuck on a peer)
    unkillable: bool = False  # not even SIGKILL (a process stuck in the kernel)


Script = Callable[["Rank"], Awaitable[int | None]]


class FakeProcess:
    """What ``RankProcess.proc`` needs: a pid, a return code, a wait."""

    def __init__(self) -> None:
        self.pid = next(FAKE_PIDS)
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.signals: list[int] = []  # to its process group
        self.direct: list[int] = []  # to the process alone (a stack dump)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set_result(code)


class Rank:
    """One fake rank: what its script can do."""

    def __init__(
        self, ranks: FakeRanks, slot: RankSlot, env: Mapping[str, str], files: RankFiles, behaviour: Behaviour
    ) -> None:
        self.ranks, self.slot, self.env, self.files, self.behaviour = ranks, slot, dict(env), files, behaviour
        self.proc = FakeProcess()
        self.identity = f"fake-{self.proc.pid}".encode()
        self.rank = slot.rank
        self.generation = int(env["TORCHELASTIC_RESTART_COUNT"])
        self._task: asyncio.Task[None] | None = None
        self.stack_signal: int | None = None
        self.stacks = ""  # what its faulthandler would dump now: set by its script
        self.booting: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None  # SIGSTOPped: SIGCONT resolves it

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- what the daemon does to it ---------------------------------------------------

    @property
    def state(self) -> str | None:
        """Its /proc state letter: T while stopped, None once it exited."""
        if self.proc.returncode is not None:
            return None
        return "T" if self.stopped else "S"

    @property
    def stopped(self) -> bool:
        return self._stopped is not None and not self._stopped.done()

    def signal(self, signum: int) -> None:
        self.proc.signals.append(signum)
        if signum == signal.SIGCONT:
            self._resume()
        if signum in (signal.SIGCONT, 0) or self.proc.returncode is not None or self.behaviour.unkillable:
            return
        if signum == signal.SIGKILL:
            if not self.behaviour.unkillable:
                self._end(-signal.SIGKILL)
        elif not self.behaviour.ignores_term:
            self._end(-signum)

    def signal_process(self, signum: int) -> bool:
        """A signal to the process alone (a stack dump), not its group."""
        if self.proc.returncode is not None:
            return False
        self.proc.direct.append(signum)
        if signum == signal.SIGCONT:
            self._resume()
        elif signum == self.stack_signal and self.stacks and not self.stopped:  # a stopped one answers later
            self.log(self.stacks)
        elif signum not in (signal.SIGSTOP, self.stack_signal):
            self.signal(signum)
        return True

    def _resume(self) -> None:
        if self.stopped:
            assert self._stopped is not None
            self._stopped.set_result(None)

    def _end(self, code: int) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.proc.exit(code)

    async def boot(self, sock: socket.socket) -> None:
        """The bootstrap's part: ready, then the go (EOF: a standby dropped unused)."""
        writer = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            if self.behaviour.preload:
                await self.ranks.clock.sleep(self.behaviour.preload)
            writer.write(b"ready\n")
            try:
                line = await reader.readline()
            except ConnectionError:
                line = b""
            if not line:  # the daemon let go of it before its go
                self.proc.exit(0)
                return
            self.env.update(orjson.loads(line)["env"])
            self._task = asyncio.ensure_future(self._run())
        finally:
            if writer is None:
                sock.close()
            else:
                writer.close()

    async def _run(self) -> None:
        try:
            code = await self.ranks.script(self)
        except asyncio.CancelledError:
            return
        self.proc.exit(0 if code is None else code)

    # -- what its script can do -------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        await self.ranks.clock.sleep(seconds)

    async def hang(self) -> None:
        await asyncio.get_running_loop().create_future()

    async def stop(self) -> None:
        """It SIGSTOPs itself: frozen (state T) until a SIGCONT, then it runs on."""
        self._stopped = asyncio.get_running_loop().create_future()
        await self._stopped

    def send(self, kind: str, **fields: Any) -> None:
        """A client message, signed with this rank's key, into the daemon's inbox."""
        payload = encode(kind, rank=self.rank, gen=self.generation, k=self.env[ENV_KEY], **fields)
        self.ranks.deliver([self.identity, payload])

    def hello(self, *, stack_signal: int | None = None) -> None:
        """What the client says first; with ``stack_signal``, it dumps its stacks on it."""
        self.stack_signal = stack_signal
        self.send("hello", pid=self.pid, stack_signal=stack_signal)

    def heartbeat(self) -> None:
        self.send("heartbeat")

    async def step(self, iteration: int, seconds: float = 1.0) -> None:
        """One training step in a ``step`` section: open, work, close with its iteration."""
        self.send("section", op="open", name="step")
        await self.sleep(seconds)
        self.send("section", op="close", name="step", iteration=iteration)

    async def train(self, steps: int, seconds: float = 1.0, first: int = 0) -> None:
        for i in range(first, first + steps):
            await self.step(i, seconds)

    def log(self, text: str, *, stream: str = "stderr") -> None:
        path = self.files.stderr if stream == "stderr" else self.files.stdout
        with path.open("a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def raise_(self, exc_type: str, message: str) -> int:
        """What an uncaught exception leaves: a traceback in the log, torchelastic's error
        file, and exit code 1."""
        where = '  File "train.py", line 7, in <module>'
        trace = f"Traceback (most recent call last):\n{where}\n{exc_type}: {message}"
        self.log(trace)
        error = {"message": {"message": f"{exc_type}: {message}",
                             "extraInfo": {"py_callstack": trace, "timestamp": "0"}}}  # fmt: skip
        self.files.error_file.write_text(json.dumps(error))
        return 1


class FakeSignaller(Signaller):
    def __init__(self, ranks: FakeRanks) -> None:
        self._ranks = ranks

    def group(self, pgid: int, signum: int) -> None:
        rank = self._ranks.by_pid.get(pgid)
        if rank is not None:
            rank.signal(signum)

    def process(self, pid: int, signum: int) -> bool:
        rank = self._ranks.by_pid.get(pid)
        return rank is not None and rank.signal_process(signum)

    def state(self, pid: int) -> str | None:
        rank = self._ranks.by_pid.get(pid)
        return None if rank is None else rank.state


@dataclass
class _Guard:
    pid: int = -1

    async def close(self, timeout: float = 5.0) -> None:
        return None


BUSY_CPU = CpuRoom(cpus=1, online=1, load=1.0)


@dataclass
class FakeRanks:
    """Every fake rank of a test, and the ``Processes`` the daemon is given."""

    script: Script
    clock: Any  # the daemon's clock (LoopClock)
    behaviour: Callable[[int, int], Behaviour] = lambda generation, rank: Behaviour()
    by_pid: dict[int, Rank] = field(default_factory=dict)
    spawned: list[Rank] = field(default_factory=list)
    deliver: Callable[[list[bytes]], None] = lambda frames: None  # set once the daemon exists
    # the node's CPUs as a generation launches: one, busy, unless a test says otherwise
    # (standbys then wait for the ranks' steps, whatever the machine running the test)
    room: CpuRoom = BUSY_CPU

    def processes(self) -> Processes:
        async def guard(_: bytes) -> _Guard:
            return _Guard()

        return Processes(spawn=self.spawn, signaller=FakeSignaller(self), guard=guard, adopt_orphans=False,
                         cpu_room=lambda: self.room)  # fmt: skip

    async def spawn(
        self, program: Program, slot: RankSlot, env: Mapping[str, str], files: RankFiles, *, now: float,
        standby: bool, containment: Containment,
    ) -> RankProcess:  # fmt: skip
        files.dir.mkdir(parents=True, exist_ok=True)
        for path in (files.stdout, files.stderr):
            path.touch()
        generation = int(env["TORCHELASTIC_RESTART_COUNT"])
        rank = Rank(self, slot, env, files, self.behaviour(generation, slot.rank))
        self.by_pid[rank.pid] = rank
        self.spawned.append(rank)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        rank.booting = asyncio.ensure_future(rank.boot(theirs))  # held: the loop holds tasks weakly
        boot = await connect_boot(ours)
        return RankProcess(slot=slot, proc=rank.proc, boot=boot, files=files, spawned_at=now,
                           state=RankState.STANDBY if standby else RankState.RUNNING,
                           containment=containment)  # fmt: skip

    async def close(self) -> None:
        """End what is left of every fake rank (the daemon has returned); a rank whose boot
        channel the daemon closed first reads its EOF and exits, as the bootstrap does."""
        for _ in range(3):
            await asyncio.sleep(0)
        tasks = [t for r in self.spawned for t in (r.booting, r._task) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(3):  # transports close on the next turns of the loop
            await asyncio.sleep(0)

    def of(self, generation: int) -> list[Rank]:
        return [r for r in self.spawned if r.generation == generation]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
