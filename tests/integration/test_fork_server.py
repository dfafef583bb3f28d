"""Ranks forked from one process that paid the preload (``supervisor.process.forkserver``).

A node imports torch once, not once per rank per generation: the fork server imports
the preload, each rank is a fork of it that the daemon adopts and treats as one it
spawned (exit statuses, signals, its own session, death with the daemon). A server
that is lost costs nothing but the saving: the ranks after it are spawned.

The preload here is ``costly_preload``, which burns a CPU-second at import as ``import
torch`` does: a rank that paid it has used that much CPU when its program begins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import RANKS, Daemon, alive, rank_pids, wait_until

FORKED = str(RANKS / "forked.py")
PRELOAD = ("--preload", "numpy.random,costly_preload")
Start = Callable[..., Daemon]
PAID = 1.0  # CPU seconds the preload costs whoever imports it


def _env() -> dict[str, str]:
    return {**os.environ, "FT_TEST_PRELOAD_CPU": str(PAID)}


def _facts(d: Daemon, generation: int) -> dict[int, dict[str, Any]]:
    """What each rank of ``generation`` said about its birth, by rank."""
    run_dir = d.run_dir()
    assert run_dir is not None
    said = {}
    for out in sorted((run_dir / f"gen_{generation}").glob("local_rank_*/stdout.log")):
        lines = out.read_text().splitlines()
        if lines:  # it may not have said it yet
            facts = json.loads(lines[0])
            said[facts["rank"]] = facts
    return said


def _status(d: Daemon) -> str:
    argv = [sys.executable, "-m", "supervisor", "status", "--pid", str(d.pid)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_ranks_are_forked_from_one_preload_and_exit_as_spawned_ones_do(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--max-restarts", "1", *PRELOAD, FORKED, "--exit", "3", env=_env())
    assert d.wait() == 0, d.story()
    (server,) = d.events("fork_server")
    assert server["mode"] == "on" and server["modules"] == ["numpy.random", "costly_preload"]
    spawned = d.events("rank_spawned")
    assert spawned and all(e["forked"] for e in spawned), spawned
    (failed,) = [e for e in d.events("rank_exited") if e["generation"] == 0 and e["rank"] == 1]
    assert failed["exit_code"] == 3 and failed["state"] == "failed"  # the status, through the pidfd
    for generation in (0, 1):  # generation 1 from standbys forked while generation 0 ran
        facts = _facts(d, generation)
        assert sorted(facts) == [0, 1]
        for f in facts.values():
            assert f["preloaded"] and f["cpu"] < PAID / 2, f  # the server paid it, once
            assert f["ppid"] == d.pid, f  # adopted: the daemon waits for it
            assert f["pdeathsig"] == signal.SIGKILL, f  # and it dies with the daemon
            assert f["sid"] == f["pgid"] == f["pid"], f  # its own session and group, as spawned
            assert f["env_rank"] == str(f["rank"])
        # a fork would share the server's generator; a fresh interpreter draws its own
        assert facts[0]["numpy"] != facts[1]["numpy"]
    assert not alive(server["pid"])  # ended with the run


def test_no_fork_server_spawns_every_rank(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--max-restarts", "0", "--no-fork-server", *PRELOAD, FORKED,
              env=_env())  # fmt: skip
    assert d.wait() == 0, d.story()
    (server,) = d.events("fork_server")
    assert server["mode"] == "off" and "--no-fork-server" in server["why"]
    assert not any(e["forked"] for e in d.events("rank_spawned"))
    # each imports what it can of the preload itself, until its go comes
    assert len(_facts(d, 0)) == 2


def test_signals_reach_forked_ranks_and_a_lost_server_leaves_spawning(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--max-restarts", "3", "--no-standby", *PRELOAD, FORKED, "--forever",
              env=_env())  # fmt: skip
    (server,) = d.wait_event("fork_server")
    d.wait_event("generation_started")
    os.kill(rank_pids(d, 0)[0], signal.SIGKILL)
    (killed,) = d.wait_event("rank_exited", where=lambda e: e["generation"] == 0 and e["rank"] == 0)
    assert killed["signal"] == "SIGKILL", killed
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    assert all(e["forked"] for e in d.events("rank_spawned"))
    assert f"fork server: pid {server['pid']}, numpy.random,costly_preload imported in" in _status(d)
    os.kill(server["pid"], signal.SIGKILL)
    wait_until(lambda: not alive(server["pid"]), 10, "the fork server to die")
    os.kill(rank_pids(d, 1)[1], signal.SIGKILL)
    d.wait_event("generation_started", where=lambda e: e["generation"] == 2)
    (lost,) = d.events("fork_server_lost")
    assert lost["pid"] == server["pid"]
    after = [e for e in d.events("rank_spawned") if e["generation"] == 2]
    assert len(after) == 2 and not any(e["forked"] for e in after)  # spawned, and they run
    wait_until(lambda: len(_facts(d, 2)) == 2, 30, "generation 2's ranks to start")
    assert "fork server: off (the fork server was lost)" in _status(d)
    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.story()


def test_forked_ranks_and_their_server_die_with_a_killed_daemon(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--max-restarts", "1", "--no-standby", "--preload", "numpy", FORKED,
              "--forever")  # fmt: skip
    (server,) = d.wait_event("fork_server")
    d.wait_event("generation_started")
    ranks = rank_pids(d, 0)
    wait_until(lambda: len(_facts(d, 0)) == 2, 30, "the ranks to start")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    # PDEATHSIG, armed once the daemon had adopted them
    wait_until(lambda: not any(alive(p) for p in (*ranks, server["pid"])), 10, "ranks and server to die")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--preload", "none", FORKED), "--preload none"),
        (("--no-python", "true"), "--no-python"),
        # a fork's descendants carry the server's environment, which the token sweep reads
        (("--no-cgroups", "--preload", "numpy", FORKED), "no cgroup per generation"),
    ],
)
def test_where_a_fork_would_break_a_promise_there_is_no_server(
    start: Start, args: tuple[str, ...], why: str
) -> None:
    d = start("--nproc-per-node", "1", *args)
    assert d.wait() == 0, d.story()
    (server,) = d.events("fork_server")
    assert server["mode"] == "off" and why in server["why"], server
    assert not any(e["forked"] for e in d.events("rank_spawned"))


def test_a_preload_that_sets_up_cuda_is_not_forked(start: Start) -> None:
    d = start("--nproc-per-node", "2", "--preload", "cuda_context", FORKED)
    assert d.wait() == 0, d.story()
    (server,) = d.events("fork_server")
    assert server["mode"] == "off" and "initialised cuda" in server["why"], server
    assert len(_facts(d, 0)) == 2 and not any(e["forked"] for e in d.events("rank_spawned"))


def test_a_stop_while_the_server_preloads_is_not_held_up_by_it(start: Start) -> None:
    # a preload that would take 60 CPU-s: the stop must not wait for it
    env = {**os.environ, "FT_TEST_PRELOAD_CPU": "60"}
    d = start("--nproc-per-node", "2", *PRELOAD, FORKED, env=env)

    def server() -> int | None:
        for child in Path(f"/proc/{d.pid}/task/{d.pid}/children").read_text().split():
            if b"fork-server" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        return None

    preloading = wait_until(server, 30, "the fork server to start")
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=15) == 128 + signal.SIGTERM, d.story()
    wait_until(lambda: not alive(preloading), 10, "the fork server to be gone")
    assert not d.events("fork_server") and not d.events("generation_started")
