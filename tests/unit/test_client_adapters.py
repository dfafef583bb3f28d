"""The client adapters' pure parts: fault descriptions, NVRx state mapping, calls before set-up."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections import Counter
from typing import Any

import pytest

from supervisor import client
from supervisor.client import faults, megatron, nvrx
from supervisor.client.faults import FaultType, SimulatedFault
from supervisor.client.nvrx import (
    HeartbeatTimeouts,
    RankMonitorClient,
    RankMonitorClientError,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
)
from supervisor.core.learning import Learned

# -- fault descriptions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("desc", "expected"),
    [
        ("rank_hung;1;30", SimulatedFault(FaultType.RANK_HUNG, 1, 30.0)),
        ("rank_killed;;2.5", SimulatedFault(FaultType.RANK_KILLED, None, 2.5)),  # Megatron's random rank
        (" sleep ; random ; 0 ; 3 ", SimulatedFault(FaultType.SLEEP, None, 0.0, 3)),
        ("exception;0;1;any", SimulatedFault(FaultType.EXCEPTION, 0, 1.0, None)),
        ("random;7;4;", SimulatedFault(FaultType.RANDOM, 7, 4.0, None)),
    ],
)
def test_parse(desc: str, expected: SimulatedFault) -> None:
    fault = SimulatedFault.parse(desc)
    assert fault == expected
    assert SimulatedFault.parse(fault.describe()) == fault


@pytest.mark.parametrize(
    ("desc", "names"),
    [
        ("rank_hung;1", "expected 'type;rank;delay[;generation]', got 2"),
        ("rank_hung;1;2;3;4", "got 5 field(s)"),
        ("rank_froze;1;2", "type 'rank_froze' is not one of rank_hung, sleep, rank_killed"),
        ("rank_hung;one;2", "rank 'one' must be an integer >= 0"),
        ("rank_hung;-1;2", "rank '-1'"),
        ("rank_hung;1;soon", "delay 'soon' must be seconds >= 0"),
        ("rank_hung;1;-2", "delay '-2'"),
        ("rank_hung;1;nan", "delay 'nan'"),
        ("rank_hung;1;2;first", "generation 'first' must be an integer >= 0"),
    ],
)
def test_parse_errors_name_the_field(desc: str, names: str) -> None:
    with pytest.raises(ValueError, match="simulated fault") as err:
        SimulatedFault.parse(desc)
    assert names in str(err.value)


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(ValueError, match="rank must be"):
        SimulatedFault(FaultType.RANK_HUNG, -1, 1.0)
    with pytest.raises(ValueError, match="delay must be"):
        SimulatedFault(FaultType.RANK_HUNG, 0, float("inf"))
    with pytest.raises(ValueError, match="generation must be"):
        SimulatedFault(FaultType.RANK_HUNG, 0, 1.0, -3)
    assert SimulatedFault("sleep", 0, 1).fault_type is FaultType.SLEEP  # type: ignore[arg-type]


def test_random_choices_agree_across_ranks_and_vary_with_the_seed() -> None:
    fault = SimulatedFault(FaultType.RANDOM, None, 10.0)
    # every rank resolves with the same seed: one answer, whichever rank asks
    assert len({fault.resolve(8, "run:0") for _ in range(5)}) == 1
    draws = [fault.resolve(8, f"run:{g}") for g in range(200)]
    assert set(Counter(rank for _, rank, _ in draws)) == set(range(8))
    assert set(Counter(kind for kind, _, _ in draws)) == set(faults.CONCRETE)
    assert all(10.0 <= delay < 12.0 for _, _, delay in draws)
    fixed = SimulatedFault(FaultType.RANK_KILLED, 3, 10.0)
    assert {fixed.resolve(8, f"run:{g}")[:2] for g in range(20)} == {(FaultType.RANK_KILLED, 3)}
    with pytest.raises(ValueError, match="rank 3 is not in a world of 2"):
        fixed.resolve(2, "run:0")  # a fault that could never fire is a mistake worth hearing about


def _env(rank: int, **extra: str) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    env.update(extra)
    return env


def test_exactly_the_chosen_rank_arms_a_fault() -> None:
    desc = "rank_killed;random;3600;0"
    threads = [faults.setup_simulated_fault(environ=_env(r, FT_SIM_FAULT_DESC=desc)) for r in range(4)]
    armed = [t for t in threads if t is not None]
    try:
        assert len(armed) == 1
        expected = SimulatedFault.parse(desc).resolve(4, "job:0")
        assert (armed[0].fault_type, armed[0].rank) == expected[:2]
        assert armed[0].delay == pytest.approx(expected[2])
        assert armed[0].daemon and armed[0].is_alive()
    finally:
        for t in armed:
            t.cancel()
            t.join(10)
    assert not armed[0].is_alive()


def test_no_fault_without_a_description_or_in_another_generation() -> None:
    assert faults.setup_simulated_fault(environ=_env(0)) is None
    assert faults.setup_simulated_fault(environ=_env(0, FT_SIM_FAULT_DESC="")) is None
    other = _env(1, FT_SIM_FAULT_DESC="rank_killed;1;3600;2", TORCHELASTIC_RESTART_COUNT="1")
    assert faults.setup_simulated_fault(environ=other) is None
    with pytest.raises(ValueError, match="delay"):
        faults.setup_simulated_fault(environ=_env(0, FT_SIM_FAULT_DESC="rank_killed;1;later"))


def test_arguments_override_the_environment() -> None:
    env = _env(2, FT_SIM_FAULT_DESC="rank_killed;1;3600;5")
    # rank and generation from the arguments, type and delay from the environment
    t = faults.setup_simulated_fault(rank=2, generation="any", environ=env)
    assert t is not None
    t.cancel()
    t.join(10)
    assert (t.fault_type, t.rank) == (FaultType.RANK_KILLED, 2)
    # an explicit type ignores the environment, and needs a delay
    assert faults.setup_simulated_fault("rank_hung", rank=1, base_delay=1.0, environ=env) is None
    with pytest.raises(ValueError, match="base_delay is required"):
        faults.setup_simulated_fault("rank_hung", rank=2, environ=env)


def test_main_thread_faults_install_their_handler() -> None:
    previous = signal.getsignal(faults.FAULT_SIGNAL)
    try:
        t = faults.setup_simulated_fault("exception", rank=0, base_delay=3600, environ=_env(0))
        assert t is not None
        t.cancel()
        t.join(10)
        assert callable(signal.getsignal(faults.FAULT_SIGNAL))
    finally:
        signal.signal(faults.FAULT_SIGNAL, previous)


# -- NVRx state mapping ----------------------------------------------------------------

OURS: dict[str, Any] = {  # what our client's state_dict() holds: in force, and what was learned
    "initial_heartbeat": 60.0,
    "heartbeat": 12.5,
    "sections": {"setup": 600.0, "step": 4.0, "checkpointing": None},
    "out_of_section": 30.0,
    "warmup_iterations": 5,
    "learned": {
        "initial_heartbeat": None,
        "heartbeat": 12.5,
        "sections": {"step": 4.0},
        "out_of_section": None,
    },
}

NVRX_STATE: dict[str, Any] = {  # what NVRx's RankMonitorClient.state_dict() writes
    "current_timeouts": {
        "heartbeat": {"initial": 120.0, "subsequent": 20.0, "were_calculated": True},
        "section": {
            "section": {"init": 40.0, "step": 3.5, "checkpoint": None},
            "out_of_section": 25.0,
            "calculated_sections": ["checkpoint", "step"],
            "is_out_of_section_calculated": True,
        },
    }
}


def test_ours_to_nvrx() -> None:
    assert nvrx.to_nvrx_state(OURS) == {
        "current_timeouts": {
            "heartbeat": {"initial": 60.0, "subsequent": 12.5, "were_calculated": True},
            "section": {
                "section": {"setup": 600.0, "step": 4.0, "checkpointing": None},
                "out_of_section": 30.0,
                "calculated_sections": ["step"],
                "is_out_of_section_calculated": False,
            },
        }
    }


def test_nothing_learned_gives_nvrx_an_empty_state() -> None:
    nothing = {**OURS, "learned": {"sections": {}}}
    assert nvrx.to_nvrx_state(nothing) == {"current_timeouts": {}}
    assert nvrx.to_nvrx_state({}) == {"current_timeouts": {}}


def test_nvrx_can_load_what_we_write() -> None:
    """NVRx loads with HeartbeatTimeouts(**...) and SectionTimeouts(**...): ours mirror them."""
    current = json.loads(json.dumps(nvrx.to_nvrx_state(OURS)))["current_timeouts"]
    hb = HeartbeatTimeouts(**current["heartbeat"])
    assert hb.are_valid and hb.were_calculated
    sections = SectionTimeouts(**current["section"])
    assert sections.calculated_sections == {"step"} and not sections.were_calculated
    assert [f.name for f in dataclasses.fields(HeartbeatTimeouts)] == [
        "initial",
        "subsequent",
        "were_calculated",
    ]
    assert [f.name for f in dataclasses.fields(SectionTimeouts)] == [
        "section",
        "out_of_section",
        "calculated_sections",
        "is_out_of_section_calculated",
    ]


def test_nvrx_to_ours_keeps_only_what_was_calculated() -> None:
    # checkpoint was calculated as None: nothing to keep; what NVRx calculated stays
    # calculated (it takes precedence over the configuration, as in NVRx)
    asked = frozenset({"initial_heartbeat", "heartbeat", "section:step", "out_of_section"})
    assert nvrx.learned_from_state(NVRX_STATE) == Learned(120.0, 20.0, {"step": 3.5}, 25.0, asked)
    configured_hb = {
        "current_timeouts": {"heartbeat": {"initial": 9.0, "subsequent": 9.0, "were_calculated": False}}
    }
    assert nvrx.learned_from_state(configured_hb) == Learned()


def test_ours_is_preferred_and_round_trips() -> None:
    state = {**nvrx.to_nvrx_state(OURS), "ft_supervisor_timeouts": OURS}
    state["current_timeouts"]["section"]["calculated_sections"] = ["setup"]  # ours wins: this is ignored
    ours = Learned.from_json(OURS["learned"])
    assert nvrx.learned_from_state(state) == ours
    # through NVRx's form alone the heartbeat pair comes back whole (NVRx keeps pairs)
    through_nvrx = nvrx.learned_from_state(nvrx.to_nvrx_state(OURS))
    assert through_nvrx is not None and through_nvrx.heartbeat == 12.5
    assert nvrx.learned_from_state({"ft_supervisor_timeouts": {"learned": OURS["learned"]}}) == ours


@pytest.mark.parametrize(
    "state",
    [
        None,
        [],
        {"other": 1},
        {"current_timeouts": "x"},
    ],
)
def test_unusable_states_are_ignored(state: object) -> None:
    assert nvrx.learned_from_state(state) is None


def test_malformed_values_inside_are_skipped() -> None:
    state = {
        "current_timeouts": {
            "heartbeat": {"initial": "soon", "subsequent": -1, "were_calculated": True},
            "section": {
                "section": {"step": 2.0, "setup": True},
                "calculated_sections": "step",  # not a list
                "is_out_of_section_calculated": True,
                "out_of_section": float("inf"),
            },
        }
    }
    assert nvrx.learned_from_state(state) == Learned()


def test_only_monitored_timeouts_are_applied() -> None:
    """A loaded heartbeat timeout must not create a deadline for a rank that never heartbeats."""
    in_force = {
        "initial_heartbeat": None,
        "heartbeat": None,
        "sections": {"step": 5.0},
        "out_of_section": 9.0,
    }
    learned = Learned(
        initial_heartbeat=7.0, heartbeat=3.0, sections={"step": 2.0, "init": 4.0}, out_of_section=8.0
    )
    view = nvrx.apply_learned(in_force, learned)
    assert view["sections"] == {"step": 2.0} and view["heartbeat"] is None and view["out_of_section"] == 8.0
    assert view["learned"]["sections"] == {"step": 2.0, "init": 4.0}  # kept, so a saved state keeps it


# -- before set-up: NVRx's errors, and no-ops that touch nothing ------------------------


def test_rank_monitor_client_before_init() -> None:
    cli = RankMonitorClient()
    for call in (
        cli.send_heartbeat,
        lambda: cli.start_section("step"),
        lambda: cli.end_section("step"),
        cli.end_all_sections,
        cli.calculate_and_set_hb_timeouts,
        cli.calculate_and_set_section_timeouts,
    ):
        with pytest.raises(RankMonitorClientError, match="not initialized"):
            call()
    assert cli.hb_timeouts is None and cli.section_timeouts is None
    cli.shutdown_workload_monitoring()  # nothing to shut down: fine, as in NVRx
    assert cli.state_dict() == {"current_timeouts": {}}
    cli.load_state_dict(NVRX_STATE)  # kept for init_workload_monitoring
    assert cli.state_dict()["current_timeouts"]["section"]["calculated_sections"] == ["step"]
    assert cli.state_dict()["ft_supervisor_timeouts"]["learned"]["heartbeat"] == 20.0


def test_workload_control_request_mirrors_nvrx() -> None:
    req = WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU")
    assert str(req) == "WorkloadControlRequest(action=WorkloadAction.ExcludeThisNode, description=bad GPU)"
    assert [a.value for a in WorkloadAction] == [0, 1, 2]
    assert WorkloadControlRequest(WorkloadAction.Continue).description == "<not set>"
    with pytest.raises(RankMonitorClientError, match="not a WorkloadControlRequest"):
        RankMonitorClient().send_workload_control_request("shutdown")  # type: ignore[arg-type]


def test_megatron_hooks_are_no_ops_before_setup() -> None:
    """Nothing is sent, nothing initialised: no warning (warnings fail this suite)."""
    before = (client._held.client, client._held.inactive)
    megatron.on_training_step_start(3)
    megatron.on_training_step_end()
    megatron.on_eval_step_start()
    megatron.on_eval_step_end()
    megatron.on_checkpointing_start()
    megatron.on_checkpointing_end(is_async_finalization=False)
    megatron.on_checkpoint_loaded(is_local_chkpt=False)
    assert megatron.maybe_setup_simulated_fault("rank_killed", 0, 0.0) is None
    megatron.shutdown()
    megatron.abort()
    assert megatron.get_rank_monitor_client() is None
    assert (client._held.client, client._held.inactive) == before
