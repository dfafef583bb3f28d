"""A node's health across runs, driven in-process on virtual time: hardware-looking
failures go into a ledger that outlives the daemon; past --node-quarantine the node
starts no ranks and asks to be replaced; `ft-supervisor node` shows and clears it.
Kernel lines (an Xid, the OOM killer) come from a fake /dev/kmsg (fakes_kernel.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.cli import node as node_cli
from tests.fast.fakes import Rank
from tests.fast.fakes_kernel import Kmsg, kmsg
from tests.fast.harness import Run, supervise
from tests.fast.vloop import START

ECC = "CUDA error: uncorrectable ECC error encountered"  # rule C3: hardware, reschedule
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
RESCHEDULE = 200


def _reason(run: Run) -> dict[str, Any]:
    return dict(json.loads((run.rundir / "reason.json").read_text()))


def _node(capsys: pytest.CaptureFixture[str], state: Path, *args: str) -> tuple[int, str]:
    """``ft-supervisor node``, in-process, a few seconds after the runs (on their clock)."""
    code = main(["node", "--node-state-dir", str(state), *args])
    return code, capsys.readouterr().out


def fails(rank: int, say: str | None, code: int, *, generations: tuple[int, ...] = (0,),
          kernel: Kmsg | None = None, kernel_line: str = ""):  # fmt: skip
    """``rank`` says ``say`` and exits ``code`` in ``generations`` (the kernel logs
    ``kernel_line`` first); the other ranks wait to be stopped; in other generations
    every rank exits 0 (tests/fixtures/ranks/gated.py, fails.py)."""

    async def script(r: Rank) -> int | None:
        r.hello()
        await r.train(2)
        if r.generation not in generations:
            return 0
        if r.rank != rank:
            await r.hang()
        if kernel is not None:
            kernel.write(kernel_line.format(pid=r.pid), at=r.ranks.clock.monotonic())
            await r.sleep(0.01)
        if say is not None:
            r.log(say)
        return code

    return script


def test_a_node_with_hardware_failures_in_past_runs_starts_no_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "node-state"
    common = ("--nproc-per-node", "1", "--no-standby", "--max-restarts", "3",
              "--node-state-dir", str(state), "--node-quarantine", "2/1h")  # fmt: skip
    for n in range(2):  # two runs on this node, each ended by an ECC error
        run = supervise(tmp_path / f"r{n}", fails(0, ECC, 1), *common)
        assert run.code == RESCHEDULE, run.story()
        marked = run.named("node_health_marked")
        assert [(e["kind"], e["rule"], e["marks"]) for e in marked] == [("hardware", "C3", n + 1)]
    monkeypatch.setattr(node_cli, "SYSTEM", SimpleNamespace(wall=lambda: 1.7e9 + START + 60))
    code, shown = _node(capsys, state, "--node-quarantine", "2/1h")
    assert code == 3, shown
    assert "marks: 2" in shown and "quarantined: this node saw 2 hardware-looking" in shown
    # the third run starts no rank: the scheduler places the job elsewhere
    refused = supervise(tmp_path / "r2", fails(0, None, 0), *common)
    assert refused.code == RESCHEDULE, refused.story()
    assert not refused.named("rank_spawned") and not refused.ranks.spawned
    q = refused.one("node_quarantined")
    assert q["when"] == "start" and q["quarantine"] == "2/1h"
    reason = _reason(refused)
    assert reason["outcome"] == "reschedule" and reason["decision"]["reason"] == "node_quarantined", reason
    # repaired: cleared, the node works again
    assert _node(capsys, state, "--clear")[0] == 0
    assert json.loads(_node(capsys, state, "--json")[1])["marks"] == []
    ok = supervise(tmp_path / "r3", fails(0, None, 0), *common)
    assert ok.code == 0, ok.story()
    assert len(ok.named("rank_spawned")) == 1 and not ok.named("node_quarantined")


def test_a_restart_that_crosses_the_threshold_sends_the_node_away(tmp_path: Path) -> None:
    """A hardware-looking failure whose rule restarts (a user's rule): the first run
    restarts in place and finishes; in the next run the same failure is the node's
    second within the window, and instead of restarting the node leaves."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nid = "U-XID"\ncategory = "xid"\nnature = "hardware"\naction = "restart"\n'
        "any = ['GPU has fallen off the bus']\nsummary = \"the GPU fell off the bus\"\n"
    )
    said = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    args = ("--no-standby", "--max-restarts", "5", "--node-state-dir", str(tmp_path / "node-state"),
            "--node-quarantine", "2/1h", "--rules", str(rules))  # fmt: skip
    first = supervise(tmp_path / "a", fails(1, said, 3), *args)
    assert first.code == 0, first.story()
    assert [(e["action"], e["rule"]) for e in first.named("decision")] == [("restart", "U-XID")]
    second = supervise(tmp_path / "b", fails(1, said, 3), *args)
    assert second.code == RESCHEDULE, second.story()
    assert second.decisions() == [("restart", "rank_failed"), ("reschedule", "node_quarantined")]
    assert second.one("node_quarantined")["when"] == "restart"
    assert _reason(second)["decision"]["reason"] == "node_quarantined"
    assert [e["generation"] for e in second.named("generation_started")] == [0]


def test_an_xid_in_the_kernel_log_during_the_run_decides_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank's own exit says nothing (exit 3); the kernel logged Xid 79 while it ran:
    read live, it makes the failure a hardware one (reschedule) and marks the ledger."""
    kernel = kmsg(monkeypatch)
    run = supervise(tmp_path, fails(1, None, 3, kernel=kernel, kernel_line=XID), "--no-standby",
                    "--max-restarts", "3", "--node-state-dir", str(tmp_path / "node-state"))  # fmt: skip
    assert run.code == RESCHEDULE, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["rule"]) == ("reschedule", "H1"), run.story()
    assert any("Xid" in line for line in decision["lines"])
    assert run.one("kernel_lines")["lines"] == [XID]
    assert [e["rule"] for e in run.named("node_health_marked")] == ["H1"]
    assert kernel.logs[0].started is False  # closed with the run


def test_a_kernel_line_from_before_the_generation_is_not_its_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = kmsg(monkeypatch)
    kernel.write(XID, at=START - 60)  # a minute before the run: another job's, long gone
    run = supervise(tmp_path, fails(1, None, 3), "--no-standby", "--max-restarts", "1")
    assert run.code == 0, run.story()
    assert run.one("decision")["action"] == "restart" and not run.named("kernel_lines")


OTHERS_OOM = "Out of memory: Killed process 3999999 (java) total-vm:9000kB, anon-rss:8000kB"


def test_the_oom_killer_killing_another_process_is_not_our_ranks_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While our rank failed for its own reason (exit 3), the OOM killer killed some
    other process on the node: that kernel line is not evidence about our rank (it
    used to make the failure P6, so a job beside ours running out of memory could end ours)."""
    kernel = kmsg(monkeypatch)
    run = supervise(tmp_path, fails(1, None, 3, kernel=kernel, kernel_line=OTHERS_OOM), "--no-standby",
                    "--max-restarts", "1")  # fmt: skip
    assert run.code == 0, run.story()
    decision = run.one("decision")
    assert decision["action"] == "restart" and decision["rule"] != "P6", run.story()
    assert run.named("kernel_lines") == []


def test_the_oom_killer_killing_our_rank_is_its_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the control of the case above: the same line, naming our rank's process
    kernel = kmsg(monkeypatch)
    ours = "Out of memory: Killed process {pid} (python3) total-vm:9000kB, anon-rss:8000kB"
    run = supervise(tmp_path, fails(1, None, 3, kernel=kernel, kernel_line=ours), "--no-standby",
                    "--max-restarts", "1")  # fmt: skip
    decision = run.one("decision")
    assert decision["rule"] == "P6" and decision["rank"] == 1, run.story()
    pid = next(r.pid for r in run.ranks.of(0) if r.rank == 1)
    assert run.one("kernel_lines")["lines"] == [ours.format(pid=pid)]
