"""One node of a multi-node job, in-process on virtual time, beside a scripted job
(tests/fast/fakes_job.py): the job-wide decisions the real daemons of
tests/integration/test_multinode.py reach through the rendezvous store. A crash
here or on a peer restarts the job and spends one restart; a peer's abort stops
this node with exit 2; a node joining changes the world at no restart cost; a node
that joins late takes on the restarts the job spent; a lost node restarts the job; a
rank stuck at exit after the other node succeeded is ended, and the job succeeds."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from supervisor.core.jobwide import NodeOutcome, PeerNews
from supervisor.core.types import Action, Reason
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Rank
from tests.fast.fakes_job import Round, ScriptedJob
from tests.fast.harness import Operator, Run, Watcher, supervise
from tests.fast.test_lingering import lingers


async def crashes_once(r: Rank) -> int | None:
    """Rank 1 of this node raises at step 5 of generation 0; every later generation trains."""
    r.hello()
    if r.generation == 0 and r.slot.local_rank == 1:
        await r.train(5)
        return r.raise_("RuntimeError", "injected fault at step 5")
    await r.train(20 if r.generation == 0 else 3)
    return 0


async def trains(r: Rank) -> int | None:
    r.hello()
    await r.train(20 if r.generation == 0 else 3)
    return 0


def stop_after(seconds: float) -> Operator:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("generation_started")
        await asyncio.sleep(seconds)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    return operator


def job_decisions(run: Run) -> list[str]:
    return [e["action"] for e in run.named("job_decision")]


def restarts_used(run: Run) -> int:
    return int(run.one("run_finished")["restarts_used"])


@pytest.mark.parametrize("node_rank", [0, 1])
def test_a_rank_crash_on_this_node_restarts_every_node_and_the_job_finishes(
    tmp_path: Path, node_rank: int
) -> None:
    job = ScriptedJob(Round(node_rank=node_rank))
    run = supervise(tmp_path, crashes_once, "--max-restarts", "2", job=lambda: job)
    assert run.code == 0, run.story()
    assert job_decisions(run) == ["restart", "continue"]
    first = run.named("job_decision")[0]
    reasons = {o["node_rank"]: o["reason"] for o in first["outcomes"]}
    assert reasons == {node_rank: "rank_failed", 1 - node_rank: "peer_failed"}
    assert run.decisions() == [("restart", "rank_failed")]
    assert len(run.named("generation_started")) == 2
    assert restarts_used(run) == 1
    # this node told its peers first; the lowest node rank records the job's restart
    assert job.told.announced == [(0, "generation 0 failed")]
    assert job.told.counted == (1 if node_rank == 0 else 0)
    assert job.told.finished == [(1, Action.CONTINUE, True)]
    # the ranks' world is the job's: this node's ranks come after the other node's
    ranks = {r.env["RANK"] for r in run.ranks.of(1)}
    assert ranks == {str(2 * node_rank), str(2 * node_rank + 1)}
    assert {r.env["WORLD_SIZE"] for r in run.ranks.of(1)} == {"4"}


def test_a_peers_crash_restarts_this_node_and_spends_the_jobs_restart(tmp_path: Path) -> None:
    # the other view of the same crash: node 1's rank failed, this node's healthy ranks are stopped
    peer = [NodeOutcome(1, Action.RESTART, Reason.RANK_FAILED, "rank 3 exited with 1", node="node1")]
    job = ScriptedJob(Round(news=(5.0, PeerNews.ENDED, "node 1 (node1): generation 0 failed"), others=peer),
                      Round())  # fmt: skip
    run = supervise(tmp_path, trains, "--max-restarts", "2", job=lambda: job)
    assert run.code == 0, run.story()
    assert run.one("peer_news")["news"] == "peer_ended"
    assert job_decisions(run) == ["restart", "continue"]
    assert run.decisions() == [("restart", "peer_failed")]
    assert restarts_used(run) == 1  # a peer's failure spends the job's budget on every node
    assert job.told.announced == []  # the news came from the peer: nothing to tell
    assert job.told.counted == 1


def test_a_peers_abort_stops_this_node_with_exit_2_and_says_whose_it_was(tmp_path: Path) -> None:
    peer = [NodeOutcome(1, Action.ABORT, Reason.NOT_RETRYABLE, "No module named 'nccl_plugin'", node="node1")]
    job = ScriptedJob(Round(news=(5.0, PeerNews.ENDED, "node 1 (node1): generation 0 failed"), others=peer))
    run = supervise(tmp_path, trains, "--max-restarts", "2", job=lambda: job)
    assert run.code == 2, run.story()
    assert job_decisions(run) == ["abort"]
    # this node followed (a restart), then adopted the job's abort
    assert run.decisions() == [("restart", "peer_failed"), ("abort", "peer_failed")]
    reason = json.loads((run.rundir / "reason.json").read_text())
    assert (reason["outcome"], reason["exit_code"]) == ("abort", 2)
    assert reason["decision"]["reason"] == "peer_failed"
    assert reason["decision"]["detail"] == "node 1 (node1) decided abort: No module named 'nccl_plugin'"
    assert len(run.named("generation_started")) == 1
    assert restarts_used(run) == 0
    assert job.told.finished == [(0, Action.ABORT, True)]


def test_an_abort_on_this_node_stops_the_job_with_exit_2(tmp_path: Path) -> None:
    async def module_missing(r: Rank) -> int | None:
        r.hello()
        if r.slot.local_rank == 1:
            return r.raise_("ModuleNotFoundError", "No module named 'nccl_plugin'")
        await r.hang()  # waits to be stopped
        return None

    job = ScriptedJob(Round())
    run = supervise(tmp_path, module_missing, "--max-restarts", "2", job=lambda: job)
    assert run.code == 2, run.story()
    assert job_decisions(run) == ["abort"]
    assert [a for a, _ in run.decisions()] == ["abort"]
    reason = json.loads((run.rundir / "reason.json").read_text())
    assert reason["outcome"] == "abort"
    assert job.told.announced == [(0, "generation 0 failed")]
    assert job.told.finished == [(0, Action.ABORT, True)]


def test_a_node_joining_changes_the_world_at_no_restart_cost(tmp_path: Path) -> None:
    # node 1 stopped its rank first: the reset reached node 1's rank before its daemon
    # heard the news, and it failed on its peer; within a membership change that is free too
    others = [NodeOutcome(1, Action.RESTART, Reason.MEMBERSHIP, "a node asks to join", node="node1"),
              NodeOutcome(2, Action.RESTART, Reason.RANK_FAILED, "connection reset by peer", node="node2",
                          peer=True)]  # fmt: skip
    joining = Round(nnodes=2, news=(5.0, PeerNews.WAITING, "a node waits to join"), others=others)
    job = ScriptedJob(joining, Round(node_rank=1, nnodes=3))  # the newcomer took node rank 0
    run = supervise(tmp_path, trains, "--max-restarts", "1", job=lambda: job)
    assert run.code == 0, run.story()
    assert run.one("peer_news")["news"] == "node_waiting"
    assert run.decisions() == [("restart", "membership")]
    assert job_decisions(run) == ["restart", "continue"]
    assert restarts_used(run) == 0
    assert job.told.counted == 0
    moved = [e for e in run.named("node_moved") if e["generation"] == 1]
    places = [(e["was_node_rank"], e["was_nnodes"], e["node_rank"], e["nnodes"]) for e in moved]
    assert places == [(0, 2, 1, 3)]
    # the ranks prepared for the old place were dropped: those that ran have their new RANK
    ran = {e["pid"] for e in run.named("rank_connected") if e["generation"] == 1}
    world = sorted((r.env["RANK"], r.env["WORLD_SIZE"]) for r in run.ranks.of(1) if r.pid in ran)
    assert world == [("2", "6"), ("3", "6")]


def test_a_node_joining_where_this_node_keeps_its_rank_does_not_move_it(tmp_path: Path) -> None:
    others = [NodeOutcome(1, Action.RESTART, Reason.MEMBERSHIP, "a node asks to join", node="node1")]
    job = ScriptedJob(Round(news=(5.0, PeerNews.WAITING, "a node waits to join"), others=others),
                      Round(node_rank=0, nnodes=3))  # fmt: skip
    run = supervise(tmp_path, trains, "--max-restarts", "0", job=lambda: job)
    assert run.code == 0, run.story()  # no restart left, and none needed
    assert restarts_used(run) == 0
    moved = [e for e in run.named("node_moved") if e["generation"] == 1]
    assert [(e["node_rank"], e["nnodes"]) for e in moved] == [(0, 3)]  # the world grew; the place did not


@pytest.mark.parametrize(("spent", "outcome"), [(0, ("restart", "rank_failed")),
                                                (1, ("abort", "restarts_exhausted"))])  # fmt: skip
def test_a_late_joiner_takes_on_the_restarts_the_job_already_spent(
    tmp_path: Path, spent: int, outcome: tuple[str, str]
) -> None:
    job = ScriptedJob(Round(restarts_used=spent))
    run = supervise(tmp_path, crashes_once, "--max-restarts", "1", job=lambda: job)
    assert run.decisions()[0] == outcome, run.story()
    # the job's restart spent before this node came counts here: the budget is the job's
    assert run.named("decision")[0]["restarts_used"] == spent
    if spent:  # the failure is deterministic (P9): no restart left ends the job
        assert run.code == 2
        assert job_decisions(run) == ["abort"]
        assert len(run.named("generation_started")) == 1
    else:
        assert run.code == 0
        assert restarts_used(run) == 1


def test_a_lost_node_restarts_the_job_and_spends_a_restart(tmp_path: Path) -> None:
    gone = "its daemon stopped keeping the rendezvous alive (seen by node 0)"
    others = [NodeOutcome(1, Action.RESCHEDULE, Reason.NODE_LOST, gone)]
    job = ScriptedJob(Round(news=(5.0, PeerNews.LOST, "node 1 stopped keeping the rendezvous alive"),
                            others=others),
                      Round(restarts_used=1))  # fmt: skip
    run = supervise(tmp_path, trains, "--max-restarts", "2", job=lambda: job)
    assert run.code == 0, run.story()
    assert run.one("peer_news")["news"] == "node_lost"
    assert run.decisions() == [("restart", "node_lost")]
    first = run.named("job_decision")[0]
    assert first["action"] == "restart"
    assert {o["node_rank"]: o["reason"] for o in first["outcomes"]} == {0: "node_lost", 1: "node_lost"}
    assert restarts_used(run) == 1
    assert job.told.counted == 1  # the only live node records it


def test_a_lost_node_with_no_restart_left_sends_this_node_away(tmp_path: Path) -> None:
    others = [NodeOutcome(1, Action.RESCHEDULE, Reason.NODE_LOST, "gone")]
    job = ScriptedJob(Round(news=(5.0, PeerNews.LOST, "node 1 is gone"), others=others))
    run = supervise(tmp_path, trains, "--max-restarts", "0", job=lambda: job)
    assert run.code == 200, run.story()
    assert run.decisions() == [("reschedule", "restarts_exhausted")]
    assert job_decisions(run) == ["reschedule"]


def test_on_two_nodes_a_rank_stuck_at_exit_after_the_other_node_succeeded_is_ended(tmp_path: Path) -> None:
    # one rank a node: the stuck rank's only peer is on the other node, which succeeded
    # 0.5 s in and waits to agree; this node learns it from the job (the store read itself
    # stays in tests/integration/test_lingering.py)
    job = ScriptedJob(Round(node_rank=1, others_done_after=0.5))
    run = supervise(tmp_path, lingers("atexit"), "--nproc-per-node", "1", "--max-restarts", "0",
                    "--exit-grace", "1", job=lambda: job)  # fmt: skip
    assert run.code == 0, run.story()
    stuck = run.one("rank_exit_stuck")
    assert (stuck["rank"], stuck["success"], stuck["after"]) == (1, True, "peers_succeeded"), stuck
    assert stuck["waited"] >= 1
    assert any("_block_at_exit" in frame for frame in stuck["where"]), stuck["where"]
    assert job_decisions(run) == ["continue"]
    assert run.decisions() == []
    assert job.told.announced == []  # every other node is done: nothing to tell them


def test_on_two_nodes_a_rank_still_running_is_not_ended_while_the_other_node_runs(tmp_path: Path) -> None:
    # the other node never says it is done: this node's only rank is no lingerer, whatever
    # its state; the run is stopped by its deadline only (a stop here: no hang detection)
    job = ScriptedJob(Round(node_rank=1))
    run = supervise(tmp_path, lingers("atexit"), "--nproc-per-node", "1", "--max-restarts", "0",
                    "--exit-grace", "1", job=lambda: job, operator=stop_after(30))  # fmt: skip
    assert run.code == 128 + signal.SIGTERM, run.story()
    assert not run.named("rank_exit_stuck")
