"""Start one rank process through the bootstrap and talk to it until the go.

Each rank runs in its own session (so its process group holds its descendants:
dataloader workers and the like), and, where the daemon has cgroups, in its
generation's cgroup, which holds even those that leave the group. Its stdout and
stderr are opened straight onto its per-generation log files: the rank writes
there itself, so nothing it logs depends on the daemon staying alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import orjson

from supervisor.core.program import Program
from supervisor.core.states import RankState, advance
from supervisor.core.topology import RankSlot
from supervisor.process.bootstrap import unidle
from supervisor.process.cgroups import UNCONTAINED, Containment

BOOTSTRAP = str(Path(__file__).with_name("bootstrap.py"))


def rank_argv(
    program: Program,
    boot_fd: int,
    parent_pid: int,
    cgroup: Path | None = None,
    *,
    idle: bool = False,
    fork_server: bool = False,
) -> list[str]:
    """The bootstrap's command line for one rank of ``program`` (or its fork server)."""
    wanted = (("fast-exit", program.fast_exit), ("idle", idle), ("fork-server", fork_server))
    flags = [flag for flag, on in wanted if on]
    return [
        program.python,
        "-u",
        BOOTSTRAP,
        str(boot_fd),
        str(parent_pid),
        "" if cgroup is None else str(cgroup),
        ",".join(program.preload),
        ",".join(flags),
        program.kind,
        program.target,
        *program.args,
    ]


@dataclass(frozen=True, slots=True)
class RankFiles:
    """Where one rank of one generation writes."""

    dir: Path
    stdout: Path
    stderr: Path
    error_file: Path

    @classmethod
    def under(cls, generation_dir: Path, local_rank: int) -> RankFiles:
        d = generation_dir / f"local_rank_{local_rank}"
        return cls(d, d / "stdout.log", d / "stderr.log", d / "error.json")


class OsProcess(Protocol):
    """What a rank's process must offer: ``asyncio.subprocess.Process`` for a spawned
    rank, ``forkserver.ForkedProcess`` for a forked one."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...


class RankProcess:
    """One rank's OS process, from spawn to reap.

    The pid is also the process group id (``start_new_session``), which is what
    the termination procedure signals; ``containment`` says what else holds the
    rank and its descendants (the generation's cgroup, or the fallback).
    """

    def __init__(
        self,
        *,
        slot: RankSlot,
        proc: OsProcess,
        boot: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        files: RankFiles,
        spawned_at: float,
        state: RankState,
        containment: Containment = UNCONTAINED,
    ) -> None:
        self.slot = slot
        self.containment = containment
        self.proc = proc
        self.files = files
        self.spawned_at = spawned_at
        self.state = state
        self._reader, self._writer = boot
        self._ready = asyncio.get_running_loop().create_task(self._read_ready())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def move_to(self, new: RankState) -> None:
        self.state = advance(self.state, new)

    async def _read_ready(self) -> bool:
        try:
            return await self._reader.readline() == b"ready\n"
        except (ConnectionError, OSError):
            return False

    @property
    def is_ready(self) -> bool:
        """Preloaded and waiting for its go, now."""
        r = self._ready
        return r.done() and not r.cancelled() and r.result()

    async def ready(self) -> bool:
        """True once the bootstrap finished its preload; False if it died first."""
        # shielded: a waiter that gives up must not cancel the reading itself
        return await asyncio.shield(self._ready)

    def hurry(self) -> None:
        """A standby released into its generation runs at full priority from now on,
        ready or not. One still preloading at idle priority is then always ahead of a
        rank spawned cold; one that is ready would otherwise wake to read its go at
        idle priority, which a busy node may not give it for seconds. Called after the
        go is written: a bootstrap that sets itself idle after this finds the go
        waiting and leaves idle priority at once."""
        unidle(self.pid)

    def go(self, env: Mapping[str, str]) -> None:
        """Release the rank into its generation with the late environment values."""
        # The channel stays open until the rank exits: closing it while the
        # bootstrap may still write "ready" would break its side of the pipe.
        self._writer.write(orjson.dumps({"env": dict(env)}) + b"\n")

    def close_boot(self) -> None:
        """Drop the boot channel; a standby that never got its go exits on EOF."""
        if not self._ready.done():
            self._ready.cancel()
        with contextlib.suppress(RuntimeError):
            self._writer.close()


@contextlib.contextmanager
def boot_channel(kind: int = socket.SOCK_STREAM) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A socket pair to a process about to be started: (ours, theirs). Theirs is closed
    once it has been handed over (the child holds its own copy); ours too if that failed."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
    try:
        yield ours, theirs
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()


async def connect_boot(ours: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Our end of the boot channel as streams. Stopped on the way (the daemon stops while
    it spawns), the channel is closed at once: the bootstrap, waiting for its go, sees EOF
    and exits, rather than when the socket is garbage-collected."""
    try:
        return await asyncio.open_unix_connection(sock=ours)
    except BaseException:
        ours.close()
        raise


async def exec_bootstrap(
    argv: list[str], channel: socket.socket, out: IO[bytes], err: IO[bytes], env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """The bootstrap in a session of its own, given ``channel`` and nothing on stdin."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        env=dict(env),
        pass_fds=(channel.fileno(),),
        start_new_session=True,
    )


async def spawn_rank(
    program: Program,
    slot: RankSlot,
    env: Mapping[str, str],
    files: RankFiles,
    *,
    now: float,
    standby: bool,
    containment: Containment = UNCONTAINED,
) -> RankProcess:
    files.dir.mkdir(parents=True, exist_ok=True)
    with boot_channel() as (ours, theirs), files.stdout.open("ab") as out, files.stderr.open("ab") as err:
        argv = rank_argv(program, theirs.fileno(), os.getpid(), containment.cgroup, idle=standby)
        proc = await exec_bootstrap(argv, theirs, out, err, env)
    boot = await connect_boot(ours)
    state = RankState.STANDBY if standby else RankState.RUNNING
    return RankProcess(slot=slot, proc=proc, boot=boot, files=files, spawned_at=now, state=state,
                       containment=containment)  # fmt: skip
