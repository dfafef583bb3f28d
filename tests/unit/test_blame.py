"""Which rank is stuck: real stack dumps of gloo ranks (tests/fixtures/stacks), and the blame rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.blame import Suspect, blame
from supervisor.core.stacks import Frame, Reading, Where, main_thread, read
from supervisor.core.watch import Hang, HangKind

STACKS = Path(__file__).resolve().parent.parent / "fixtures" / "stacks"


def _read(name: str) -> Reading:
    reading = read((STACKS / name).read_text())
    assert reading is not None
    return reading


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("ddp_rank0.txt", Where.COMPUTE),  # loss.backward(): DDP waits for its all-reduce there
        ("ddp_rank1.txt", Where.OWN),
        ("allreduce_rank0.txt", Where.COLLECTIVE),
        ("allreduce_rank1.txt", Where.OWN),
        ("barrier_rank0.txt", Where.COLLECTIVE),
        ("barrier_rank1.txt", Where.OWN),
        ("lightning_rank0.txt", Where.COMPUTE),
        ("lightning_rank1.txt", Where.OWN),  # inside training_step
        ("loader_rank0.txt", Where.COMPUTE),
        ("loader_rank1.txt", Where.OWN),  # waiting for its own data loader workers
    ],
)
def test_where_a_real_rank_stands(name: str, where: Where) -> None:
    assert _read(name).where is where


def test_the_main_thread_is_found_among_the_loader_threads() -> None:
    frames = main_thread((STACKS / "loader_rank1.txt").read_text())
    assert frames is not None
    assert frames[0].func == "select"
    assert frames[-1].func == "<module>"
    assert read("no dump here\n") is None


NOW = 100.5  # when the deadline fired; the suspects were last heard from around 100


def _missed(rank: int, timeout: float = 5.0) -> Hang:
    return Hang(rank, HangKind.SECTION, "step", timeout, timeout + 0.001, 0.001)


def _suspect(rank: int, name: str | None, last_seen: float = 100.0, **kw: object) -> Suspect:
    return Suspect(rank, _read(name) if name else None, last_seen, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("pair", ["ddp", "allreduce", "barrier", "lightning", "loader"])
def test_the_rank_not_waiting_is_blamed_even_when_its_peer_missed_the_deadline(pair: str) -> None:
    # the waiting peer opened its step first, so its deadline is the one that fired
    suspects = [_suspect(0, f"{pair}_rank0.txt", 100.0), _suspect(1, f"{pair}_rank1.txt", 100.01)]
    found = blame(suspects, _missed(0), NOW)
    assert found.ranks == (1,)
    assert found.by == "stacks"
    assert not found.undetermined
    assert "rank 1: own" in found.detail


def test_a_stopped_rank_is_blamed_before_one_in_its_own_code() -> None:
    stopped = Suspect(1, Reading(Where.STOPPED, (), "stopped (SIGSTOP)"), 100.0)
    found = blame([_suspect(0, "allreduce_rank1.txt"), stopped], _missed(0), NOW)
    assert found.ranks == (1,)
    assert "stopped (SIGSTOP)" in found.detail


def test_ranks_alike_in_every_way_are_undetermined_and_say_so() -> None:
    both = [_suspect(0, "ddp_rank1.txt", 100.0), _suspect(1, "ddp_rank1.txt", 100.0)]
    found = blame(both, _missed(0), NOW)
    assert found.undetermined
    assert found.ranks == (0,)  # only the deadline that fired: rank 1's has not passed yet
    assert "could not be told apart" in found.detail
    late = Hang(1, HangKind.SECTION, "step", 5.0, 5.0005, 0.0)
    both[1] = _suspect(1, "ddp_rank1.txt", 100.0, hang=late)
    assert blame(both, _missed(0), NOW).ranks == (0, 1)  # both past their deadlines: both hung


def test_when_every_rank_waits_in_a_collective_the_stuck_one_is_elsewhere() -> None:
    both = [_suspect(0, "allreduce_rank0.txt"), _suspect(1, "barrier_rank0.txt")]
    found = blame(both, _missed(1), NOW)
    assert found.undetermined
    assert found.waiting == (0, 1)
    assert "the stuck rank is elsewhere" in found.detail
    # ...unless a rank of this node gave no stacks: that is the one they wait for
    found = blame([*both, Suspect(2, None, 100.0)], _missed(1), NOW)
    assert (found.ranks, found.by) == ((2,), "stacks")


def test_the_odd_one_out_among_many_ranks_at_the_same_level() -> None:
    elsewhere = Reading(Where.COLLECTIVE, (Frame("/x/distributed_c10d.py", "broadcast"),), "broadcast")
    suspects = [_suspect(r, "allreduce_rank0.txt") for r in range(4)]
    suspects[2] = Suspect(2, elsewhere, 100.0)
    found = blame(suspects, _missed(0), NOW)
    assert (found.ranks, found.by) == ((2,), "stacks")
    assert "3 of 4 ranks stand at" in found.detail


def test_progress_tells_when_there_are_no_stacks() -> None:
    behind = [Suspect(0, None, 100.0, iteration=41), Suspect(1, None, 100.2, iteration=40)]
    found = blame(behind, _missed(0), NOW)
    assert (found.ranks, found.by) == ((1,), "progress")
    # a much older silence tells too; a small one (a step apart) does not
    silent = [Suspect(0, None, 100.0), Suspect(1, None, 90.0)]
    assert blame(silent, _missed(0), NOW).ranks == (1,)
    close = [Suspect(0, None, 100.0), Suspect(1, None, 99.7)]
    assert blame(close, _missed(0), NOW).undetermined


def test_several_stuck_ranks_are_all_blamed_the_longest_silent_first() -> None:
    suspects = [
        _suspect(0, "allreduce_rank1.txt", 100.5),
        _suspect(1, "allreduce_rank1.txt", 100.0),
        _suspect(2, "allreduce_rank0.txt", 101.0),
    ]
    found = blame(suspects, _missed(2), NOW)
    assert found.ranks == (1, 0)
    assert found.waiting == (2,)


def test_two_silent_ranks_in_their_own_code_are_both_hung_a_talking_one_is_not() -> None:
    # both stuck in their own code since about when the missed step opened
    both = [_suspect(0, "ddp_rank1.txt", 95.5), _suspect(1, "ddp_rank1.txt", 95.501)]
    found = blame(both, _missed(0), NOW)
    assert (found.ranks, found.undetermined) == ((0, 1), True)
    # a job without collectives: rank 1 keeps stepping and reporting, it is not stuck
    talking = [_suspect(0, "ddp_rank1.txt", 95.5), _suspect(1, "ddp_rank1.txt", 100.49)]
    assert blame(talking, _missed(0), NOW).ranks == (0,)
    # a rank waiting in a collective is never named for its silence alone
    waiting = [_suspect(0, "ddp_rank1.txt", 95.5), _suspect(1, "allreduce_rank0.txt", 95.5)]
    assert blame(waiting, _missed(1), NOW).ranks == (0,)


def test_the_flight_recorder_names_the_rank_that_did_not_issue_the_collective() -> None:
    """On NCCL a waiting rank is often at a host sync that looks like its own code
    (``.item()``), and a rank stuck inside backward looks like one waiting: the stacks
    blame the wrong one. NCCL's Flight Recorder says who issued the collective."""
    item, backward = _suspect(0, "ddp_rank1.txt"), _suspect(1, "ddp_rank0.txt")  # own code; compute
    assert blame([item, backward], _missed(0), NOW).ranks == (0,)  # the stacks alone: wrong
    item = _suspect(0, "ddp_rank1.txt", enqueued={"0": 8, "1": 2})
    backward = _suspect(1, "ddp_rank0.txt", enqueued={"0": 7, "1": 2})
    found = blame([item, backward], _missed(0), NOW)
    assert (found.ranks, found.by) == ((1,), "flight_recorder")
    assert "group 0: rank(s) 1 issued 7 collectives, others 8" in found.detail


def test_without_two_agreeing_dumps_the_flight_recorder_says_nothing() -> None:
    stopped = Suspect(1, Reading(Where.STOPPED, (), "stopped (SIGSTOP)"), 100.0)  # a stopped rank cannot dump
    found = blame([_suspect(0, "allreduce_rank1.txt", enqueued={"0": 5}), stopped], _missed(0), NOW)
    assert (found.ranks, found.by) == ((1,), "stacks")
    # each behind the other in one group: no verdict from the recorder
    crossed = [_suspect(0, "allreduce_rank0.txt", enqueued={"0": 5, "1": 3}),
               _suspect(1, "allreduce_rank1.txt", enqueued={"0": 4, "1": 4})]  # fmt: skip
    assert blame(crossed, _missed(0), NOW).by == "stacks"
