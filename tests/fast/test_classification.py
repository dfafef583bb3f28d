"""Failures classified and decided end to end, in-process on virtual time: the real
daemon and its real classifier, beside fake ranks that fail as
``tests/fixtures/ranks/fails.py`` does; its exit code, its events, its reason file."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Behaviour, Rank
from tests.fast.fakes_failures import console, fails, reason_of
from tests.fast.harness import Operator, Run, Watcher, supervise

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAILURES = FIXTURES / "failures"  # the golden corpus
WATCHDOG = (
    "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=37, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, "
    "Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
)


def rules(run: Run) -> list[tuple[str, str | None]]:
    return [(e["action"], e.get("rule")) for e in run.named("decision")]


def stop_in(generation: int) -> Operator:
    """An operator's SIGTERM once ``generation`` has started."""

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("generation_started", generation=generation)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    return operator


def test_a_dist_backend_error_reschedules_with_the_configured_code(tmp_path: Path) -> None:
    prefix = tmp_path / "errors" / "training_errors.log"
    script = fails(client=True, exc=("torch.distributed.DistBackendError", "NCCL communicator was aborted"),
                   causes=[("RuntimeError", "the peer went away")])  # fmt: skip
    with console() as said:
        run = supervise(tmp_path, script, "--max-restarts", "3", "--reschedule-exit-code", "3",
                        "--error-log-prefix", str(prefix))  # fmt: skip
    assert run.code == 3, run.story()
    assert rules(run) == [("reschedule", "D1")]  # no restart in place: OSMO's rule
    reason = reason_of(run.rundir)
    decided = (reason["outcome"], reason["exit_code"], reason["rule"], reason["rank"])
    assert decided == ("reschedule", 3, "D1", 1)
    assert reason["decision"]["reason"] == "classified"
    assert reason["root_cause"]["rank"] == 1
    assert any("DistBackendError" in line for line in reason["evidence_lines"])
    assert reason["node"] and reason["restarts_used"] == 0
    assert len(run.named("generation_started")) == 1
    # OSMO's launch scripts look for these
    written = (tmp_path / "errors" / "training_errors.log.rank_1").read_text()
    assert written.startswith("Training error occurred: ")
    assert "rule D1" in written
    assert not (tmp_path / "errors" / "training_errors.log.rank_0").exists()  # the peer did not fail
    assert "rule D1 [distributed, transient]" in said.text


def test_an_import_error_at_startup_aborts_without_a_restart(tmp_path: Path) -> None:
    missing = ("ModuleNotFoundError", "No module named 'no_such_module_for_ft_tests'")
    run = supervise(tmp_path, fails(exc=missing), "--max-restarts", "5")
    assert run.code == 2, run.story()
    assert rules(run) == [("abort", "P0")]
    assert len(run.named("generation_started")) == 1
    reason = reason_of(run.rundir)
    assert (reason["outcome"], reason["decision"]["reason"]) == ("abort", "not_retryable")
    assert "ModuleNotFoundError: No module named 'no_such_module_for_ft_tests'" in reason["evidence_lines"]


def test_an_nccl_watchdog_line_then_death_restarts(tmp_path: Path) -> None:
    script = fails(generations=[0], say=["step 812 loss 2.31", WATCHDOG], kill=signal.SIGABRT)
    run = supervise(tmp_path, script, "--max-restarts", "2", operator=stop_in(1))
    assert run.code == 128 + signal.SIGTERM, run.story()
    assert rules(run) == [("restart", "N1")]
    decision = run.one("decision")
    assert decision["rank"] == 1 and "Watchdog caught collective operation timeout" in decision["lines"][0]
    reason = reason_of(run.rundir)
    assert (reason["outcome"], reason["rule"], reason["exit_code"]) == ("stopped", None, 143)
    assert (reason["last_failure"]["rule"], reason["last_failure"]["generation"]) == ("N1", 0)


def test_the_oom_killer_twice_without_progress_aborts(tmp_path: Path) -> None:
    # every generation reports the same 3 iterations and is killed: no progress between kills
    run = supervise(tmp_path, fails(client=True, iterations=3, kill=signal.SIGKILL), "--max-restarts", "5")
    assert run.code == 2, run.story()
    assert rules(run) == [("restart", "X-SIGKILL"), ("abort", "X-SIGKILL")]
    assert run.named("decision")[1]["reason"] == "repeated"


def test_an_exit_no_rule_knows_with_no_budget_left_reschedules(tmp_path: Path) -> None:
    # an exit no rule knows is transient: run it elsewhere
    run = supervise(tmp_path, fails(exit=3), "--max-restarts", "1")
    assert run.code == 200, run.story()
    assert rules(run) == [("restart", "unclassified"), ("reschedule", "unclassified")]
    assert run.named("decision")[1]["reason"] == "restarts_exhausted"


def test_a_python_error_with_no_budget_left_aborts(tmp_path: Path) -> None:
    # a Python error is deterministic: abort
    run = supervise(tmp_path, fails(exc=("RuntimeError", "bad batch")), "--max-restarts", "1")
    assert run.code == 2, run.story()
    assert rules(run) == [("restart", "P9"), ("abort", "P9")]
    assert reason_of(run.rundir)["decision"]["reason"] == "restarts_exhausted"


def test_a_crash_loop_without_progress_aborts(tmp_path: Path) -> None:
    # the client reports iterations 0-2 in every generation: generation 0 advanced,
    # generations 1 and 2 did not: the second cycle without progress aborts
    script = fails(client=True, iterations=3, exit=3)
    run = supervise(tmp_path, script, "--max-restarts", "9", "--ft-max-no-progress-cycles", "2")
    assert run.code == 2, run.story()
    decisions = run.named("decision")
    assert [e["action"] for e in decisions] == ["restart", "restart", "abort"]
    assert decisions[-1]["reason"] == "no_progress"


SITE_RULE = ('[[rule]]\nid = "SITE1"\nany = ["filer .* unreachable"]\naction = "reschedule"\n'
             'nature = "hardware"\ncategory = "storage"\n')  # fmt: skip


def test_a_users_rule_changes_the_decision(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(SITE_RULE)
    run = supervise(tmp_path, fails(say=["ERROR: filer fs7 unreachable"], exit=1), "--rules", str(rules_file))
    assert run.code == 200, run.story()
    assert rules(run) == [("reschedule", "SITE1")]


def test_without_a_plugin_a_disk_quota_aborts(tmp_path: Path) -> None:
    # what tests/integration/test_classification.py's plugin turns into a reschedule
    say = ["OSError: Disk quota exceeded: quota exceeded on /scratch"]
    run = supervise(tmp_path, fails(say=say, exit=1))
    assert run.code == 2, run.story()
    assert rules(run) == [("abort", "P3")]


def install_plugin(site: Path) -> None:
    """A plugin package as pip installs it: a module and its dist-info with an entry point
    (and one whose module is missing)."""
    (site / "ft_test_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "ft_test_plugin-1.0.dist-info" / "METADATA").write_text("Name: ft-test-plugin\nVersion: 1.0\n")
    (site / "ft_test_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[ft_supervisor.plugins]\nsite_policy = ft_test_plugin\nbroken = ft_test_plugin_missing\n"
    )
    (site / "ft_test_plugin.py").write_text("raise AssertionError('a disabled plugin is never imported')\n")


def test_plugins_disabled_by_name_leave_the_decision_to_the_built_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    say = ["OSError: Disk quota exceeded: quota exceeded on /scratch"]
    run = supervise(tmp_path, fails(say=say, exit=1), "--disable-plugins", "site_policy,broken")
    assert run.code == 2, run.story()
    assert rules(run) == [("abort", "P3")]
    assert run.one("plugins_loaded")["plugins"] == ["rules"]
    assert not run.named("plugin_failed")


def test_a_catastrophic_rule_regex_cannot_stall_the_decision(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(
        "[[rule]]\nid = 'BACKTRACK'\nany = ['(a+)+$']\naction = 'abort'\n\n"
        "[[rule]]\nid = 'AAA'\nany = ['a{34}!']\naction = 'restart'\ncategory = 'test'\n"
    )
    # Python's re took hours over that line, on the loop: no decision, SIGTERM ignored
    script = fails(rank=0, generations=[0], say=["a" * 34 + "!"], exit=1)
    run = supervise(tmp_path, script, "--max-restarts", "3", "--rules", str(rules_file), operator=stop_in(1))
    assert run.code == 128 + signal.SIGTERM, run.story()
    decision = run.one("decision")
    assert (decision["action"], decision["rule"], decision["rank"]) == ("restart", "AAA", 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--reschedule-exit-code", "137"), "would read as a death by signal 9"),
        (("--reschedule-exit-code", "2"), "must differ"),
        (("--policy-preset", "retry,teleport"), "unknown policy preset(s) ['teleport']"),
        (("--rules", "bad.toml"), "is not a valid regex"),
        (("--rules", "none.toml"), "cannot read it"),
        (("--restart-window", "-3"), "--restart-window '-3': a duration cannot be negative"),
    ],
    ids=["signal-code", "same-code", "preset", "regex", "no-file", "negative"],
)
def test_bad_policy_options_fail_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, str], message: str
) -> None:
    (tmp_path / "bad.toml").write_text('[[rule]]\nid = "X"\nany = ["("]\n')
    option, value = args
    value = str(tmp_path / value) if value.endswith(".toml") else value
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit) as refused:
        main(["run", "--log-dir", str(logs), "--nproc-per-node", "2", option, value, "train.py"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err  # one line naming the option
    assert not logs.exists()  # refused before any run started


def test_a_rank_that_failed_but_cannot_exit_is_ended_after_the_grace(tmp_path: Path) -> None:
    script = fails(generations=[0], exc=("RuntimeError", "teardown hangs"), error_file=True, stuck=True)
    # its teardown blocks SIGTERM: only SIGKILL ends it
    stuck = lambda generation, rank: Behaviour(ignores_term=(generation, rank) == (0, 1))  # noqa: E731
    run = supervise(tmp_path, script, "--max-restarts", "1", "--exit-grace", "1", behaviour=stuck,
                    operator=stop_in(1))  # fmt: skip
    assert run.code == 128 + signal.SIGTERM, run.story()
    reported, exit_stuck = run.one("rank_failure_reported"), run.one("rank_exit_stuck")
    assert (reported["rank"], exit_stuck["rank"]) == (1, 1)
    # the grace, to the daemon's polling of the logs (0.05 s) on virtual time
    assert 1 <= exit_stuck["waited"] <= 1.05
    assert 1 <= exit_stuck["t_mono"] - reported["t_mono"] <= 1.1
    exited = next(e for e in run.named("rank_exited") if (e["generation"], e["rank"]) == (0, 1))
    assert exited["signal"] == "SIGKILL"
    # its error file makes it the root cause, though we killed it
    assert rules(run) == [("restart", "P9")]
    assert "RuntimeError: teardown hangs" in run.one("decision")["detail"]


def test_a_rank_whose_nccl_watchdog_said_it_goes_down_but_stays_is_ended_after_a_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured on an H200: the NCCL watchdog timed a collective out and said it would
    take the process down, and 50 s later the process was still there. No error file,
    no exception report, no heartbeat timeout set: only the log says it. The daemon
    counts the line as the rank's failure report, ends it after --exit-grace and judges
    N1 (no restarts left: the node goes elsewhere); ``classify`` reads the run the same way."""
    captured = (FAILURES / "n1_watchdog_timeout_captured_h200.log").read_text(errors="replace")
    script = fails(say=[captured], stuck=True)
    stays = lambda generation, rank: Behaviour(ignores_term=rank == 1)  # noqa: E731
    run = supervise(tmp_path, script, "--max-restarts", "0", "--exit-grace", "1", behaviour=stays)
    assert run.code == 200, run.story()
    reported = run.one("rank_failure_reported")
    assert reported["rank"] == 1 and "Watchdog caught collective operation timeout" in reported["how"]
    assert run.one("rank_exit_stuck")["rank"] == 1
    assert rules(run) == [("reschedule", "N1")]
    capsys.readouterr()
    assert main(["classify", "--json", str(run.rundir)]) == 0
    c = json.loads(capsys.readouterr().out)["classification"]
    assert (c["rule"], c["rank"]) == ("N1", 1), c


def test_exhausted_restarts_print_the_root_cause_from_the_error_file(tmp_path: Path) -> None:
    """torch's ``@record`` error file (one a real torch 2.13 rank wrote) names the root
    cause, traceback and all, when the budget runs out; a real ``@record`` run stays in
    tests/integration/test_torch_ranks.py."""
    recorded = (FIXTURES / "errorfiles" / "torch-2.13-record.json").read_text()

    async def records(r: Rank) -> int | None:
        r.hello()
        await r.train(3)
        if r.rank == 1:
            r.log("ValueError: boom from rank 1")  # what Python prints last
            r.files.error_file.write_text(recorded)
            return 1
        await r.hang()  # its peer waits in a collective for it
        return None

    with console() as said:
        run = supervise(tmp_path, records, "--max-restarts", "1")
    assert run.code == 2, run.story()  # a Python error: deterministic, abort
    assert run.decisions() == [("restart", "rank_failed"), ("abort", "restarts_exhausted")]
    assert len(run.named("generation_started")) == 2
    err = said.text
    assert "reason=restarts_exhausted" in err
    assert "root cause: rank 1 (local rank 1" in err
    assert "error file:" in err  # the @record traceback, not just an exit code
    assert 'raise ValueError("boom from rank 1")' in err
    assert reason_of(run.rundir)["root_cause"]["rank"] == 1


def test_the_root_cause_printed_is_the_rank_whose_own_error_caused_its_peers(tmp_path: Path) -> None:
    """Rank 1 raises; its ``finally`` closes the process group and rank 0 reads the reset
    and reports it first, then exits first; rank 1, slow to exit, is stopped. The
    classification names rank 1 (its own error over a reset), and so must the printed
    root cause and reason.json (they named rank 0: what scripts/train.py --plain showed)."""
    reset = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:3475: Connection reset by peer"
    own = "injected fault at step 3 on rank 1"

    async def peer_reset_first(r: Rank) -> int | None:
        r.hello()
        await r.train(3)
        if r.rank == 0:  # its error file and report first, then its exit
            r.send("exception", exc_type="RuntimeError", message=reset, traceback="", causes=[], pid=r.pid)
            code = r.raise_("RuntimeError", reset)
            await r.sleep(0.5)
            return code
        await r.sleep(0.05)
        r.send("exception", exc_type="RuntimeError", message=own, traceback="", causes=[], pid=r.pid)
        r.raise_("RuntimeError", own)  # its error file and traceback, then slow to exit
        await r.hang()
        return None

    with console() as said:
        run = supervise(tmp_path, peer_reset_first, "--max-restarts", "0")
    assert run.code == 2, run.story()
    assert [(e["rank"], e["rule"]) for e in run.named("decision")] == [(1, "P9")]
    assert "root cause: rank 1 (local rank 1" in said.text, said.text
    assert "also failed: rank 0" in said.text
    reason = reason_of(run.rundir)
    assert reason["root_cause"]["rank"] == 1 and reason["failures"][0]["rank"] == 1
