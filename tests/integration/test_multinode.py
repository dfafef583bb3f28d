"""Several daemons on loopback as one multi-node job, through torch's c10d rendezvous.

Each daemon is a "node" with its own directory. The rendezvous store is hosted by the
test itself, as a stable endpoint would be in production, so that any daemon may be
killed or sent away without taking the store with it. Real ranks (scripts/train.py
over gloo, ``--plain``: its gradients all-reduced by hand, where DDP and torch.optim
would import torch._dynamo in every rank) run across the nodes where the ranks' own
world is what is verified: a crash that restarts every node, then a node that joins
and grows the job, in one job. The tests whose subject is the daemons (status, a
killed daemon, a spare, min/max, an abort) run torch-free ranks that step through
supervisor.client (tests/fixtures/ranks/steps.py) or write their environment. Every
daemon imports torch for its rendezvous (~2.8 CPU-s): each test starts as few as its
proof needs, and one job proves what needs the same daemons.
The torch-free ranks run with ``--preload none``, the gloo ones with torch's (``node``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.process.native import FLIGHT_RECORDER
from supervisor.process.ports import free_port
from tests.support import RANKS, TRAIN, Daemon, wait_until

pytestmark = [pytest.mark.torch, pytest.mark.slow]
Start = Callable[..., Daemon]
KEEP_ALIVE = 1  # seconds; torch calls a node dead after KEEP_ALIVE * ATTEMPTS without one
ATTEMPTS = 3
FAILS = str(RANKS / "fails.py")
STEPS = str(RANKS / "steps.py")


# The torch-free ranks need no preload. The gloo ranks get torch's (the default): each
# node's fork server imports it once (2.5 CPU-s), and every rank and standby is forked
# from it, where spawned ones would each import it again.
PRELOAD_NONE = ("--preload", "none")
PRELOAD_TORCH = ("--preload", "auto")


def node(
    endpoint: str, nnodes: str = "2", join_timeout: int = 60, *extra: str, last_call: int = 1
) -> list[str]:
    conf = (
        f"is_host=0,keep_alive_interval={KEEP_ALIVE},keep_alive_max_attempt={ATTEMPTS},"
        f"last_call_timeout={last_call},join_timeout={join_timeout}"
    )
    return [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--local-addr", "127.0.0.1", "--rdzv-conf", conf,
        "--max-restarts", "2", *PRELOAD_NONE, *extra,
    ]  # fmt: skip


def train(tmp: Path, steps: int, *extra: str) -> list[str]:
    snapshot = str(tmp / "snap.pt")
    return [str(TRAIN), "--steps", str(steps), "--step-time", "0.02", "--snapshot", snapshot, *extra]


def steps(*extra: str) -> list[str]:
    """train.py's loop and faults without torch (the same arguments)."""
    return [STEPS, "--step-time", "0.02", *extra]


def joined(d: Daemon, generation: int = 0) -> dict[str, Any]:
    hits = d.wait_event("rendezvous_joined", 90, where=lambda e: e["generation"] == generation)
    return hits[0]


def test_ranks_get_torchruns_environment_and_an_abort_on_one_node_stops_every_node_with_exit_2(
    start: Start, endpoint: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "OMP_", "TORCH"))}
    theirs = []
    port = free_port()
    for n in range(2):
        out = tmp_path / f"torchrun{n}"
        out.mkdir()
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t",
            "--local-addr", "127.0.0.1", "--rdzv-conf", "last_call_timeout=1",
            str(RANKS / "envdump.py"), str(out),
        ]  # fmt: skip
        theirs.append(subprocess.Popen(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
    # Our job's ranks write the same, and then its last rank (on node 1) fails in a way
    # retrying cannot help while the others wait to be stopped: the abort reaches node 0
    # through the rendezvous store. The adopted decision and reason.json are
    # tests/fast/test_multinode_fast.py's.
    ours = tmp_path / "ours"
    ours.mkdir()
    args = node(endpoint)
    args[args.index("--nproc-per-node") + 1] = "2"
    daemons = [start(*args, str(RANKS / "envdump.py"), str(ours), "--abort", env=env) for _ in range(2)]
    assert [p.wait(120) for p in theirs] == [0, 0]
    assert [d.wait(120) for d in daemons] == [2, 2], daemons[0].stderr() + daemons[1].stderr()
    assert [d.events("job_decision")[0]["action"] for d in daemons] == ["abort", "abort"]

    def by_rank(dirs: list[Path]) -> dict[str, dict[str, str]]:
        envs = [json.loads(f.read_text())["env"] for d in dirs for f in d.glob("rank*.json")]
        return {e["RANK"]: e for e in envs}

    a, b = by_rank([tmp_path / "torchrun0", tmp_path / "torchrun1"]), by_rank([ours])
    assert sorted(a) == sorted(b) == ["0", "1", "2", "3"]
    same = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")  # fmt: skip
    for rank in a:
        assert {k: a[rank][k] for k in same} == {k: b[rank][k] for k in same}, rank
        ours_only = {k for k in b[rank] if k.startswith("FT_SUPERVISOR_")} | FLIGHT_RECORDER
        ours_only.add("FAULT_TOL_FINISHED_FLAG_FILE")  # always given: "training finished" has a place
        # torch's own opt-out of sharing the agent's store: we never use it
        assert set(a[rank]) == set(b[rank]) - ours_only - {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    # one master for the whole job, picked by node 0, a fresh port
    assert len({e["MASTER_PORT"] for e in b.values()}) == 1


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_nodes_that_run_different_numbers_of_ranks_end_the_job_with_exit_2_saying_so(
    start: Start, endpoint: str, tmp_path: Path, backend: str
) -> None:
    # Each node numbers its ranks from its own --nproc-per-node: a node of 1 and a node
    # of 2 would give two ranks one number and every rank a world that never fills. The
    # node that finds itself different (whichever completes the round second) ends the
    # job: both leave at once with the abort code, and it names the cause.
    if backend == "static":
        one = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "static", "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), *PRELOAD_NONE]  # fmt: skip
        ranked = [[*one, "--node-rank", str(k)] for k in (0, 1)]
    else:
        ranked = [node(endpoint)] * 2
    one, two = ranked[0], [*ranked[1]]
    two[two.index("--nproc-per-node") + 1] = "2"
    ranks = steps("--until", str(tmp_path / "never"))
    daemons = [start(*one, *ranks), start(*two, *ranks)]
    assert [d.wait(90) for d in daemons] == [2, 2], daemons[0].stderr() + daemons[1].stderr()
    reasons = [json.loads((d.run_dir() / "reason.json").read_text()) for d in daemons]  # type: ignore[operator]
    found = [r["decision"] for r in reasons if r["decision"]["reason"] == "layout"]
    assert len(found) == 1, reasons
    assert "every node of a job must run the same number (--nproc-per-node)" in found[0]["detail"], found
    assert all(r["outcome"] == "abort" for r in reasons), reasons


def test_on_the_static_backend_a_crash_restarts_both_nodes_and_the_job_ends_with_exit_0(
    start: Start, tmp_path: Path
) -> None:
    # SLURM-style fixed node ranks, no rendezvous server: node 0 hosts the store. Until
    # 2026-11-28 no node heard a round's decision there, and every generation's end waited
    # forever (the listeners read under another prefix than the round wrote).
    port = str(free_port())
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "static", "--master-addr",
              "127.0.0.1", "--master-port", port, "--max-restarts", "1", *PRELOAD_NONE)  # fmt: skip
    ranks = steps("--steps", "30", "--crash-at-step", "10", "--crash-rank", "1")
    daemons = [start(*common, "--node-rank", str(k), *ranks) for k in (0, 1)]
    assert [d.wait(90) for d in daemons] == [0, 0], daemons[0].stderr() + daemons[1].stderr()
    for d in daemons:
        assert [e["action"] for e in d.events("job_decision")] == ["restart", "continue"], d.story()


def test_status_lists_every_node_a_killed_daemon_is_noticed_and_a_replacement_joins(
    start: Start, endpoint: str, tmp_path: Path
) -> None:
    # One job, three daemons, for what needs real daemons on a real store: the status
    # command on any node lists every node; a SIGKILLed daemon is noticed through the
    # keep-alive and a replacement joins on the job's budget; a SIGTERMed one is heard
    # by its peer as having ended. The ranks step until they are stopped (--until a file
    # never made: a rank that started in a tenth of a second would otherwise finish a
    # fixed number of steps before the kill).
    args = (*node(endpoint), *steps("--until", str(tmp_path / "never")))
    d0 = start(*args)
    d1 = start(*args)
    lost = joined(d1)["node_rank"]
    joined(d0)
    # the daemon reads the node table only when asked, in the background: the command
    # asks again until it has it, so the very first status already lists both nodes
    first = subprocess.run([sys.executable, "-m", "supervisor", "status", "--pid", str(d1.pid), "--json"],
                           capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert len(json.loads(first.stdout)["job"]["nodes"]) == 2, first.stdout

    def listing() -> str | None:
        out = subprocess.run(
            [sys.executable, "-m", "supervisor", "status", "--pid", str(d1.pid)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        nodes = out.stdout.partition("\nNODE ")[2]  # the job's node table, after the ranks
        return out.stdout if nodes.count(" running ") == 2 else None

    table = wait_until(listing, 30, "both nodes running in the status of node 1", interval=0.5)
    assert "job: this node is" in table
    d0.wait_event("rank_spawned", 60, where=lambda e: e["generation"] == 1)  # warm: every rank has stepped
    killed_at = time.time()
    d1.signal(signal.SIGKILL)
    d1.wait(10)
    decision = d0.wait_event("job_decision", 60)[0]
    outcomes = {o["node_rank"]: o for o in decision["outcomes"]}
    assert outcomes[lost]["reason"] == "node_lost"
    # the keep-alive bound, plus one read of the rendezvous state, plus slack for a busy machine
    assert decision["t_wall"] - killed_at < KEEP_ALIVE * ATTEMPTS + 1 + 5
    replacement = start(*args)
    assert joined(replacement)["restarts_used"] == 1  # the job's budget, not a fresh one
    replacement.wait_event("rank_stepping", 60)  # its ranks run, as both nodes' did for status
    replacement.signal(signal.SIGTERM)
    assert replacement.wait(60) == 128 + 15, replacement.stderr()
    # the other node hears it is gone and waits for a replacement
    ended = d0.wait_event("peer_news", 30, where=lambda e: e["news"] == "peer_ended")
    assert ended[0]["generation"] == 1, ended
    d0.signal(signal.SIGTERM)
    assert d0.wait(60) == 128 + 15, d0.stderr()


def spares(endpoint: str, run_id: str) -> Callable[[], frozenset[str]]:
    """Who waits beyond MAX for a place (torch's redundancy list), read from the rendezvous
    state in the store the test hosts (torch is imported here for it already)."""
    from torch.distributed import TCPStore  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: PLC0415
        C10dRendezvousBackend,
    )

    from supervisor.coord import torch_private  # noqa: PLC0415

    host, port = endpoint.split(":")
    backend = C10dRendezvousBackend(TCPStore(host, int(port), is_master=False), run_id)
    return lambda: torch_private.snapshot(backend.get_state()).spares


# three generations, two of them after a node is sent away: on a machine loaded enough
# that a daemon takes a minute to join, more than the suite's default 120 s backstop
@pytest.mark.timeout(300)
def test_a_spare_takes_the_place_of_a_rescheduled_node_then_the_other_carries_on_alone_within_min_max(
    start: Start, endpoint: str, tmp_path: Path
) -> None:
    # One job, three daemons (each imports torch for its rendezvous), two proofs. MIN 1,
    # MAX 2: the first two nodes fill the round and the third waits as a spare. Rank 1
    # fails in a way this site's rules send to another machine, in its node's first
    # generation and again on the spare that took its place: generation 1 proves a spare
    # takes the place of a rescheduled node (node rank 1 of 2), generation 2 that with no
    # spare left the other node carries on alone (MIN is 1) and finishes. With MIN 1 the
    # first node ready would start alone a second after it joined, before a daemon still
    # importing torch on a loaded machine joins: the last call is 5 s (the full round
    # starts at once all the same; the one node left waits it out once, idle)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "SITE-BADNODE"\nany = ["injected fault"]\naction = "reschedule"\n')
    # generations 0-1: a node's first generation is 0, the spare's 0 or 1 (the job's count).
    # Rank 1 fails only once the spare waits (a spare still importing torch would come
    # too late: the other node, MIN being 1, would carry on alone at once)
    waits = tmp_path / "spare-waits"
    crash = ("--crash-at-step", "15", "--crash-rank", "1", "--crash-generations", "0-1",
             "--crash-after", str(waits))  # fmt: skip
    args = (*node(endpoint, "1:2", 60, "--rules", str(rules), last_call=5), *steps("--steps", "60", *crash))
    d0, d1 = start(*args), start(*args)
    first = {joined(d0)["node_rank"]: d0, joined(d1)["node_rank"]: d1}
    assert {joined(d)["nnodes"] for d in (d0, d1)} == {2}
    spare = start(*args)
    wait_until(spares(endpoint, spare.run_id), 90, "the third node waiting as a spare")
    waits.touch()
    assert first[1].wait(90) == 200, first[1].stderr()  # sent away with the reschedule code
    took = joined(spare, 0)
    assert (took["node_rank"], took["nnodes"]) == (1, 2), took
    assert joined(first[0], 1)["nnodes"] == 2  # the spare's generation is the job's next
    assert spare.wait(90) == 200, spare.stderr()  # its rank failed too: sent away in turn
    assert first[0].wait(90) == 0, first[0].stderr()
    assert joined(first[0], 2)["nnodes"] == 1  # no spare left: one node is enough, MIN is 1
    for sent in (first[1], spare):
        reason = json.loads((sent.run_dir() / "reason.json").read_text())  # type: ignore[operator]
        assert (reason["outcome"], reason["rule"]) == ("reschedule", "SITE-BADNODE"), reason


def test_a_rank_crash_restarts_every_node_then_a_node_joining_grows_the_job_at_no_restart_cost(
    start: Start, endpoint: str
) -> None:
    # One job of real gloo ranks proves both things a real rendezvous must do for a real
    # world: re-form it after a real rank's crash broke it (generation 0 -> 1, on both
    # nodes), then grow it from 2 to 3 when a node joins the running job (1 -> 2). Its
    # ranks train until the world has grown, then 10 steps (generation 2 runs them all,
    # over 3 ranks): were its length fixed, a loaded machine could see it end before the
    # third node, still starting, joined. The job-wide decisions (whose outcome, who
    # counts the restart, the news heard, the membership change) are
    # tests/fast/test_multinode_fast.py's.
    grows = str(RANKS / "train_until_grown.py")
    args = (*node(endpoint, "2:3", 60, *PRELOAD_TORCH), grows, "--world-size", "3", "--steps", "10",
            "--step-time", "0.1", "--plain", "--crash-at-step", "5", "--crash-rank", "1")  # fmt: skip
    d0, d1 = start(*args), start(*args)
    assert {joined(d0)["node_rank"], joined(d1)["node_rank"]} == {0, 1}
    # the crash's round is closed: the third node can only join the running job
    d0.wait_event("generation_started", 90, where=lambda e: e["generation"] == 1)
    assert joined(d0, 1)["nnodes"] == 2
    d2 = start(*args)
    assert [d.wait(120) for d in (d0, d1, d2)] == [0, 0, 0], d0.stderr() + d1.stderr() + d2.stderr()
    assert joined(d2)["nnodes"] == 3
    for d in (d0, d1):
        assert joined(d, 2)["nnodes"] == 3
        assert [e["action"] for e in d.events("job_decision")] == ["restart", "restart", "continue"]
        reasons = [sorted({o["reason"] for o in e["outcomes"]}) for e in d.events("job_decision")[:2]]
        assert reasons[1] == ["membership"], reasons
    # the crash spent one restart of the job's; the membership change (and a rank that
    # failed on its peer's stop within it) none; the newcomer carries the job's count
    assert {d.events("run_finished")[0]["restarts_used"] for d in (d0, d1, d2)} == {1}
