"""A hang's incident across the job, on virtual time: this node runs for real (its fake
ranks wait in a collective, or one sleeps in its own code); the other node is scripted
(tests/fast/fakes_job.py: ``Peer``) and answers through an in-memory store. The
agreement's corners: a node that never answers is silent (its ranks blamed, this node's
not); a summary that comes after the members were fixed is read by nobody; both nodes
declaring at once make one incident; the culprit here is the one named hung and marked.
The real exchange over torch's store: tests/integration/test_job_blame.py."""

from __future__ import annotations

import pickle
import signal
from pathlib import Path

import orjson
import pytest

from supervisor.coord import incidents
from supervisor.core.jobwide import PeerNews
from supervisor.core.node_summary import NodeSummary, RankEvidence, summarize_node
from supervisor.core.stacks import read
from supervisor.runreport import summary as report
from supervisor.runtime.lifecycle.hangs import READ_BOUND
from tests.fast.fakes import Rank
from tests.fast.fakes_job import Peer, Round, ScriptedJob
from tests.fast.harness import Run, supervise

STACKS = Path(__file__).parent.parent / "fixtures" / "stacks"
FLIGHT = STACKS.parent / "flight"
WAITING = (STACKS / "allreduce_rank0.txt").read_text()  # inside all_reduce
OWN_CODE = (STACKS / "allreduce_rank1.txt").read_text()  # asleep in its own code
OPTIONS = ("--max-restarts", "1", "--ft-rank-section-timeouts", "step:1", "--ft-num-warmup-iterations", "0")


def hangs_at(step: int, own_code_rank: int | None = None, later: float = 0.01):  # type: ignore[no-untyped-def]
    """Every rank of this node stops inside its step at ``step`` of generation 0: in the
    collective, or (``own_code_rank``) in its own code; later generations' steps take ``later`` s
    (20 of them when that is long: the run outlasts a late peer)."""

    async def script(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = OWN_CODE if r.rank == own_code_rank else WAITING
        for i in range(8 if later < 0.1 else 20):
            r.send("section", op="open", name="step")
            if r.generation == 0 and i == step:
                await r.hang()
            await r.sleep(0.01 if r.generation == 0 else later)
            r.send("section", op="close", name="step")
            r.send("iteration", iteration=i)
        return 0

    return script


def node1(rank3: str = OWN_CODE) -> NodeSummary:
    """Node 1's summary: rank 2 waits in the all_reduce, rank 3 stands where ``rank3`` says."""
    ranks = [RankEvidence(2, reading=read(WAITING)), RankEvidence(3, reading=read(rank3))]
    return summarize_node(1, "node1", "generation 0", 0, ranks)


def blamed(run: Run) -> dict:  # type: ignore[type-arg]
    return run.one("job_blame")


def reason(run: Run) -> dict:  # type: ignore[type-arg]
    return orjson.loads((run.rundir / "reason.json").read_bytes())  # type: ignore[no-any-return]


def test_the_culprit_on_the_other_node_is_named_and_this_node_only_follows(tmp_path: Path) -> None:
    job = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(), after=0.3)]), Round())
    run = supervise(tmp_path, hangs_at(3), *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    verdict = blamed(run)
    assert (verdict["rule"], verdict["ranks"], verdict["nodes"], verdict["silent"]) == (
        "own_code",
        [3],
        [1],
        [],
    )
    assert verdict["summaries"] == [0, 1] and verdict["waiting"] == [0, 1, 2]
    # within the bound after the declaration: node 1 answered 0.3 s after this node published
    assert 0.3 <= verdict["seconds"] < incidents.WAIT
    # none of this node's ranks is charged; it follows, naming the culprit
    assert run.named("rank_hung") == [] and run.named("node_health_marked") == []
    assert run.decisions() == [("restart", "peer_failed")]
    assert "rank(s) 3 on node(s) 1 (node1)" in run.named("decision")[0]["detail"]
    assert reason(run)["job_blame"]["ranks"] == [3] and reason(run)["job_blame"]["nodes"] == [1]
    # the incident was declared before the end was announced, and the bundle has every summary
    board = job.boards[0]
    assert board.kv[incidents.DECLARED] == b"1" and orjson.loads(board.kv[incidents.MEMBERS]) == [0, 1]
    assert job.told.announced == [(0, "generation 0 failed")]
    # the report's incident row names the job's culprit, not this node's ranks
    (incident,) = report.build(run.rundir).incidents
    assert (incident[1].rank, incident[1].node, incident[1].blame) == (3, 1, "own_code")
    assert "the job blamed rank 3 on node 1 (own_code)" in report.text(report.build(run.rundir), None)


def test_a_node_that_never_answers_is_silent_and_its_ranks_are_blamed_not_this_nodes(tmp_path: Path) -> None:
    job = ScriptedJob(Round(node_rank=0, peers=[Peer(None)]), Round())
    run = supervise(tmp_path, hangs_at(3), *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    verdict = blamed(run)
    assert (verdict["rule"], verdict["ranks"], verdict["nodes"], verdict["silent"]) == (
        "node_silent", [2, 3], [1], [1])  # fmt: skip
    assert verdict["summaries"] == [0]
    # the bound, then the verdict: as long as node 1 may take to gather (the stacks' 2 s,
    # no bundle here, 1 s to read dumps) and 2 s more, from the declaration
    assert verdict["seconds"] == pytest.approx(2.0 + READ_BOUND + incidents.WAIT, abs=0.1)
    assert run.named("rank_hung") == [] and run.decisions() == [("restart", "peer_failed")]


def test_a_summary_after_the_members_were_fixed_is_read_by_nobody(tmp_path: Path) -> None:
    late = 2.0 + READ_BOUND + incidents.WAIT + 0.5  # past the wait (see the silent node's)
    job = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(), after=late)]), Round())
    run = supervise(tmp_path, hangs_at(3, later=0.5), *OPTIONS, job=lambda: job)  # 10 s: past ``late``
    assert run.code == 0, run.story()
    board = job.boards[0]
    # node 1's summary did arrive (while generation 1 ran), but after this node fixed the
    # members without it: every node (node 1 too, reading the same members) judges without it
    assert incidents.summary_key(1) in board.kv
    assert orjson.loads(board.kv[incidents.MEMBERS]) == [0]
    assert blamed(run)["silent"] == [1] and blamed(run)["summaries"] == [0]


def test_both_nodes_declaring_make_one_incident_and_a_node_that_only_heard_takes_part(
    tmp_path: Path,
) -> None:
    """Node 1 declared first (its wall clock: 0), then this node's own deadline passes:
    one incident, the first declaration's time kept. In the next run, node 1's news comes
    before this node's own deadline: it takes part all the same."""
    both = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(), declares=True)]), Round())
    run = supervise(tmp_path / "both", hangs_at(3), *OPTIONS, job=lambda: both)
    assert run.code == 0, run.story()
    board = both.boards[0]
    assert board.kv[incidents.DECLARED] == b"2" and board.kv[incidents.AT] == repr(0.0).encode()
    assert blamed(run)["ranks"] == [3] and run.decisions() == [("restart", "peer_failed")]

    news = (0.5, PeerNews.ENDED, "node 1 (node1): generation 0 failed")
    heard = ScriptedJob(Round(node_rank=0, news=news, peers=[Peer(node1(), declares=True)]), Round())
    run = supervise(
        tmp_path / "heard", hangs_at(3), *OPTIONS, job=lambda: heard
    )  # the news, 0.5 s before its deadline
    assert run.code == 0, run.story()
    assert run.named("deadline_missed") == [] and heard.told.announced == []
    assert blamed(run)["ranks"] == [3] and blamed(run)["summaries"] == [0, 1]
    assert run.decisions() == [("restart", "peer_failed")]


def test_the_culprit_here_is_named_hung_by_the_jobs_blame_and_its_node_marked(tmp_path: Path) -> None:
    job = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(rank3=WAITING), after=0.1)]), Round())
    run = supervise(tmp_path, hangs_at(3, own_code_rank=1), *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    assert (blamed(run)["ranks"], blamed(run)["nodes"]) == ([1], [0])
    (hung,) = run.named("rank_hung")
    assert (hung["rank"], hung["blamed_by"]) == (1, "job_blame")
    assert run.decisions() == [("restart", "rank_hung")]
    assert [m["kind"] for m in run.named("node_health_marked")] == ["hang"]


def test_a_culprit_here_whose_node_only_heard_the_news_is_named_hung_all_the_same(tmp_path: Path) -> None:
    """Node 1 declared; this node's own deadline has not passed yet (none of its ranks
    missed one), but the job's blame names its rank 1: the job's deadline stands for it."""
    news = (0.5, PeerNews.ENDED, "node 1 (node1): generation 0 failed")
    peers = [Peer(node1(rank3=WAITING), declares=True)]
    job = ScriptedJob(Round(node_rank=0, news=news, peers=peers), Round())
    run = supervise(tmp_path, hangs_at(3, own_code_rank=1), *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    assert run.named("deadline_missed") == [] and job.told.announced == []
    (hung,) = run.named("rank_hung")
    assert (hung["rank"], hung["blamed_by"]) == (1, "job_blame")
    assert run.decisions() == [("restart", "rank_hung")]


def test_a_waiting_rank_that_fails_as_the_culprits_node_stops_its_ranks_does_not_make_this_node_judge(
    tmp_path: Path,
) -> None:
    # rank 0 waits in the all_reduce; as node 1 ends its ranks after the verdict, its collective
    # fails ("Connection closed by peer") and it exits 1 before this node has its own verdict:
    # a symptom of the job's hang, not a failure of this node's to judge (it decided
    # rank_failed against its own rank in 11 of 56 loaded trials of scripts/bench/blame.py)
    inner = hangs_at(3)

    async def script(r: Rank) -> int | None:
        if r.generation == 0 and r.rank == 0:
            r.hello(stack_signal=signal.SIGUSR1)
            r.stacks = WAITING
            for _ in range(3):
                r.send("section", op="open", name="step")
                await r.sleep(0.01)
                r.send("section", op="close", name="step")
            r.send("section", op="open", name="step")
            await r.sleep(1.2)  # past the 1 s deadline: the incident is declared, node 1 answers at +0.3
            r.log("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                  "Connection closed by peer [127.0.0.1]:40123\n")  # fmt: skip
            return 1
        return await inner(r)

    job = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(), after=0.3)]), Round())
    run = supervise(tmp_path, script, *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    assert blamed(run)["ranks"] == [3] and blamed(run)["nodes"] == [1]
    assert run.named("rank_hung") == [] and run.named("node_health_marked") == []
    assert run.decisions() == [("restart", "peer_failed")], run.story()


def test_a_sigstopped_rank_is_named_left_stopped_and_outranks_the_peers_that_exited_because_of_it(
    tmp_path: Path,
) -> None:
    """Rank 1 stops itself (SIGSTOP) inside its step while rank 0 waits in the all_reduce;
    node 1's ranks exited after the incident began. Nothing gathered may wake rank 1 (woken,
    it finishes its collective and the job runs on while it is judged: scripts/bench/blame.py
    named the ranks that exited 0 meanwhile), and a rank that exited because of the incident
    is less suspect than the stopped one: rank 1 on node 0 is named, node 1 is not charged."""

    async def script(r: Rank) -> int | None:
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = WAITING
        for i in range(8):
            r.send("section", op="open", name="step")
            if r.generation == 0 and i == 3:
                await (r.stop() if r.rank == 1 else r.hang())
            await r.sleep(0.01)
            r.send("section", op="close", name="step")
            r.send("iteration", iteration=i)
        return 0

    ended = [RankEvidence(2, gone=True, after=True), RankEvidence(3, gone=True, after=True)]
    peer = Peer(summarize_node(1, "node1", "generation 0", 0, ended), after=0.3)
    job = ScriptedJob(Round(node_rank=0, peers=[peer]), Round())
    run = supervise(tmp_path, script, *OPTIONS, job=lambda: job)
    assert run.code == 0, run.story()
    verdict = blamed(run)
    assert (verdict["rule"], verdict["ranks"], verdict["nodes"]) == ("own_code", [1], [0]), verdict
    # neither a stack dump's signal nor a SIGCONT reached it before the termination's own
    stopped = next(r for r in run.ranks.of(0) if r.rank == 1)
    assert stopped.proc.direct == [], stopped.proc.direct
    assert [(s["rank"], s["where"]) for s in run.named("stacks_dumped")] == [(0, "collective")]
    (hung,) = run.named("rank_hung")
    assert (hung["rank"], hung["blamed_by"]) == (1, "job_blame")
    assert run.decisions() == [("restart", "rank_hung")]
    assert [m["kind"] for m in run.named("node_health_marked")] == ["hang"]


WATCHDOG = (
    "[rank0]:[E1127 16:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=5000) "
    "ran for 5003 milliseconds before timing out."
)
GLOO_TIMEOUT = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
    "5000ms for recv operation to complete"
)
LONG = ("--max-restarts", "1", "--ft-rank-section-timeouts", "step:60", "--ft-num-warmup-iterations", "0")


def times_out(line: str, own_code_rank: int | None = None):  # type: ignore[no-untyped-def]
    """Rank 0 waits in generation 0's all_reduce at step 3 until its collective's timeout (5 s,
    well within the 60 s step deadline), says so in ``line`` and exits 1; the other rank waits
    too, or (``own_code_rank``) sleeps in its own code."""
    inner = hangs_at(3, own_code_rank)

    async def script(r: Rank) -> int | None:
        if r.generation != 0 or r.rank != 0:
            return await inner(r)
        r.hello(stack_signal=signal.SIGUSR1)
        r.stacks = WAITING
        for i in range(3):
            await r.step(i, 0.01)
        r.send("section", op="open", name="step")
        await r.sleep(5.0)
        r.log(line)
        return 1

    return script


def test_a_ranks_collective_timeout_makes_the_jobs_incident_and_is_not_charged_when_the_culprit_is_elsewhere(
    tmp_path: Path,
) -> None:
    """Rank 0's NCCL watchdog gives up on its all_reduce long before any deadline here: the
    node declares the job's incident as a hang does, node 1 answers (its rank 3 in its own
    code), and rank 0's timeout is its symptom: node 0 follows, charging nobody (alone, it
    decided N1 against its own waiting rank, and a repeated N1 sends the healthy node away)."""
    job = ScriptedJob(Round(node_rank=0, peers=[Peer(node1(), after=0.3)]), Round())
    run = supervise(tmp_path, times_out(WATCHDOG), *LONG, job=lambda: job)
    assert run.code == 0, run.story()
    assert job.boards[0].kv[incidents.DECLARED] == b"1" and run.named("deadline_missed") == []
    verdict = blamed(run)
    assert (verdict["ranks"], verdict["nodes"], verdict["summaries"]) == ([3], [1], [0, 1]), verdict
    assert run.named("rank_hung") == [] and run.named("node_health_marked") == []
    assert run.decisions() == [("restart", "peer_failed")], run.story()
    assert reason(run)["job_blame"]["ranks"] == [3]
    # no deadline was missed here and nobody here is named, but this node's evidence is kept:
    # its bundle holds every node's summary and the verdict
    (written,) = run.named("hang_bundle")
    manifest = orjson.loads((Path(written["path"]) / "bundle.json").read_bytes())
    assert (manifest["deadline"], manifest["hung"], manifest["blamed_by"]) == (None, [], "job_blame")
    job_doc = orjson.loads((Path(written["path"]) / "job-blame.json").read_bytes())
    assert job_doc["verdict"]["ranks"] == [3] and [s["node_rank"] for s in job_doc["summaries"]] == [0, 1]


def test_a_gloo_timeout_beside_the_culprit_here_names_the_culprit_not_the_rank_that_waited(
    tmp_path: Path,
) -> None:
    """Rank 0 times out waiting (gloo) while rank 1, on the same node, sleeps in its own code;
    node 1's ranks wait: rank 1 is named hung by the job's blame and this node is marked."""
    peer = Peer(node1(rank3=WAITING), after=0.3)
    job = ScriptedJob(Round(node_rank=0, peers=[peer]), Round())
    run = supervise(tmp_path, times_out(GLOO_TIMEOUT, own_code_rank=1), *LONG, job=lambda: job)
    assert run.code == 0, run.story()
    assert (blamed(run)["ranks"], blamed(run)["nodes"]) == ([1], [0]), blamed(run)
    (hung,) = run.named("rank_hung")
    assert (hung["rank"], hung["blamed_by"]) == (1, "job_blame")
    (decided,) = run.named("decision")
    assert (decided["action"], decided["reason"], decided["rank"]) == ("restart", "rank_hung", 1), decided
    assert [m["kind"] for m in run.named("node_health_marked")] == ["hang"]


def captured(capture: str, rank: int) -> RankEvidence:
    """A rank of a real gloo capture (tests/fixtures/flight): its dump and its stacks."""
    return RankEvidence(
        rank,
        dump=pickle.loads((FLIGHT / f"{capture}_rank_{rank}.pkl").read_bytes()),
        reading=read((FLIGHT / f"{capture}_rank_{rank}.stacks.txt").read_text()),
    )


def test_a_desync_leaves_one_decision_for_its_generation(tmp_path: Path) -> None:
    """Node 1's ranks called all_gather and all_reduce at the same collective (real gloo dumps):
    the job aborts on it, and the generation's one decision is that abort, on every reader."""
    ranks = [captured("gloo_desync_op", r) for r in (2, 3)]
    peer = Peer(summarize_node(1, "node1", "generation 0", 0, ranks), after=0.3)
    job = ScriptedJob(Round(node_rank=0, peers=[peer]), Round())
    run = supervise(tmp_path, hangs_at(3), *OPTIONS, job=lambda: job)
    assert run.code == 2, run.story()
    assert blamed(run)["rule"] == "desync"
    assert run.decisions() == [("abort", "not_retryable")], run.story()
    assert reason(run)["decision"]["action"] == "abort" and reason(run)["job_blame"]["rule"] == "desync"
    (incident,) = report.build(run.rundir).incidents
    assert incident[1].blame == "desync"


CAUGHT = (
    "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
    "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. "
    "Is there a distributed collective mismatch in your code?"
)


def test_a_rank_that_caught_a_size_mismatch_makes_the_jobs_incident_and_the_dumps_name_the_culprit(
    tmp_path: Path,
) -> None:
    """gloo aborts the rank whose receive caught a size mismatch (rank 0 here), long before any
    deadline: a desync that only every node's dumps pin on a rank. This node declares the job's
    incident on that line; its rank 0 is a witness (its line in the summary, a vote for the
    smaller call); node 1's dumps (the real desync_size capture: rank 2 all-reduced 16 floats,
    rank 3 8) tie without it. Rank 2 on node 1 is named, and the job aborts the first time."""
    ranks = [captured("gloo_desync_size", r) for r in (2, 3)]
    peer = Peer(summarize_node(1, "node1", "generation 0", 0, ranks), after=0.3)
    job = ScriptedJob(Round(node_rank=0, peers=[peer]), Round())
    run = supervise(tmp_path, times_out(CAUGHT), *LONG, job=lambda: job)
    assert run.code == 2, run.story()
    assert job.boards[0].kv[incidents.DECLARED] == b"1" and run.named("deadline_missed") == []
    verdict = blamed(run)
    assert (verdict["rule"], verdict["ranks"], verdict["nodes"]) == ("desync", [2], [1]), verdict
    assert "rank(s) 0 caught the mismatch" in verdict["detail"], verdict
    assert run.named("rank_hung") == [] and run.named("node_health_marked") == []
    assert run.decisions() == [("abort", "not_retryable")], run.story()
    assert [e["rank"] for e in run.named("decision")] == [2]  # the culprit, not the rank that caught it
    (written,) = run.named("hang_bundle")
    job_doc = orjson.loads((Path(written["path"]) / "job-blame.json").read_bytes())
    (mine,) = [r for r in job_doc["summaries"][0]["ranks"] if r["rank"] == 0]
    assert mine["where"] == "collective" and "8 vs 4. Received data size" in mine["witness"], mine


def test_a_node_whose_rank_only_saw_its_peer_go_takes_part_in_the_incident_declared_elsewhere(
    tmp_path: Path,
) -> None:
    """Node 1 declared (its rank 3 caught the mismatch and was aborted); here rank 0's
    connection closed as that happened and it exited before any news came: it is a witness,
    and this node takes part in the declared incident instead of judging a peer's reset alone.
    Rank 2's dump is the only call left: the ranks that blamed no peer, with a dump, are named."""
    ranks = [
        captured("gloo_desync_size", 2),
        RankEvidence(3, gone=True, after=True, witness=CAUGHT),
    ]  # fmt: skip
    peer = Peer(summarize_node(1, "node1", "generation 0", 0, ranks), after=0.3, declares=True)
    job = ScriptedJob(Round(node_rank=0, peers=[peer]), Round())
    closed = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123"
    run = supervise(tmp_path, times_out(closed), *LONG, job=lambda: job)
    assert run.code == 2, run.story()
    verdict = blamed(run)
    assert (verdict["rule"], verdict["ranks"], verdict["nodes"]) == ("desync", [2], [1]), verdict
    assert run.named("rank_hung") == [] and run.decisions() == [("abort", "not_retryable")], run.story()
