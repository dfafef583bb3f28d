"""``ft-supervisor classify RUN_DIR RUN_DIR`` on every node's run directory of one job
(two in-process daemons on virtual time, each one node of a scripted two-node job):
one verdict naming the job's root rank and node, whatever order the directories
come in. Without ``job_blame`` in reason.json (a run without a job-wide incident),
the earliest first failure across the nodes decides, a rank's own failure before a
peer's reset; with it, it is shown and the nodes must agree."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from tests.fast.fakes import Rank
from tests.fast.fakes_job import Round, ScriptedJob
from tests.fast.harness import Run, supervise

RESET = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
         "[127.0.0.1]:41234: Connection reset by peer")  # fmt: skip


def _node(tmp_path: Path, node_rank: int, script: Callable[[Rank], Awaitable[int | None]]) -> Run:
    job = ScriptedJob(Round(node_rank=node_rank))
    run = supervise(tmp_path / f"node{node_rank}", script, "--max-restarts", "2", "--run-id", "job7",
                    job=lambda: job)  # fmt: skip
    assert run.code == 0, run.story()
    return run


def killed_at(step: int, local: int = 1) -> Callable[[Rank], Awaitable[int | None]]:
    """This node's local rank ``local`` dies of SIGKILL at ``step`` of generation 0."""

    async def script(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0 and r.slot.local_rank == local:
            await r.train(step)
            return -signal.SIGKILL
        await r.train(14 if r.generation == 0 else 3)
        return 0

    return script


def reset_at(step: int) -> Callable[[Rank], Awaitable[int | None]]:
    """This node's local rank 0 reads a peer's reset at ``step`` of generation 0 and raises."""

    async def script(r: Rank) -> int | None:
        r.hello()
        if r.generation == 0 and r.slot.local_rank == 0:
            await r.train(step)
            r.log(RESET)
            return 1
        await r.train(14 if r.generation == 0 else 3)
        return 0

    return script


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The nodes' run directories, made once: each test reads them (or a copy)."""
    made = {
        "reset6": (0, reset_at(6)), "killed5": (1, killed_at(5)), "reset2": (0, reset_at(2)),
        "killed8": (0, killed_at(8, local=0)), "killed12": (1, killed_at(12)),
    }  # fmt: skip
    return {name: _node(tmp_path_factory.mktemp(name), n, how).rundir for name, (n, how) in made.items()}


def job(capsys: pytest.CaptureFixture[str], *dirs: Path, check: bool = False) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["classify", "--json", *(["--check"] if check else []), *map(str, dirs)])
    return code, json.loads(capsys.readouterr().out)["job"]


def test_the_job_root_is_the_rank_that_failed_on_its_own_in_any_order(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # node 1's rank 3 is killed at step 5; node 0's rank 0 reads the reset at step 6
    nodes = [runs["reset6"], runs["killed5"]]
    for dirs in (nodes, nodes[::-1]):
        verdict = job(capsys, *dirs)[1]
        assert (verdict["source"], verdict["rule"], verdict["ranks"], verdict["nodes"]) == (
            "first_failure", "X-SIGKILL", [3], ["node 1"],
        ), verdict  # fmt: skip
    # the peer's reset came first on the clock: a rank's own failure still outranks it
    verdict = job(capsys, runs["reset2"], nodes[1])[1]
    assert (verdict["ranks"], verdict["nodes"]) == ([3], ["node 1"]), verdict


def test_of_two_own_failures_the_earliest_is_the_jobs_root(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [runs["killed8"], runs["killed5"]]
    for dirs in (nodes, nodes[::-1]):
        verdict = job(capsys, *dirs)[1]
        assert (verdict["ranks"], verdict["nodes"]) == ([3], ["node 1"]), verdict
    verdict = job(capsys, runs["killed12"], nodes[0])[1]
    assert (verdict["ranks"], verdict["nodes"]) == ([0], ["node 0"]), verdict


def _carry(run_dir: Path, blame: dict[str, Any]) -> None:
    """reason.json as a daemon that took part in a job-wide incident writes it."""
    reason = json.loads((run_dir / "reason.json").read_text())
    (run_dir / "reason.json").write_text(json.dumps({**reason, "job_blame": blame}))


def test_job_blame_in_reason_json_is_the_verdict_and_the_nodes_must_agree(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [shutil.copytree(runs[name], tmp_path / name) for name in ("reset6", "killed5")]
    blame = {"rule": "own_code", "ranks": [3], "nodes": [1], "detail": "rank 3 in its own code", "silent": []}
    for d in nodes:
        _carry(d, blame)
    code, verdict = job(capsys, *nodes, check=True)
    assert (verdict["source"], verdict["rule"], verdict["ranks"], verdict["nodes"], verdict["agree"]) == (
        "job_blame", "own_code", [3], ["1"], True,
    ), verdict  # fmt: skip
    _carry(nodes[0], {**blame, "ranks": [0, 1], "nodes": [0]})
    code, verdict = job(capsys, *nodes[::-1], check=True)
    assert not verdict["agree"] and code == 1, verdict
    assert any("node 0 says own_code: ranks [0, 1]" in n for n in verdict["notes"]), verdict
