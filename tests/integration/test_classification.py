"""Failures classified and decided end to end: real ranks, the real daemon, its exit code
and its reason file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import RANKS, Daemon

FAILS = str(RANKS / "fails.py")
FAILURES = RANKS.parent / "failures"  # the golden corpus
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]
WATCHDOG = (
    "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=37, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, "
    "Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
)


def _reason(d: Daemon) -> dict[str, Any]:
    run_dir = d.run_dir()
    assert run_dir is not None
    reason: dict[str, Any] = json.loads((run_dir / "reason.json").read_text())
    return reason


def _decisions(d: Daemon) -> list[tuple[str, str | None]]:
    return [(e["action"], e.get("rule")) for e in d.events("decision")]


@pytest.mark.torch
def test_a_dist_backend_error_reschedules_with_the_configured_code(start: Start, tmp_path: Path) -> None:
    prefix = tmp_path / "errors" / "training_errors.log"
    d = start("--nproc-per-node", "2", "--max-restarts", "3", "--reschedule-exit-code", "3",
              "--error-log-prefix", str(prefix),
              FAILS, "--client", "--raise", "torch.distributed.DistBackendError",
              "NCCL communicator was aborted",
              "--cause", "the peer went away")  # fmt: skip
    assert d.wait(timeout=120) == 3, d.stderr()
    assert _decisions(d) == [("reschedule", "D1")]  # no restart in place: OSMO's rule
    reason = _reason(d)
    assert (reason["outcome"], reason["exit_code"], reason["rule"], reason["rank"]) == (
        "reschedule",
        3,
        "D1",
        1,
    )
    assert reason["decision"]["reason"] == "classified"
    assert reason["root_cause"]["rank"] == 1
    assert any("DistBackendError" in line for line in reason["evidence_lines"])
    assert reason["node"] and reason["restarts_used"] == 0
    # OSMO's launch scripts look for these
    written = (tmp_path / "errors" / "training_errors.log.rank_1").read_text()
    assert written.startswith("Training error occurred: ")
    assert "rule D1" in written
    assert "rule D1 [distributed, transient]" in d.stderr()


def test_an_import_error_at_startup_aborts_without_a_restart(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "5", FAILS, "--import", "no_such_module_for_ft_tests")
    assert d.wait() == 2, d.stderr()
    assert _decisions(d) == [("abort", "P0")]
    assert len(d.events("generation_started")) == 1
    reason = _reason(d)
    assert (reason["outcome"], reason["decision"]["reason"]) == ("abort", "not_retryable")
    assert "ModuleNotFoundError: No module named 'no_such_module_for_ft_tests'" in reason["evidence_lines"]


def test_an_nccl_watchdog_line_then_death_restarts(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "2", FAILS, "--generations", "0",
              "--say", "step 812 loss 2.31", "--say", WATCHDOG, "--kill", "SIGABRT")  # fmt: skip
    # generation 1: rank 1 does not fail; stop the waiting ranks once it is up
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    d.signal(15)
    assert d.wait() == 128 + 15
    assert _decisions(d) == [("restart", "N1")]
    decision = d.events("decision")[0]
    assert decision["rank"] == 1 and "Watchdog caught collective operation timeout" in decision["lines"][0]
    reason = _reason(d)
    assert (reason["outcome"], reason["rule"], reason["exit_code"]) == ("stopped", None, 143)
    assert (reason["last_failure"]["rule"], reason["last_failure"]["generation"]) == ("N1", 0)


def test_the_oom_killer_twice_without_progress_aborts(start: Start) -> None:
    # every generation reports the same 3 iterations and is killed: no progress between kills
    d = start(*FAST, "--max-restarts", "5", FAILS, "--kill", "SIGKILL", "--client", "--iterations", "3")
    assert d.wait() == 2, d.stderr()
    assert _decisions(d) == [("restart", "X-SIGKILL"), ("abort", "X-SIGKILL")]
    assert d.events("decision")[1]["reason"] == "repeated"


def test_an_exhausted_budget_gives_the_code_of_the_failures_nature(start: Start) -> None:
    # an exit no rule knows is transient: run it elsewhere
    d = start(*FAST, "--max-restarts", "1", FAILS, "--exit", "3")
    assert d.wait() == 200, d.stderr()
    assert _decisions(d) == [("restart", "unclassified"), ("reschedule", "unclassified")]
    assert d.events("decision")[1]["reason"] == "restarts_exhausted"
    # a Python error is deterministic: abort
    d = start(*FAST, "--max-restarts", "1", FAILS, "--raise", "RuntimeError", "bad batch")
    assert d.wait() == 2, d.stderr()
    assert _decisions(d) == [("restart", "P9"), ("abort", "P9")]
    assert _reason(d)["decision"]["reason"] == "restarts_exhausted"


def test_a_crash_loop_without_progress_aborts(start: Start) -> None:
    # the client reports iterations 0-2 in every generation: generation 0 advanced,
    # generations 1 and 2 did not: the second cycle without progress aborts
    d = start(*FAST, "--max-restarts", "9", "--ft-max-no-progress-cycles", "2",
              FAILS, "--client", "--iterations", "3", "--exit", "3")  # fmt: skip
    assert d.wait() == 2, d.stderr()
    decisions = d.events("decision")
    assert [e["action"] for e in decisions] == ["restart", "restart", "abort"]
    assert decisions[-1]["reason"] == "no_progress"


def test_user_rules_and_a_third_party_plugin_change_decisions(start: Start, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "SITE1"\nany = ["filer .* unreachable"]\naction = "reschedule"\n'
                     'nature = "hardware"\ncategory = "storage"\n')  # fmt: skip
    d = start(*FAST, "--rules", str(rules), FAILS, "--say", "ERROR: filer fs7 unreachable", "--exit", "1")
    assert d.wait() == 200
    assert _decisions(d) == [("reschedule", "SITE1")]

    # a plugin package, installed as pip would: a module and its dist-info with an entry point
    site = tmp_path / "site"
    (site / "ft_test_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "ft_test_plugin-1.0.dist-info" / "METADATA").write_text("Name: ft-test-plugin\nVersion: 1.0\n")
    (site / "ft_test_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[ft_supervisor.plugins]\nsite_policy = ft_test_plugin\nbroken = ft_test_plugin_missing\n"
    )
    (site / "ft_test_plugin.py").write_text(
        "from supervisor.hooks import hookimpl\n"
        "from supervisor.core.classify import Classification\n"
        "from supervisor.core.types import Action\n"
        "@hookimpl\n"
        "def classify_failure(evidence):\n"
        "    for f in evidence.failures:\n"
        "        if any('quota exceeded on /scratch' in ln for ln in f.texts()):\n"
        "            return Classification('SITE-QUOTA', 'storage', 'hardware', Action.RESCHEDULE,\n"
        "                                  rank=f.exit.rank, summary='scratch quota: move')\n"
        "    return None\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    # without the plugin the built-ins see a disk quota: abort
    say = ("--say", "OSError: Disk quota exceeded: quota exceeded on /scratch")
    plain = start(*FAST, FAILS, *say, "--exit", "1")
    assert plain.wait() == 2
    assert _decisions(plain) == [("abort", "P3")]
    d = start(*FAST, FAILS, *say, "--exit", "1", env=env)
    assert d.wait() == 200, d.stderr()
    assert _decisions(d) == [("reschedule", "SITE-QUOTA")]
    assert d.events("decision")[0]["classifier"] == "site_policy"
    loaded = d.events("plugins_loaded")[0]
    assert loaded["plugins"] == ["rules", "site_policy"] and loaded["failed"] == ["broken"]
    failed = d.events("plugin_failed")[0]
    assert failed["plugin"] == "broken" and "ft_test_plugin_missing" in failed["error"]
    # disabled by name: the built-ins decide again
    off = start(*FAST, "--disable-plugins", "site_policy,broken", FAILS, *say, "--exit", "1", env=env)
    assert off.wait() == 2
    assert _decisions(off) == [("abort", "P3")]


def test_bad_policy_options_fail_with_a_clear_message(start: Start, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nid = "X"\nany = ["("]\n')
    for args, message in (
        (("--reschedule-exit-code", "137"), "would read as a death by signal 9"),
        (("--reschedule-exit-code", "2"), "must differ"),
        (("--policy-preset", "retry,teleport"), "unknown policy preset(s) ['teleport']"),
        (("--rules", str(bad)), "is not a valid regex"),
        (("--rules", str(tmp_path / "none.toml")), "cannot read it"),
        (("--restart-window", "-3"), "--restart-window '-3': a duration cannot be negative"),
    ):
        d = start(*FAST, *args, FAILS)
        assert d.wait() == 2
        assert message in d.stderr(), d.stderr()


def test_a_rank_that_failed_but_cannot_exit_is_ended_after_the_grace(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "1", "--exit-grace", "1", FAILS, "--generations", "0",
              "--error-file", "--stuck-at-exit", "--raise", "RuntimeError", "teardown hangs")  # fmt: skip
    d.wait_event("generation_started", where=lambda e: e["generation"] == 1)
    d.signal(15)
    assert d.wait() == 128 + 15
    reported = d.events("rank_failure_reported")[0]
    stuck = d.events("rank_exit_stuck")[0]
    assert (reported["rank"], stuck["rank"]) == (1, 1)
    assert stuck["waited"] >= 1
    exited = next(e for e in d.events("rank_exited") if e["generation"] == 0 and e["rank"] == 1)
    assert exited["signal"] == "SIGKILL"
    # its error file makes it the root cause, though we killed it
    assert _decisions(d) == [("restart", "P9")]
    assert "RuntimeError: teardown hangs" in d.events("decision")[0]["detail"]


def test_a_rank_whose_nccl_watchdog_said_it_goes_down_but_stays_is_ended_after_a_grace(start: Start) -> None:
    """Captured on an H200: the NCCL watchdog timed a collective out and said it would
    take the process down, and 50 s later the process was still there (its abort waited
    for a GPU kernel). No error file, no exception report, no heartbeat timeout set: only
    the log says it. The rank replays that log and stays; the daemon counts the line as
    the rank's failure report, ends it after --exit-grace and judges N1 (no restarts
    left: the node goes elsewhere); ``classify`` reads the run the same way."""
    captured = FAILURES / "n1_watchdog_timeout_captured_h200.log"
    d = start(*FAST, "--max-restarts", "0", "--exit-grace", "1", FAILS, "--say-file", str(captured),
              "--stuck-at-exit")  # fmt: skip
    assert d.wait(60) == 200, d.story()
    (reported,) = d.events("rank_failure_reported")
    assert reported["rank"] == 1 and "Watchdog caught collective operation timeout" in reported["how"]
    assert d.events("rank_exit_stuck")[0]["rank"] == 1
    assert _decisions(d) == [("reschedule", "N1")]
    run_dir = d.run_dir()
    assert run_dir is not None
    offline = subprocess.run([sys.executable, "-m", "supervisor", "classify", "--json", str(run_dir)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    c = json.loads(offline.stdout)["classification"]
    assert (c["rule"], c["rank"]) == ("N1", 1), c
