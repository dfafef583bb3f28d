"""The run report claims only what the event log shows: ranks that report no steps (no
client) are known to have started, never to be training, so no goodput is claimed and a
restart is measured to every rank started, and said so."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import main
from tests.fast.fakes import Rank
from tests.fast.harness import supervise


async def without_client(r: Rank) -> int | None:
    """A plain script: imports for a while, trains, rank 1 fails once; says nothing to the daemon."""
    await r.sleep(3.0)  # its imports: start-up, not training
    if r.generation == 0 and r.rank == 1:
        return 1
    await r.sleep(2.0)
    return 0


async def with_client(r: Rank) -> int | None:
    r.hello()
    await r.sleep(3.0)
    if r.generation == 0 and r.rank == 1:
        return 1
    await r.train(5)
    return 0


def report(run_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[str, str]:
    page = tmp_path / "page.html"
    capsys.readouterr()
    assert main(["report", str(run_dir), "--html", str(page)]) == 0
    return capsys.readouterr().out, page.read_text()


def test_without_steps_the_report_says_unknown_and_measures_to_ranks_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = supervise(tmp_path, without_client, "--max-restarts", "1")
    assert run.code == 0, run.story()
    assert not run.named("rank_stepping")
    text, page = report(run.rundir, capsys, tmp_path)
    assert "goodput unknown: the ranks report no steps" in text, text
    assert "every rank was started again" in text and "was stepping again" not in text, text
    assert "when they were stepping again is unknown" in text
    assert "  ranks running " in text and "productive" not in text, text
    assert "goodput unknown" in page and "measured to every rank started" in page


def test_with_steps_the_same_run_has_a_goodput_and_measures_to_stepping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = supervise(tmp_path, with_client, "--max-restarts", "1")
    assert run.code == 0, run.story()
    text, page = report(run.rundir, capsys, tmp_path)
    assert "goodput unknown" not in text and "every rank was stepping again" in text, text
    assert "  productive " in text and "unknown" not in page
