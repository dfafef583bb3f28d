"""Where a restarted rank resumes: the newer of its memory snapshot and its disk checkpoint
(``supervisor.core.resume_source``), and ``client.resume`` without a daemon."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import client
from supervisor.core.resume_source import choose
from supervisor.core.topology import ENV_RANKS_ENDPOINT

steps = st.none() | st.integers(min_value=0, max_value=10**9)


@pytest.mark.parametrize(
    ("memory", "disk", "loaded", "source", "step"),
    [
        (None, None, False, "none", None),
        (7, None, False, "memory", 7),
        (None, 5, True, "disk", 5),  # the job or the daemon died: disk stays the record
        (7, 5, True, "memory", 7),  # the snapshot is newer: two steps less to redo
        (5, 7, False, "disk", 7),  # a checkpoint saved after the last snapshot
        (6, 6, False, "memory", 6),  # a tie: memory is mapped, the disk not yet read
        (6, 6, True, "disk", 6),  # a tie: the disk checkpoint is already loaded
    ],
)
def test_the_newer_step_wins(
    memory: int | None, disk: int | None, loaded: bool, source: str, step: int | None
) -> None:
    choice = choose(memory, disk, disk_loaded=loaded)
    assert (choice.source, choice.step) == (source, step)


def test_the_line_says_which_and_why() -> None:
    assert choose(7, 5).line() == (
        "resuming at step 7 from memory: newer than the disk checkpoint "
        "(memory snapshot at step 7, disk checkpoint at step 5)"
    )
    assert choose(5, 7).line() == (
        "resuming at step 7 from disk: newer than the memory snapshot "
        "(memory snapshot at step 5, disk checkpoint at step 7)"
    )
    assert choose(None, 3).line().startswith("resuming at step 3 from disk: no snapshot held in memory")
    assert (
        choose(None, None).line()
        == "starting from the beginning: no snapshot held in memory and no disk checkpoint"
    )


@given(steps, steps, st.booleans())
def test_never_an_older_step_than_either(memory: int | None, disk: int | None, loaded: bool) -> None:
    choice = choose(memory, disk, disk_loaded=loaded)
    held = [s for s in (memory, disk) if s is not None]
    assert choice.step == (max(held) if held else None)
    assert choice.source == ("none" if not held else "memory" if choice.step == memory and (
        disk != memory or not loaded) else "disk")  # fmt: skip


def test_resume_without_a_daemon_takes_the_disk_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_RANKS_ENDPOINT, raising=False)
    with warnings.catch_warnings():  # the client's one warning, if no test before said it
        warnings.simplefilter("ignore", RuntimeWarning)
        r = client.resume(disk_step=40)
    assert (r.choice.source, r.choice.step, r.state) == ("disk", 40, None)
    assert (
        "supervisor.client: resuming at step 40 from disk: no snapshot held in memory"
        in capsys.readouterr().err
    )


def test_a_lightning_without_the_connector_it_knows_keeps_the_disk_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from supervisor.client import _lightning_snapshots as snaps  # noqa: PLC0415

    cb = snaps._Snapshotting.__new__(snaps._Snapshotting)
    cb.snapshot_every_n_steps, cb._snapshotted = 1, None
    snaps._Once.pid = None
    cb.on_fit_start(SimpleNamespace(ckpt_path=None), object())  # a trainer of another shape
    assert "no checkpoint connector" in capsys.readouterr().err
