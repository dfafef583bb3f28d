"""A node's health across runs: hardware-looking failures go into a ledger that
outlives the daemon; past the --node-quarantine threshold the node starts no ranks
and asks to be replaced (the reschedule code); `ft-supervisor node` shows and clears
the ledger. Real daemons, real rank processes (torch-free: the ledger is the point)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import RANKS, Daemon

FAILS = str(RANKS / "fails.py")
GATED = str(RANKS / "gated.py")
ECC = "CUDA error: uncorrectable ECC error encountered"  # rule C3: hardware, reschedule
RESCHEDULE = 200


def _reason(d: Daemon) -> dict[str, Any]:
    (path,) = d.log_dir.glob("*/*/reason.json")
    return dict(json.loads(path.read_text()))


def _node(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "node", "--node-state-dir", str(state), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip



def _fail_beside_a_kernel_line(start, tmp_path: Path, line: str, seq: int, *opts: str) -> Daemon:  # type: ignore[no-untyped-def]
    """Rank 1 exits 3 right after the kernel logged ``line`` while generation 0 ran. The
    kernel log is a FIFO here (FT_SUPERVISOR_KMSG), one record per write as /dev/kmsg
    hands them out: a line written to the real /dev/kmsg would reach every test beside."""
    kmsg = tmp_path / "kmsg"
    os.mkfifo(kmsg)
    held = os.open(kmsg, os.O_RDWR | os.O_NONBLOCK)  # the daemon never reads an end of file
    try:
        gate = tmp_path / "gate"
        gate.mkdir()
        env = {**os.environ, "FT_SUPERVISOR_KMSG": str(kmsg)}
        d = start("--nproc-per-node", "2", "--preload", "none", "--no-standby", *opts,
                  "--node-state-dir", str(tmp_path / "node-state"),
                  GATED, "--fail-in", "0", "--gate", str(gate), env=env)  # fmt: skip
        d.wait_event("generation_started", 60)
        micros = int(time.monotonic() * 1e6)
        os.write(held, f"3,{seq},{micros},-;{line}\n".encode())
        (gate / "go-0").touch()
        d.wait(60)
    finally:
        os.close(held)
    return d

def test_a_node_with_hardware_failures_in_past_runs_starts_no_ranks(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "node-state"
    common = ("--nproc-per-node", "1", "--preload", "none", "--no-standby", "--max-restarts", "3",
              "--node-state-dir", str(state), "--node-quarantine", "2/1h")  # fmt: skip
    for run in range(2):  # two runs on this node, each ended by an ECC error
        d = start(*common, FAILS, "--rank", "0", "--say", ECC, "--exit", "1", run_id=f"r{run}")
        assert d.wait(60) == RESCHEDULE, d.story()
        marked = d.events("node_health_marked")
        assert [(e["kind"], e["rule"], e["marks"]) for e in marked] == [("hardware", "C3", run + 1)]
    shown = _node(state, "--node-quarantine", "2/1h")
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert "marks: 2" in shown.stdout and "quarantined: this node saw 2 hardware-looking" in shown.stdout
    # the third run starts no rank: the scheduler places the job elsewhere
    refused = start(*common, FAILS, "--rank", "0", "--exit", "0", run_id="r2")
    assert refused.wait(60) == RESCHEDULE, refused.story()
    assert not refused.events("rank_spawned"), refused.story()
    (q,) = refused.events("node_quarantined")
    assert q["when"] == "start" and q["quarantine"] == "2/1h"
    reason = _reason(refused)
    assert reason["outcome"] == "reschedule" and reason["decision"]["reason"] == "node_quarantined", reason
    # repaired: cleared, the node works again
    cleared = _node(state, "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(_node(state, "--json").stdout)["marks"] == []
    ok = start(*common, FAILS, "--rank", "1", run_id="r3")  # rank 0 waits; nothing fails
    ok.wait_event("rank_spawned", 60)
    ok.signal(signal.SIGTERM)
    assert ok.wait(60) == 128 + signal.SIGTERM, ok.story()


def test_a_restart_that_crosses_the_threshold_sends_the_node_away(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A hardware-looking failure whose rule restarts (a user's rule): the first run
    restarts in place and finishes; in the next run the same failure is the node's
    second within the window, and instead of restarting the node leaves."""
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nid = "U-XID"\ncategory = "xid"\nnature = "hardware"\naction = "restart"\n'
        "any = ['GPU has fallen off the bus']\nsummary = \"the GPU fell off the bus\"\n"
    )
    xid = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    args = ("--nproc-per-node", "2", "--preload", "none", "--no-standby", "--max-restarts", "5",
            "--node-state-dir", str(tmp_path / "node-state"), "--node-quarantine", "2/1h",
            "--rules", str(rules), GATED, "--fail-in", "0", "--say", xid)  # fmt: skip
    first = start(*args, run_id="a")
    assert first.wait(60) == 0, first.story()
    assert [(e["action"], e["rule"]) for e in first.events("decision")] == [("restart", "U-XID")]
    second = start(*args, run_id="b")
    assert second.wait(60) == RESCHEDULE, second.story()
    decisions = [(e["action"], e["reason"]) for e in second.events("decision")]
    assert decisions == [("restart", "rank_failed"), ("reschedule", "node_quarantined")], second.story()
    (q,) = second.events("node_quarantined")
    assert q["when"] == "restart"
    assert _reason(second)["decision"]["reason"] == "node_quarantined"
    assert [e["generation"] for e in second.events("generation_started")] == [0]


def test_an_xid_in_the_kernel_log_during_the_run_decides_the_failure(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The rank's own exit says nothing (exit 3); the kernel logged Xid 79 (the GPU
    fell off the bus) while it ran: read live, it makes the failure a hardware one
    (reschedule) and leaves its mark in the ledger."""
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    d = _fail_beside_a_kernel_line(start, tmp_path, xid, 9001, "--max-restarts", "3")
    assert d.proc.returncode == RESCHEDULE, d.story()
    (decision,) = d.events("decision")
    assert (decision["action"], decision["rule"]) == ("reschedule", "H1"), d.story()
    assert any("Xid" in line for line in decision["lines"])
    (kernel,) = d.events("kernel_lines")
    assert kernel["lines"] == ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."]
    assert [e["rule"] for e in d.events("node_health_marked")] == ["H1"]


def test_the_oom_killer_killing_another_process_is_not_our_ranks_failure(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """While our rank failed for its own reason (exit 3), the OOM killer killed some
    other process on the node: that kernel line is not evidence about our rank. It
    used to make the failure P6 (an OOM kill: restarted once, then abort), so a job
    beside ours running out of memory could end ours."""
    other = "Out of memory: Killed process 3999999 (java) total-vm:9000kB, anon-rss:8000kB"
    d = _fail_beside_a_kernel_line(start, tmp_path, other, 9002, "--max-restarts", "1")
    assert d.proc.returncode == 0, d.story()
    (decision,) = d.events("decision")
    assert decision["action"] == "restart" and decision["rule"] != "P6", d.story()
    assert d.events("kernel_lines") == []
