from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.watch import HangKind, RankWatch, Timeouts


def test_initial_then_subsequent_heartbeat() -> None:
    t = Timeouts(initial_heartbeat=10.0, heartbeat=2.0)
    w = RankWatch(rank=3, started=100.0)
    d = w.deadline(t)
    assert d is not None and (d.at, d.kind) == (110.0, HangKind.INITIAL_HEARTBEAT)
    assert w.expired(t, 109.999) is None
    hang = w.expired(t, 110.004)
    assert hang is not None and hang.kind is HangKind.INITIAL_HEARTBEAT
    assert round(hang.late_by, 6) == 0.004 and round(hang.open_for, 6) == 10.004
    w.heartbeat(105.0)
    d = w.deadline(t)
    assert d is not None and (d.at, d.kind) == (107.0, HangKind.HEARTBEAT)
    assert "no heartbeat for" in (w.expired(t, 107.5) or _fail()).describe()


def _fail() -> object:
    raise AssertionError("expected a hang")


def test_a_rank_that_said_bye_has_no_deadline_but_keeps_its_observations() -> None:
    t = Timeouts(heartbeat=1.0)
    w = RankWatch(rank=0, started=0.0)
    w.heartbeat(0.5)
    w.heartbeat(1.0)
    w.closed = True
    assert w.deadline(t) is None and w.expired(t, 1e9) is None
    assert w.seen().heartbeat_gap == 0.5


def test_no_timeouts_no_deadline() -> None:
    w = RankWatch(rank=0, started=0.0)
    w.open_section("step", 1.0)
    assert w.deadline(Timeouts()) is None
    assert w.expired(Timeouts(), 1e9) is None


def test_section_timeouts_and_overlap() -> None:
    t = Timeouts(sections={"setup": 60.0, "checkpointing": 5.0})
    w = RankWatch(rank=1, started=0.0)
    assert w.open_section("setup", 1.0)
    assert w.open_section("checkpointing", 2.0)
    assert not w.open_section("setup", 3.0)  # already open: the first opening stands
    d = w.deadline(t)
    assert d is not None and (d.at, d.section) == (7.0, "checkpointing")
    assert w.close_section("checkpointing", 4.0, t)
    assert not w.close_section("checkpointing", 4.0, t)
    d = w.deadline(t)
    assert d is not None and (d.at, d.section) == (61.0, "setup")
    hang = w.expired(t, 61.0)
    assert hang is not None and hang.kind is HangKind.SECTION and hang.section == "setup"


def test_monitored_section_without_timeout_has_no_deadline() -> None:
    t = Timeouts(sections={"step": None})
    w = RankWatch(rank=0, started=0.0)
    w.open_section("step", 1.0)
    assert w.deadline(t) is None


def test_warmup_iterations_are_not_held_to_the_step_timeout() -> None:
    t = Timeouts(sections={"step": 1.0}, warmup_iterations=2)
    w = RankWatch(rank=0, started=0.0)
    for i in range(2):  # two slow warm-up steps
        w.open_section("step", 10.0 * i)
        assert w.expired(t, 10.0 * i + 9.0) is None
        w.close_section("step", 10.0 * i + 9.0, t)
    w.open_section("step", 100.0)
    assert w.expired(t, 101.0) is not None
    assert w.seen().sections == {}  # warm-up steps taught nothing
    assert w.seen().timed_steps == 0


def test_warmup_pseudo_section_times_warmup_steps() -> None:
    t = Timeouts(sections={"step": 1.0, "warmup": 30.0}, warmup_iterations=1)
    w = RankWatch(rank=0, started=0.0)
    w.open_section("step", 0.0)
    d = w.deadline(t)
    assert d is not None and (d.at, d.timeout) == (30.0, 30.0)


def test_out_of_section_for_a_workload_without_sections() -> None:
    t = Timeouts(out_of_section=5.0)
    w = RankWatch(rank=0, started=0.0)
    d = w.deadline(t)
    assert d is not None and (d.at, d.kind) == (5.0, HangKind.OUT_OF_SECTION)
    w.report_iteration(1, 4.0)  # signs of life restart the interval
    w.heartbeat(6.0)
    d = w.deadline(t)
    assert d is not None and d.at == 11.0
    assert w.expired(t, 11.0) is not None
    assert w.seen().out_of_section == 4.0


def test_signs_of_life_inside_a_section_do_not_touch_out_of_section_time() -> None:
    t = Timeouts(sections={"step": 10.0}, out_of_section=5.0)
    w = RankWatch(rank=0, started=0.0)
    w.open_section("step", 1.0)
    w.heartbeat(2.0)
    w.close_section("step", 3.0, t)
    d = w.deadline(t)
    assert d is not None and (d.at, d.kind) == (8.0, HangKind.OUT_OF_SECTION)


def test_out_of_section_waits_for_the_first_step_when_sections_are_used() -> None:
    t = Timeouts(sections={"step": 10.0, "setup": 100.0}, out_of_section=5.0)
    w = RankWatch(rank=0, started=0.0)
    assert w.deadline(t) is None  # setup time runs outside sections
    w.open_section("setup", 1.0)
    w.close_section("setup", 50.0, t)
    assert w.deadline(t) is None
    w.open_section("step", 51.0)
    w.close_section("step", 52.0, t)
    d = w.deadline(t)
    assert d is not None and (d.at, d.kind) == (57.0, HangKind.OUT_OF_SECTION)
    assert w.seen().out_of_section == 1.0  # 50 -> 51


def test_observations_for_learning() -> None:
    t = Timeouts(sections={"step": 1.0, "checkpointing": 1.0})
    w = RankWatch(rank=0, started=0.0)
    w.heartbeat(2.0)
    w.heartbeat(3.5)
    w.heartbeat(4.0)
    w.open_section("step", 4.0)
    w.close_section("step", 4.25, t)
    w.open_section("checkpointing", 5.0)
    w.close_all(8.0, t)
    assert w.seen().first_heartbeat == 2.0
    assert (w.seen().heartbeat_gap, w.seen().heartbeat_gaps) == (1.5, 2)
    assert w.seen().sections == {"step": 0.25, "checkpointing": 3.0}
    assert w.seen().timed_steps == 1


@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=20),
    st.floats(0.1, 50.0),
)
def test_a_rank_that_keeps_its_rhythm_is_never_hung(gaps: list[float], timeout: float) -> None:
    t = Timeouts(heartbeat=timeout, initial_heartbeat=timeout)
    w = RankWatch(rank=0, started=0.0)
    now = 0.0
    for gap in gaps:
        if gap < timeout:
            assert w.expired(t, now + gap) is None
        else:
            assert w.expired(t, now + gap) is not None
        now += gap
        w.heartbeat(now)
        d = w.deadline(t)
        assert d is not None and d.at == now + timeout
