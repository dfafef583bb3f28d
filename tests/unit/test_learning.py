import dataclasses

import pytest

from supervisor.core import learning
from supervisor.core.learning import Learned, Observations, observe
from supervisor.core.watch import RankWatch, Timeouts

SAVED = {"checkpoint_saved": True}
# everything monitored, no timeout yet: what lets every rule be exercised
ALL = Timeouts(
    initial_heartbeat=60.0,
    heartbeat=60.0,
    sections={"step": None, "setup": None, "checkpointing": None, "eval": None},
    out_of_section=60.0,
)


def learn(previous: Learned, obs: Observations, safety_factor: float) -> Learned:
    return learning.learn(previous, obs, ALL, safety_factor)


def test_first_value_is_max_times_safety_then_ema() -> None:
    obs = Observations(sections={"step": 2.0}, timed_steps=16)
    first = learn(Learned(), obs, safety_factor=5.0)
    assert first.sections == {"step": 10.0}
    second = learn(first, Observations(sections={"step": 4.0}, timed_steps=20), safety_factor=5.0)
    assert second.sections == {"step": 15.0}  # 0.5 * 20 + 0.5 * 10


def test_step_needs_enough_timed_iterations() -> None:
    obs = Observations(sections={"step": 2.0}, timed_steps=15)
    assert learn(Learned(), obs, 5.0).sections == {}


@pytest.mark.parametrize(
    ("section", "flags", "learned"),
    [
        ("setup", {}, False),
        ("setup", {"checkpoint_loaded": True}, True),
        ("checkpointing", {}, False),
        ("checkpointing", SAVED, True),
        ("eval", {}, True),
    ],
)
def test_section_rules(section: str, flags: dict[str, bool], learned: bool) -> None:
    obs = Observations(sections={section: 3.0}, **flags)  # type: ignore[arg-type]
    assert (section in learn(Learned(), obs, 2.0).sections) is learned


def test_heartbeat_and_out_of_section_need_steps_and_a_save() -> None:
    obs = Observations(heartbeat_gap=1.0, heartbeat_gaps=16, out_of_section=0.5, timed_steps=16)
    assert learn(Learned(), obs, 5.0) == Learned()
    saved = learn(Learned(), dataclasses.replace(obs, checkpoint_saved=True), 5.0)
    assert (saved.heartbeat, saved.out_of_section) == (5.0, 2.5)


def test_first_heartbeat_needs_a_checkpoint_load() -> None:
    assert learn(Learned(), Observations(first_heartbeat=4.0), 5.0).initial_heartbeat is None
    loaded = learn(Learned(), Observations(first_heartbeat=4.0, checkpoint_loaded=True), 5.0)
    assert loaded.initial_heartbeat == 20.0


def test_observe_takes_maxima_across_ranks_and_the_slowest_step_count() -> None:
    t = Timeouts(sections={"step": 1.0})
    a, b = RankWatch(0, 0.0), RankWatch(1, 0.0)
    for w, length, count in ((a, 0.5, 20), (b, 0.7, 17)):
        for i in range(count):
            w.open_section("step", float(i))
            w.close_section("step", i + length, t)
    obs = observe([a, b])
    assert obs.sections == {"step": pytest.approx(0.7)}
    assert obs.timed_steps == 17
    assert observe([]) == Observations()


def test_what_is_in_force_learned_none_configured_and_number_configured() -> None:
    configured = Timeouts(heartbeat=60.0, sections={"step": 180.0, "setup": None, "eval": None},
                          out_of_section=300.0, learned_floor=2.0)  # fmt: skip
    learned = Learned(heartbeat=5.0, sections={"step": 900.0, "setup": 30.0, "eval": 0.5, "stray": 1.0})
    effective = learned.over(configured)
    # a number the user configured is never tightened by learning, only raised
    assert effective.heartbeat == 60.0
    assert effective.sections["step"] == 900.0
    # "none" means learn it: the learned value, never below the floor
    assert effective.sections["setup"] == 30.0
    assert effective.sections["eval"] == 2.0
    assert "stray" not in effective.sections  # a stray name is not monitored
    assert effective.out_of_section == 300.0


def test_values_the_workload_calculated_itself_take_precedence() -> None:
    # nvidia-resiliency-ext's rule: calculate_and_set_* values override the configuration
    configured = Timeouts(heartbeat=60.0, sections={"step": 180.0}, learned_floor=1.0)
    learned = Learned(heartbeat=5.0, sections={"step": 9.0}, asked=frozenset({"heartbeat", "section:step"}))
    effective = learned.over(configured)
    assert (effective.heartbeat, effective.sections["step"]) == (5.0, 9.0)
    # a null heartbeat timeout is "calculate it": monitored once the workload asked
    assert learned.over(Timeouts(learned_floor=1.0)).heartbeat == 5.0
    assert Learned(heartbeat=5.0).over(Timeouts(learned_floor=1.0)).heartbeat is None
    # and the floor still holds
    tiny = Learned(heartbeat=0.2, asked=frozenset({"heartbeat"}))
    assert tiny.over(Timeouts(learned_floor=10.0)).heartbeat == 10.0


def test_too_tight_a_learned_heartbeat_never_replaces_the_users() -> None:
    # issue 11: --ft-rank-heartbeat-timeout 3 with 100 ms steps learned 1 s and killed a healthy rank
    obs = Observations(heartbeat_gap=0.2, heartbeat_gaps=100, timed_steps=100, checkpoint_saved=True)
    configured = Timeouts(heartbeat=3.0)
    learned = learning.learn(Learned(), obs, configured, 5.0)
    assert learned.heartbeat == pytest.approx(1.0)
    assert learned.over(configured).heartbeat == 3.0


def test_state_round_trip_and_junk() -> None:
    learned = Learned(initial_heartbeat=3.0, sections={"step": 2.0})
    assert Learned.from_json(learned.to_json()) == learned
    assert Learned.from_json("junk") == Learned()
    assert Learned.from_json({"heartbeat": "x", "sections": {"a": -1, "b": True}}) == Learned()
    # a timeout of 1e308 s (or more than a day) would switch hang detection off: refused
    assert Learned.from_json({"heartbeat": 1e308, "sections": {"step": 86401.0}}) == Learned()


def test_nothing_unmonitored_is_learned() -> None:
    obs = Observations(
        first_heartbeat=1.0, heartbeat_gap=1.0, heartbeat_gaps=99, sections={"step": 1.0, "stray": 1.0},
        out_of_section=0.001, timed_steps=99, checkpoint_loaded=True, checkpoint_saved=True,
    )  # fmt: skip
    only_step = Timeouts(sections={"step": None})
    learned = learning.learn(Learned(), obs, only_step, 5.0)
    assert learned == Learned(sections={"step": 5.0})  # no invented heartbeat / out-of-section deadline
    effective = learned.over(only_step)
    assert (effective.heartbeat, effective.out_of_section) == (None, None)


def test_a_learned_timeout_in_force_has_a_floor() -> None:
    obs = Observations(sections={"step": 0.01}, timed_steps=20)
    learned = learning.learn(Learned(), obs, ALL, 5.0)
    assert learned.sections == {"step": pytest.approx(0.05)}  # what was seen, as seen
    assert learned.over(ALL).sections["step"] == 10.0  # the default floor
    assert learned.over(dataclasses.replace(ALL, learned_floor=0.5)).sections["step"] == 0.5


def test_learned_values_never_create_an_unconfigured_deadline() -> None:
    learned = Learned(initial_heartbeat=3.0, heartbeat=2.0, out_of_section=1.0, sections={"step": 19.0})
    effective = learned.over(Timeouts(sections={"step": None}))
    assert (effective.initial_heartbeat, effective.heartbeat, effective.out_of_section) == (None, None, None)
    assert effective.sections == {"step": 19.0}


def test_loaded_state_fills_gaps_but_never_overrides_what_was_learned_here() -> None:
    here = Learned(heartbeat=2.0, sections={"step": 9.0})
    loaded = Learned(heartbeat=50.0, out_of_section=7.0, sections={"step": 99.0, "setup": 30.0})
    assert here.filled_from(loaded) == Learned(
        heartbeat=2.0, out_of_section=7.0, sections={"step": 9.0, "setup": 30.0}
    )


def test_nvrx_section_names_follow_the_same_rules() -> None:
    monitored = Timeouts(sections={"init": None, "checkpoint": None})
    unloaded = Observations(sections={"init": 2.0, "checkpoint": 1.0})
    assert learning.learn(Learned(), unloaded, monitored, 5.0).sections == {}
    ready = Observations(
        sections={"init": 2.0, "checkpoint": 1.0}, checkpoint_loaded=True, checkpoint_saved=True
    )
    assert learning.learn(Learned(), ready, monitored, 5.0).sections == {"init": 10.0, "checkpoint": 5.0}


def test_a_closed_checkpointing_section_alone_is_not_a_save() -> None:
    t = Timeouts(sections={"checkpointing": None})
    w = RankWatch(0, 0.0)
    w.open_section("checkpointing", 1.0)  # an async finalisation, say
    w.close_section("checkpointing", 1.1, t)
    assert not observe([w]).checkpoint_saved
    w.checkpoint_saved = True
    assert observe([w]).checkpoint_saved


def _stepping(w: RankWatch, t: Timeouts, start: float, count: int, length: float) -> float:
    for i in range(count):
        w.open_section("step", start + i)
        w.close_section("step", start + i + length, t)
    return start + count


def test_intervals_that_ended_once_trouble_began_teach_nothing() -> None:
    # issue 11: after a hang, the peer's step (blocked in the all-reduce until the kill)
    # closed 10 s long and the step timeout became 50 s
    t = Timeouts(sections={"step": 10.0})
    w = RankWatch(0, 0.0)
    now = _stepping(w, t, 0.0, 20, 0.1)
    w.open_section("step", now)
    hang_began = now + 0.001  # the peer's step that hung opened here
    w.close_section("step", now + 10.2, t)  # released by the kill
    assert observe([w]).sections["step"] == pytest.approx(10.2)
    assert observe([w], before=hang_began).sections["step"] == pytest.approx(0.1)
    assert observe([w], before=hang_began).timed_steps == 20


def test_a_section_an_exception_went_through_teaches_nothing() -> None:
    t = Timeouts(sections={"step": None})
    w = RankWatch(0, 0.0)
    _stepping(w, t, 0.0, 3, 0.1)
    w.open_section("step", 10.0)
    w.close_section("step", 40.0, t, failed=True)  # a collective timed out after 30 s
    assert w.seen().sections["step"] == pytest.approx(0.1)
    assert w.completed_steps == 3


def test_old_observations_are_folded_in_and_still_count() -> None:
    t = Timeouts(sections={"step": None})
    w = RankWatch(0, 0.0)
    w.open_section("step", 0.0)
    w.close_section("step", 5.0, t)  # the longest, early in the generation
    end = _stepping(w, t, 10.0, 2000, 0.01)
    assert observe([w], before=end).sections["step"] == 5.0
    assert observe([w], before=end).timed_steps == 2001


def test_the_workload_calculates_at_once_from_what_it_showed_so_far() -> None:
    configured = Timeouts(heartbeat=None, sections={"step": 10.0, "init": None}, learned_floor=1.0)
    obs = Observations(first_heartbeat=2.0, heartbeat_gap=0.5, heartbeat_gaps=3, sections={"step": 0.4})
    ask = learning.Calculation(heartbeat=True)
    new = learning.calculate(Learned(), Learned(), obs, configured, ask, safety_factor=5.0)
    assert new is not None
    assert (new.initial_heartbeat, new.heartbeat) == (10.0, 2.5)
    assert new.over(configured).heartbeat == 2.5  # null meant "calculate it": in force now
    # sections: the selected ones must have been seen, else "not enough data"
    steps = learning.Calculation(sections=["step"], sections_too=True)
    stepped = learning.calculate(Learned(), new, obs, configured, steps, safety_factor=5.0)
    assert stepped is not None and stepped.over(configured).sections["step"] == 2.0  # tighter: asked
    every = learning.Calculation(sections_too=True)
    assert learning.calculate(Learned(), new, obs, configured, every, safety_factor=5.0) is None
    # asking again in the same generation merges with the base, not with itself
    again = learning.calculate(Learned(), stepped, obs, configured, steps, safety_factor=5.0)
    assert again == stepped
    # and the end-of-generation rules leave asked values alone
    done = Observations(sections={"step": 3.0}, timed_steps=100)
    assert learning.learn(stepped, done, configured, 5.0).sections["step"] == 2.0


def test_asked_keys_survive_the_state_file() -> None:
    learned = Learned(heartbeat=3.0, asked=frozenset({"heartbeat"}))
    assert Learned.from_json(learned.to_json()) == learned
