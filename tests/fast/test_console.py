"""The console is for people, ``--log-format json`` for log shippers: what a real daemon
says through the real formatters over a run with a hang, a crash, a status and an abort."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import log
from supervisor.log.human import WIDTH
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Rank
from tests.fast.harness import Watcher, supervise
from tests.fast.test_hangs import Monitored
from tests.fast.test_loop import crash_always

INLINE_JSON = re.compile(r'[{\[]"|":|\{\}|\[\]')


class Lines(logging.Handler):
    """The lines the daemon's logger hands the console, formatted by the product's formatter."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += self.format(record).splitlines()


@pytest.fixture
def said(request: pytest.FixtureRequest) -> Iterator[Lines]:
    lines = Lines(log.JsonFormatter() if request.param == "json" else log.EventFormatter())
    logger = logging.getLogger("ft-supervisor.fast")  # tests/fast/harness.py's
    kept = logger.handlers[:]
    logger.handlers[:], level = [lines], logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.handlers[:] = kept
        logger.setLevel(level)


def a_run_with_everything(tmp_path: Path) -> None:
    """A hang found by its heartbeat (stacks dumped), a restart, a status, crashes until the
    budget is spent, the failure block, the end."""

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("rank_stepping", generation=1, rank=1)
        daemon.commands.queue.put_nowait(signals.DumpStatus())

    async def script(r: Rank) -> int | None:
        if r.generation == 0:
            return await Monitored(heartbeat=True, hang_at=3, steps=50)(r)
        return await crash_always(r)

    run = supervise(tmp_path, script, "--max-restarts", "2", "--ft-rank-heartbeat-timeout", "0.5",
                    "--ft-rank-section-timeouts", "step:30,eval:600", operator=operator)  # fmt: skip
    assert run.code != 0 and run.one("status") and run.named("rank_hung"), run.story()


@pytest.mark.parametrize("said", ["human"], indirect=True)
def test_people_get_short_lines_without_json(tmp_path: Path, said: Lines) -> None:
    a_run_with_everything(tmp_path)
    assert len(said.lines) > 30
    for line in said.lines:
        assert len(line) <= WIDTH, line
        assert not INLINE_JSON.search(line), line
    text = "\n".join(said.lines)
    for expected in ("run_started: 2 ranks of fake-rank, at most 2 restarts",
                     "timeouts: heartbeat 0.5 s, section step 30 s, section eval 600 s",
                     "WARNING decision: restart. ", "status: generation 1, restarts 1/2",
                     "WARNING rank_hung: rank 1: heartbeat open 0.5 s (timeout 0.5 s)",
                     "WARNING rank_exited: rank 0 (pid "):  # fmt: skip
        assert expected in text, text
    # every daemon line names its event, as on the events socket and in the event log
    heads = [ln for ln in said.lines if ln.startswith("[ft-supervisor]")]
    assert all(re.match(r"\[ft-supervisor\] \d\d:\d\d:\d\d\.\d{3} (\w+ )?\w+[: ]", ln) for ln in heads)


@pytest.mark.parametrize("said", ["json"], indirect=True)
def test_log_shippers_get_one_json_object_per_line(tmp_path: Path, said: Lines) -> None:
    a_run_with_everything(tmp_path)
    records = [json.loads(line) for line in said.lines]  # every line is one object
    status = next(r for r in records if r["event"] == "status")
    assert [rank["rank"] for rank in status["ranks"]] == [0, 1]  # the fields as they are, nested
    decisions = [r for r in records if r["event"] == "decision"]
    assert decisions[0]["level"] == "warning" and decisions[0]["action"] == "restart"
    assert all(r["time"].endswith("+00:00") for r in records)


def test_a_ranks_lines_carry_one_prefix_and_a_long_line_is_wrapped_not_cut(
    capfd: pytest.CaptureFixture[str],
) -> None:
    long = "x" * 450
    lines = [b"[rank1]: Traceback (most recent call last):", b"[rank1]:", b"[rank0]: another rank's",
             b"plain", long.encode(), "caf\u00e9".encode()]  # fmt: skip
    console = log.Console()
    console.start()
    console.rank_lines(log.STDERR, 1, lines)
    console.close()
    out = capfd.readouterr().err.splitlines()
    assert out[:4] == ["[rank 1] Traceback (most recent call last):", "[rank 1] ",
                       "[rank 1] [rank0]: another rank's", "[rank 1] plain"]  # fmt: skip
    wrapped = [ln for ln in out if ln.startswith("[rank 1] xx")]
    assert len(wrapped) == 3 and all(len(ln) <= WIDTH for ln in wrapped)
    assert "".join(ln.removeprefix("[rank 1] ") for ln in wrapped) == long
    assert out[-1] == "[rank 1] caf\u00e9"


def test_in_json_a_ranks_lines_are_objects_too(capfd: pytest.CaptureFixture[str]) -> None:
    console = log.Console(json_lines=True)
    console.start()
    console.rank_lines(log.STDOUT, 3, [b'step 1 {"loss": 0.5}', b"\xff broken"])
    console.close()
    out = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert [(o["rank"], o["stream"], o["line"]) for o in out] == [
        (3, "stdout", 'step 1 {"loss": 0.5}'), (3, "stdout", "\ufffd broken")]  # fmt: skip


def test_the_console_option_reaches_the_daemon() -> None:
    """--log-format json: the daemon's own formatter is the JSON one."""
    from supervisor.cli import build_parser  # noqa: PLC0415
    from supervisor.config.build import build_run_config  # noqa: PLC0415

    ns = build_parser().parse_args(["run", "--log-format", "json", "--no-python", "true"])
    assert build_run_config(ns, dict(os.environ)).log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--log-format", "yaml", "--no-python", "true"])
    handler = log.ConsoleHandler(log.Console(json_lines=True))
    assert isinstance(handler.formatter, log.JsonFormatter)
