"""What comes from outside a running generation, driven in-process on virtual time: a
peer's news, the job ending, operators' commands, and messages that must not count."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from supervisor.coord.job import JobGeneration, JobOver, LocalJob
from supervisor.core.jobwide import PeerNews
from supervisor.core.types import Action, Reason
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.transport.schema import encode
from tests.fast.fakes import Behaviour, Rank
from tests.fast.harness import Watcher, supervise


async def trains(r: Rank) -> int | None:
    r.hello()
    await r.train(20 if r.generation == 0 else 3)
    return 0


class NewsInGenerationZero(LocalJob):
    """One node's view of a job whose other node sends ``news`` 5 s into generation 0."""

    def __init__(self, news: PeerNews | JobOver) -> None:
        super().__init__("localhost", None)
        self.news = news

    async def watch(self, job_gen: JobGeneration) -> tuple[PeerNews, str]:
        if job_gen.generation == 0:
            await asyncio.sleep(5)
            if isinstance(self.news, JobOver):
                raise self.news
            return self.news, "node 1 (b): generation 0 failed"
        return await super().watch(job_gen)


def test_a_peers_failure_restarts_healthy_ranks_without_judging_them(tmp_path: Path) -> None:
    run = supervise(tmp_path, trains, "--max-restarts", "2", job=lambda: NewsInGenerationZero(PeerNews.ENDED))
    assert run.code == 0, run.story()
    assert run.one("peer_news")["news"] == "peer_ended"
    decision = run.one("decision")
    assert (decision["action"], decision["reason"], decision["rule"]) == ("restart", "peer_failed", None)
    # the healthy ranks were stopped, not failed: nothing of this node is evidence
    assert {e["state"] for e in run.named("rank_exited") if e["generation"] == 0} == {"stopped"}


def test_a_node_that_joins_restarts_the_job_at_no_cost(tmp_path: Path) -> None:
    joins = NewsInGenerationZero(PeerNews.WAITING)
    run = supervise(tmp_path, trains, "--max-restarts", "1", job=lambda: joins)
    assert run.code == 0, run.story()
    assert run.one("decision")["action"] == "restart"
    assert run.named("run_finished")[0]["restarts_used"] == 0


def test_the_rendezvous_lost_ends_this_node_with_a_reschedule(tmp_path: Path) -> None:
    lost = JobOver(Action.RESCHEDULE, Reason.RENDEZVOUS_LOST, "the store at 10.0.0.1:29400 stopped answering")
    run = supervise(tmp_path, trains, "--max-restarts", "3", job=lambda: NewsInGenerationZero(lost))
    assert run.code == 200, run.story()
    over = run.one("job_over")
    assert (over["action"], over["reason"]) == ("reschedule", "rendezvous_lost")
    assert run.one("decision")["reason"] == "rendezvous_lost"
    assert len(run.named("generation_started")) == 1


def test_sigusr1_logs_the_status_of_every_rank(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0, rank=1)
        daemon.commands.queue.put_nowait(signals.DumpStatus())

    run = supervise(tmp_path, trains, operator=operator)
    status = run.one("status")
    assert [(r["rank"], r["state"]) for r in status["ranks"]] == [(0, "running"), (1, "running")]
    assert status["generation"] == 0 and status["restarts_used"] == 0


def test_a_restart_with_no_generation_running_is_refused(tmp_path: Path) -> None:
    answers: list[object] = []

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("run_started")
        try:
            daemon.commands.control("restart")
        except RuntimeError as exc:
            answers.append(str(exc))
        answers.append(daemon.commands.control("status")["generation"])

    run = supervise(tmp_path, trains, operator=operator)
    assert run.code == 0
    assert answers == ["no running generation to restart", None]


def test_a_second_sigint_skips_the_grace_of_ranks_that_ignore_sigterm(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGINT))
        await asyncio.sleep(1)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGINT))

    deaf = lambda generation, rank: Behaviour(ignores_term=True)  # noqa: E731
    run = supervise(tmp_path, trains, "--shutdown-timeout", "600", operator=operator, behaviour=deaf)
    assert run.code == 128 + signal.SIGINT
    assert run.one("stop_forced")["signal"] == "SIGINT"
    ended = run.one("generation_ended")
    assert ended["killed"] == 2 and ended["seconds"] < 600, run.story()


def test_messages_without_the_ranks_key_or_of_an_old_generation_do_not_count(tmp_path: Path) -> None:
    async def forged(r: Rank) -> int | None:
        r.hello()
        if r.rank == 0:
            # a process of the same user, without the key; then a message of an earlier generation
            key, gen, far = r.env["FT_SUPERVISOR_KEY"], r.generation, 10**6
            r.ranks.deliver([b"x", encode("iteration", rank=1, gen=gen, k="0" * 32, iteration=far)])
            r.ranks.deliver([r.identity, encode("iteration", rank=0, gen=gen - 1, k=key, iteration=far)])
        await r.train(3)
        return 0

    run = supervise(tmp_path, forged)
    assert run.code == 0
    assert {e["reason"] for e in run.named("message_dropped")} >= {"unauthenticated", "stale_generation"}
    assert run.one("generation_ended")["iteration"] == 2


def test_an_exception_reported_by_a_ranks_child_process_is_not_the_ranks(tmp_path: Path) -> None:
    async def worker_dies(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.rank == 1:  # a data-loader worker inherited the client and died of its own error
            child = r.pid + 1000
            r.send("exception", exc_type="KeyError", message="'label'", traceback="", causes=[], pid=child)
        await r.train(2, first=2)
        return 0

    run = supervise(tmp_path, worker_dies)
    assert run.code == 0
    assert run.decisions() == []
    assert not run.named("exception_reported")
