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


def learn(previous: Learned, obs: Observations, safety_factor: float, floor: float = 0.0) -> Learned:
    return learning.learn(previous, obs, ALL, safety_factor, floor=floor)


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


def test_learned_values_override_configured_ones_for_monitored_sections() -> None:
    configured = Timeouts(heartbeat=60.0, sections={"step": 180.0, "setup": None}, out_of_section=300.0)
    learned = Learned(heartbeat=5.0, sections={"step": 9.0, "stray": 1.0})
    effective = learned.over(configured)
    assert effective.heartbeat == 5.0
    assert effective.sections == {"step": 9.0, "setup": None}  # a stray name is not monitored
    assert effective.out_of_section == 300.0


def test_state_round_trip_and_junk() -> None:
    learned = Learned(initial_heartbeat=3.0, sections={"step": 2.0})
    assert Learned.from_json(learned.to_json()) == learned
    assert Learned.from_json("junk") == Learned()
    assert Learned.from_json({"heartbeat": "x", "sections": {"a": -1, "b": True}}) == Learned()


def test_nothing_unmonitored_is_learned() -> None:
    obs = Observations(
        first_heartbeat=1.0, heartbeat_gap=1.0, heartbeat_gaps=99, sections={"step": 1.0, "stray": 1.0},
        out_of_section=0.001, timed_steps=99, checkpoint_loaded=True, checkpoint_saved=True,
    )  # fmt: skip
    only_step = Timeouts(sections={"step": None})
    learned = learning.learn(Learned(), obs, only_step, 5.0)
    assert learned == Learned(sections={"step": 5.0})  # no invented heartbeat / out-of-section deadline


def test_a_learned_timeout_has_a_floor() -> None:
    obs = Observations(sections={"step": 0.01}, timed_steps=20)
    assert learning.learn(Learned(), obs, ALL, 5.0).sections == {"step": learning.FLOOR}


def test_learned_values_never_create_an_unconfigured_deadline() -> None:
    learned = Learned(initial_heartbeat=3.0, heartbeat=2.0, out_of_section=1.0, sections={"step": 9.0})
    effective = learned.over(Timeouts(sections={"step": None}))
    assert (effective.initial_heartbeat, effective.heartbeat, effective.out_of_section) == (None, None, None)
    assert effective.sections == {"step": 9.0}


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
