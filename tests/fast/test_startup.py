"""What the daemon makes of its command line, its files and its environment, at start
and on SIGHUP, in-process: refusals through ``supervisor.cli.main`` (they stop before
any daemon starts), the rest with the real daemon on virtual time beside fake ranks.
Auto-resume's finished flag, bad config and rules files, NeMo-Run's ft_launcher line,
the reload of the config file."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import build_parser, main
from supervisor.config.build import build_run_config
from supervisor.config.files import MAX_BYTES
from supervisor.runtime.lifecycle import autoresume, signals, start
from supervisor.runtime.lifecycle.daemon import Supervisor
from supervisor.runtime.records.rundir import RunDir
from tests.fast.fakes import Rank
from tests.fast.fakes_failures import console, fails
from tests.fast.harness import Watcher, supervise
from tests.integration.test_nemo_run_ft_launcher import nemo_run_argv

FLAG_ENV = autoresume.ENV


async def nth(seen: Watcher, name: str, n: int) -> dict[str, Any]:
    """The ``n``-th ``name`` event, once it has come."""
    return await seen.nth(name, n)


async def steady(r: Rank) -> int | None:
    r.hello()
    await r.train(3)
    return 0


@pytest.fixture
def in_process_main(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``main(["run", ...])`` in this process: the process's descriptor limit and the
    daemon's logger are left (restored) as they were."""
    monkeypatch.setattr(start, "_bound_descriptors", lambda: None)
    logger = logging.getLogger("supervisor")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    level = logger.level
    yield
    logger.setLevel(level)


def export_at_start(monkeypatch: pytest.MonkeyPatch, flag: Path | None) -> None:
    """What ``run_daemon`` (start.py) does before the Supervisor, which the harness skips:
    the ranks learn the flag's name from the daemon's environment, set once the run
    directory exists (restored after the test)."""
    # set, then deleted: monkeypatch restores the variable's absence too (a bare delenv of an
    # absent variable records nothing, and export's write would outlive the test)
    monkeypatch.setenv(FLAG_ENV, "")
    monkeypatch.delenv(FLAG_ENV)
    create = RunDir.create

    def exporting(log_dir: Path, run_id: str, pid: int, wall: float) -> RunDir:
        rundir = create(log_dir, run_id, pid, wall)
        autoresume.export(flag, rundir.root)
        return rundir

    monkeypatch.setattr(RunDir, "create", exporting)


# -- auto-resume: the finished flag --------------------------------------------------------


def test_autoresume_marks_a_completed_run_and_ranks_see_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], in_process_main: None
) -> None:
    flag = tmp_path / "flags" / "finished"
    export_at_start(monkeypatch, flag)
    run = supervise(tmp_path, steady, "--autoresume", "--finished-flag-file", str(flag), "--rdzv-id", "job9")
    assert run.code == 0, run.story()
    assert json.loads(flag.read_text())["run_id"] == "job9"
    assert run.one("finished_flag_written")["path"] == str(flag)
    assert [r.env[FLAG_ENV] for r in run.ranks.of(0)] == [str(flag)] * 2
    # the outer loop's next attempt does nothing: no run at all, no rank, no event log
    logs, script = tmp_path / "again", tmp_path / "train.py"
    script.write_text("raise SystemExit(1)\n")
    capsys.readouterr()
    again = ["run", "--log-dir", str(logs), "--autoresume", "--finished-flag-file", str(flag), str(script)]
    assert main(again) == 0
    err = capsys.readouterr().err
    assert "already_finished" in err and str(flag) in err, err
    assert not logs.exists()


def test_without_a_flag_file_ranks_get_one_in_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rank's "training finished" (Lightning's autoresume=True) always has a place to go
    export_at_start(monkeypatch, None)
    run = supervise(tmp_path, steady)
    assert run.code == 0, run.story()
    assert [r.env[FLAG_ENV] for r in run.ranks.of(0)] == [str(run.rundir / "finished")] * 2
    assert not run.named("finished_flag_written")  # the daemon itself writes none
    assert not (run.rundir / "finished").exists()


def test_a_failed_run_leaves_no_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = tmp_path / "finished"
    monkeypatch.setenv(FLAG_ENV, str(flag))  # as ft_launcher users set it
    run = supervise(tmp_path, fails(exit=1), "--autoresume")
    assert run.code != 0, run.story()
    assert run.daemon.cfg.finished_flag == flag  # the flag was known: it was not written
    assert not flag.exists()
    assert not run.named("finished_flag_written")


# -- bad files: refused at start, survived on SIGHUP ----------------------------------------

SELF_ALIAS = b"a: &a [*a]\n"  # issue 12's 11 bytes
LAUGHS = b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + b"".join(
    b"%c: &%c [%s]\n" % (name, name, b",".join([b"*%c" % prev] * 9))
    for prev, name in zip(b"abcdefgh", b"bcdefghi", strict=True)
)
NOT_UTF8 = b"fault_tolerance:\n  rank_heartbeat_timeout: 60\n  log_level: \xff\n"
ALIASES = "not valid YAML: anchor &a: anchors and aliases are not accepted"
CONFIG, RULES = ("--ft-cfg-path", "ft.yaml"), ("--rules", "rules.yaml")


@pytest.mark.parametrize(
    ("given", "data", "said"),
    [
        (CONFIG, SELF_ALIAS, ALIASES),
        (CONFIG, LAUGHS, ALIASES),
        (CONFIG, NOT_UTF8, "not UTF-8: byte 0xff at offset 59"),
        (CONFIG, b"fault_tolerance: {}\n" + b"#" * MAX_BYTES, "larger than 1048576 bytes (1 MiB)"),
        (RULES, b"rules: &r [*r]\n", "not valid YAML: anchor &r"),
    ],
    ids=["self-alias", "billion-laughs", "not-utf8", "size", "rules-self-alias"],
)
def test_run_refuses_a_bad_file_at_once_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: tuple[str, str], data: bytes, said: str
) -> None:
    option, name = given
    path = tmp_path / name
    path.write_bytes(data)
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit) as refused:
        main(["run", "--log-dir", str(logs), "--nproc-per-node", "2", option, str(path), "train.py"])
    assert refused.value.code == 2
    line = next(ln for ln in capsys.readouterr().err.splitlines() if said in ln)
    assert str(path) in line
    assert not logs.exists()  # refused before anything started


def test_sighup_with_a_bad_file_keeps_supervising(tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 60\n")
    before: dict[str, Any] = {}

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0, rank=1)
        for count, (data, said) in enumerate(
            [(SELF_ALIAS, ALIASES), (NOT_UTF8, "not UTF-8: byte 0xff at offset 59")], 1
        ):
            cfg.write_bytes(data)
            daemon.commands.queue.put_nowait(signals.Reload())
            failed = await nth(seen, "reload_failed", count)
            assert failed["error"].startswith(f"config file {cfg}: {said}"), failed
        before["events"] = [name for name, _ in seen.seen]
        before["status"] = daemon.commands.control("status")
        # supervision goes on: a rank killed from outside is noticed, the rank group restarted
        first = [r["pid"] for n, r in seen.seen if n == "rank_spawned" and r["generation"] == 0]
        daemon.processes.signaller.group(first[0], signal.SIGKILL)
        await seen.first("generation_started", generation=1)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    async def forever(r: Rank) -> int | None:
        r.hello()
        await r.train(10_000)
        return 0

    run = supervise(tmp_path, forever, "--max-restarts", "3", "--ft-cfg-path", str(cfg), operator=operator)
    assert run.code == 128 + signal.SIGTERM, run.story()
    assert "config_reloaded" not in before["events"] and "generation_ended" not in before["events"]
    assert before["status"]["timeouts"]["heartbeat"] == 60.0  # the settings in force stayed
    decision = run.one("decision")
    assert decision["action"] == "restart" and decision["rank"] == 0
    # the ranks were not touched by the reloads: the only signals are the kill and the stop
    sent = [[s for s in r.proc.signals if s != signal.SIGCONT][:1] for r in run.ranks.of(0)]
    assert sent == [[signal.SIGKILL], [signal.SIGTERM]], [r.proc.signals for r in run.ranks.of(0)]


# -- SIGHUP: a reload with a config file, a stop without ------------------------------------


def test_sighup_reloads_the_config_file_and_leaves_the_ranks_alone(tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("training:\n  fault_tolerance:\n    rank_heartbeat_timeout: 60\n")
    release = asyncio.Event()
    timeouts: list[dict[str, Any]] = []

    async def waits(r: Rank) -> int | None:
        r.hello()
        await release.wait()
        return 0

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("generation_started", generation=0)
        timeouts.append(daemon.commands.control("status")["timeouts"])
        cfg.write_text(
            "training:\n  fault_tolerance:\n    rank_heartbeat_timeout: 90\n"
            "    rank_section_timeouts: {step: 30}\n    log_level: debug\n"
        )
        daemon.commands.queue.put_nowait(signals.Reload())
        await seen.first("config_reloaded")
        timeouts.append(daemon.commands.control("status")["timeouts"])
        cfg.write_text("fault_tolerance: [unclosed\n")
        daemon.commands.queue.put_nowait(signals.Reload())
        await seen.first("reload_failed")
        timeouts.append(daemon.commands.control("status")["timeouts"])
        release.set()

    run = supervise(tmp_path, waits, "--ft-cfg-path", str(cfg), operator=operator)
    assert run.code == 0, run.story()
    assert run.one("hosting")["reload_file"] == str(cfg)
    reloaded = run.one("config_reloaded")
    assert reloaded["changed"] == {
        "rank_heartbeat_timeout": {"from": 60.0, "to": 90.0},
        "rank_section_timeouts": {"from": {}, "to": {"step": 30.0}},
    }
    assert reloaded["not_applied"] is None  # the file's log_level is NVRx's, never the daemon's
    failed = run.one("reload_failed")
    assert str(cfg) in failed["error"] and "not valid YAML" in failed["error"]
    assert [t["heartbeat"] for t in timeouts] == [60.0, 90.0, 90.0]  # the bad file changed nothing
    assert timeouts[1]["sections"] == timeouts[2]["sections"] == {"step": 30.0}
    # the same ranks throughout, never signalled
    assert len(run.ranks.spawned) == 2 and all(r.proc.signals == [] for r in run.ranks.spawned)
    assert not run.named("stop_requested")
    assert run.one("generation_ended")["result"] == "succeeded"


def test_without_a_config_file_sighup_still_stops_the_run_like_torchrun(tmp_path: Path) -> None:
    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=0, rank=1)
        if signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, signal.SIG_IGN, None):
            # not the daemon's: raised, it would end this test process; the test fails on the code
            daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))
            return
        signal.raise_signal(signal.SIGHUP)  # a real signal, through the daemon's own handlers

    async def forever(r: Rank) -> int | None:
        r.hello()
        await r.train(10_000)
        return 0

    run = supervise(tmp_path, forever, operator=operator)
    assert run.code == 128 + signal.SIGHUP, run.story()
    assert run.one("stop_requested")["signal"] == "SIGHUP"
    assert run.one("hosting")["reload_file"] is None
    # as torchrun does, the ranks get the stop signal as it came
    assert {e["signal"] for e in run.named("rank_exited")} == {"SIGHUP"}


# -- NeMo-Run's ft_launcher line ------------------------------------------------------------


async def crash_once(r: Rank) -> int | None:
    """NeMo-Run's test script: no client; rank 1 fails in generation 0."""
    r.log(f"hello from rank {r.rank} of {r.env['WORLD_SIZE']}", stream="stdout")
    return 1 if (r.generation, r.rank) == (0, 1) else 0


def test_nemo_runs_ft_settings_and_max_restarts(tmp_path: Path) -> None:
    argv = nemo_run_argv(
        "train.py", "--crash-once", nproc=2, rdzv_id=77, workload_check_interval=5.0,
        initial_rank_heartbeat_timeout=600.0, rank_heartbeat_timeout=300.0,
        rank_termination_signal="SIGKILL", log_level="DEBUG", max_restarts=2,
    )  # fmt: skip
    assert argv[:4] == ["--ft-workload_check_interval", "5.0", "--ft-initial_rank_heartbeat_timeout", "600.0"]
    ft = argv[: argv.index("--rdzv-backend")]  # a single node's rendezvous is this harness's own
    with console() as said:
        run = supervise(tmp_path, crash_once, *ft)
    assert run.code == 0, run.story()  # rank 1 failed once: --max-restarts 2 restarted it
    started = run.one("run_started")
    assert started["max_restarts"] == 2
    assert started["timeouts"]["heartbeat"] == 300.0 and started["timeouts"]["initial_heartbeat"] == 600.0
    ignored = run.one("settings_ignored")  # once, at start
    assert [s["option"] for s in ignored["settings"]] == ["--ft-workload-check-interval", "--ft-log-level"]
    assert all(s["why"] for s in ignored["settings"])
    assert "settings_ignored" in said.text  # and said on the console
    assert run.daemon.cfg.log_level.upper() != "DEBUG"  # NVRx's log level is not the daemon's
    assert len(run.named("generation_started")) == 2


def test_dgx_cloud_s_line_builds_a_run(tmp_path: Path) -> None:
    """DGX Cloud's form (NeMo-Run 661eaed): torchrun's part is --nnodes and --nproc-per-node
    only, and --ft-use-infra-group-rank False follows the FT settings."""
    argv = [*nemo_run_argv("x", nproc=1, rdzv_id=1, rank_heartbeat_timeout=60.0, max_restarts=3, dgxc=True)]
    ft = argv[: argv.index("--rdzv-backend")]
    assert ft[-2:] == ["--ft-use-infra-group-rank", "False"]
    (tmp_path / "train.py").write_text("")
    torchrun = ["--nnodes", "1", "--nproc-per-node", "2", str(tmp_path / "train.py")]
    cfg = build_run_config(build_parser().parse_args(["run", *ft, *torchrun]), {})
    assert (cfg.max_restarts, cfg.ft.rank_heartbeat_timeout) == (3, 60.0)
    assert [option for option, _ in cfg.ft.ignored] == ["--ft-use-infra-group-rank"]


def test_main_in_a_process_with_threads_of_its_own_returns_when_no_rendezvous_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process_main: None
) -> None:
    # main() ended the process (os._exit) whenever a daemon thread was alive, for the threads
    # torch's C++ rendezvous can leave blocked: called in a pytest worker that had a thread of
    # its own (a client's), it took the worker down. Only a run that had a rendezvous does.
    import threading  # noqa: PLC0415

    flag = tmp_path / "finished"
    flag.write_text("{}")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True, name="a-caller's-own")
    other.start()
    try:
        script = tmp_path / "train.py"
        script.write_text("raise SystemExit(1)\n")
        assert main(["run", "--log-dir", str(tmp_path / "logs"), "--autoresume", "--finished-flag-file",
                     str(flag), str(script)]) == 0  # fmt: skip
    finally:
        stop.set()
        other.join(5)
