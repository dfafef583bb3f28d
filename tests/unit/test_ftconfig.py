import signal
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config import ft as ftconfig
from supervisor.config.errors import ConfigError
from supervisor.config.ft import FtConfig, load


def test_defaults_monitor_nothing() -> None:
    cfg = load({}, {}, None)
    assert cfg == FtConfig()
    assert not cfg.monitors_anything
    assert cfg.rank_termination_signal == signal.SIGKILL


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "ft.yaml"
    f.write_text(
        "model:\n  layers: 4\ntraining:\n  fault_tolerance:\n"
        "    rank_heartbeat_timeout: 10\n    rank_out_of_section_timeout: 11\n"
        "    initial_rank_heartbeat_timeout: 12\n"
        "    rank_section_timeouts: {setup: 600, step: null}\n"
    )
    env = {"FT_RANK_OUT_OF_SECTION_TIMEOUT": "21", "FT_INITIAL_RANK_HEARTBEAT_TIMEOUT": "22"}
    cfg = load({"initial_rank_heartbeat_timeout": "32"}, env, f)
    assert cfg.rank_heartbeat_timeout == 10.0  # file
    assert cfg.rank_out_of_section_timeout == 21.0  # env beats file
    assert cfg.initial_rank_heartbeat_timeout == 32.0  # CLI beats env
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": None}


def test_toml_and_the_nvrx_config_path_variable(tmp_path: Path) -> None:
    f = tmp_path / "ft.toml"
    f.write_text('[fault_tolerance]\nrank_section_timeouts = "setup:600,step:180"\nsafety_factor = 3\n')
    cfg = load({}, {"FAULT_TOL_CFG_PATH": str(f)}, None)
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0}
    assert cfg.safety_factor == 3.0


def test_unknown_and_nvrx_only_keys_in_a_file_are_ignored_and_reported(tmp_path: Path) -> None:
    f = tmp_path / "ft.yaml"
    f.write_text("fault_tolerance:\n  workload_check_interval: 5\n  some_future_key: 1\n")
    assert load({}, {}, f).ignored == (
        (f"{f}: workload_check_interval", ftconfig.IGNORED["workload_check_interval"]),
        (f"{f}: some_future_key", ftconfig.UNKNOWN),
    )


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"rank_heartbeat_timeout": "soon"}, "--ft-rank-heartbeat-timeout 'soon': expected a duration"),
        ({"rank_heartbeat_timeout": "-1"}, "expected a duration"),
        ({"rank_section_timeouts": "step=5"}, "--ft-rank-section-timeouts 'step=5': expected NAME:DURATION"),
        ({"rank_section_timeouts": "step:x"}, "expected NAME:DURATION"),
        ({"num_warmup_iterations": "1.5"}, "--ft-num-warmup-iterations '1.5': expected an integer >= 0"),
        ({"safety_factor": "0.5"}, "expected a number >= 1"),
        ({"rank_termination_signal": "SIGNOPE"}, "expected a signal name"),
        ({"learn_timeouts": "maybe"}, "expected true or false"),
        ({"stack_dump_timeout": "none"}, "expected a duration"),
        ({"bogus_key": "1"}, "--ft-bogus-key: unknown fault-tolerance setting"),
    ],
)
def test_bad_values_name_the_setting_and_the_form(cli: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(cli, {}, None)


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="FT_RANK_HEARTBEAT_TIMEOUT 'x'"):
        load({}, {"FT_RANK_HEARTBEAT_TIMEOUT": "x"}, None)


def test_file_problems_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: No such file"):
        load({}, {}, missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("fault_tolerance: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load({}, {}, bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("model: {}\n")
    with pytest.raises(ConfigError, match="no 'fault_tolerance' section"):
        load({}, {}, empty)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("fault_tolerance:\n  rank_heartbeat_timeout: [1]\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml: rank_heartbeat_timeout \[1\]"):
        load({}, {}, wrong)


@pytest.mark.parametrize(
    "option",
    [
        "--ft-rank-section-timeouts=setup:600,step:180",
        "--ft-rank_section_timeouts=setup:600,step:180",
        "--ft-param-rank_section_timeouts=setup:600,step:180",  # the seed's ft_launcher example
    ],
)
def test_every_ft_launcher_spelling_is_accepted(option: str, tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("")
    ns = build_parser().parse_args(["run", option, "--ft-workload-check-interval", "5", str(script)])
    cfg = ftconfig.from_namespace(ns, {})
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0}
    assert cfg.ignored == (("--ft-workload-check-interval", ftconfig.IGNORED["workload_check_interval"]),)


def test_timeouts_view() -> None:
    cfg = load({"rank_section_timeouts": "step:3", "num_warmup_iterations": "2"}, {}, None)
    t = cfg.timeouts()
    assert (t.sections, t.warmup_iterations) == ({"step": 3.0}, 2)
    assert cfg.monitors_anything
