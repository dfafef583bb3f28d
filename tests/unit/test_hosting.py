"""The service-facing rules as values: SIGHUP's meaning, forwarded signals, the log
level (NVRx's leaves ours alone), the notify address and the watchdog period."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config import ft as ftconfig
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.ft import load
from supervisor.config.run import RunConfig
from supervisor.core.notify import Narrator, notify_address, watchdog_interval


@pytest.fixture
def script(tmp_path: Path) -> Path:
    s = tmp_path / "s.py"
    s.write_text("pass\n")
    return s


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    f = tmp_path / "ft.yaml"
    f.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 30\n  log_level: DEBUG\n")
    return f


def _config(*argv: str, environ: dict[str, str] | None = None) -> RunConfig:
    return build_run_config(build_parser().parse_args(["run", *argv]), environ or {})


def test_without_a_config_file_sighup_stops_the_run_as_in_torchrun(script: Path) -> None:
    cfg = _config(str(script))
    assert signal.SIGHUP in cfg.stop_signals and cfg.hosting.reload_signals == ()
    assert cfg.hosting.forward_signals == (signal.SIGUSR2, signal.SIGWINCH)


@pytest.mark.parametrize("where", ["option", "environment"])
def test_with_a_config_file_sighup_reloads_instead(script: Path, cfg_file: Path, where: str) -> None:
    if where == "option":
        cfg = _config("--ft-cfg-path", str(cfg_file), str(script))
    else:
        cfg = _config(str(script), environ={"FAULT_TOL_CFG_PATH": str(cfg_file)})
    assert cfg.stop_signals == (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
    assert cfg.hosting.reload_signals == (signal.SIGHUP,) and cfg.hosting.config_file == cfg_file
    assert cfg.signals_to_handle == "SIGTERM,SIGINT,SIGQUIT"  # what the ranks are told


@pytest.mark.parametrize("listed", ["SIGTERM,SIGINT,SIGHUP,SIGQUIT", "SIGHUP"])
def test_sighup_listed_with_a_config_file_is_an_error_naming_both(
    script: Path, cfg_file: Path, listed: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _config("--ft-cfg-path", str(cfg_file), "--signals-to-handle", listed, str(script))
    assert f"--signals-to-handle {listed}" in str(err.value) and f"--ft-cfg-path {cfg_file}" in str(err.value)
    with pytest.raises(ConfigError, match="FAULT_TOL_CFG_PATH="):
        _config("--signals-to-handle", listed, str(script), environ={"FAULT_TOL_CFG_PATH": str(cfg_file)})


def test_forwarded_signals_leave_out_stop_signals_and_can_be_turned_off(script: Path) -> None:
    cfg = _config("--signals-to-handle", "SIGTERM,SIGUSR2", str(script))
    assert cfg.hosting.forward_signals == (signal.SIGWINCH,)  # SIGUSR2 stops the run instead
    assert _config("--forward-signals", "none", str(script)).hosting.forward_signals == ()
    env = {"FT_SUPERVISOR_FORWARD_SIGNALS": "USR1"}
    assert _config(str(script), environ=env).hosting.forward_signals == (signal.SIGUSR1,)
    with pytest.raises(ConfigError, match="--forward-signals 'SIGBOGUS': unknown signal SIGBOGUS"):
        _config("--forward-signals", "SIGBOGUS", str(script))
    with pytest.raises(ConfigError, match="SIGKILL cannot be forwarded"):
        _config("--forward-signals", "SIGKILL", str(script))


def test_nvrx_s_log_level_leaves_the_daemon_s_console_alone(script: Path, cfg_file: Path) -> None:
    """The file says DEBUG for NVRx's own logging: the daemon stays at --log-level's."""
    assert _config(str(script)).log_level == "info"
    from_file = _config("--ft-cfg-path", str(cfg_file), str(script))
    assert from_file.log_level == "info"
    assert [why for option, why in from_file.ft.ignored if option.endswith(": log_level")] == [
        ftconfig.IGNORED["log_level"]
    ]
    assert _config("--ft-log-level", "DEBUG", str(script)).log_level == "info"
    assert _config("--ft-cfg-path", str(cfg_file), "--log-level", "debug", str(script)).log_level == "debug"


def test_a_reload_keeps_what_the_command_line_and_environment_said(script: Path, cfg_file: Path) -> None:
    cfg = _config(
        "--ft-cfg-path", str(cfg_file), "--ft-rank-heartbeat-timeout", "7", str(script),
        environ={"FT_RANK_OUT_OF_SECTION_TIMEOUT": "9", "HOME": "/root"},
    )  # fmt: skip
    h = cfg.hosting
    assert h.ft_overrides == {"rank_heartbeat_timeout": "7"}
    assert h.ft_environ == {"FT_RANK_OUT_OF_SECTION_TIMEOUT": "9"}
    cfg_file.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 1\n  rank_out_of_section_timeout: 2\n")
    again = load(h.ft_overrides, h.ft_environ, h.config_file)
    assert (again.rank_heartbeat_timeout, again.rank_out_of_section_timeout) == (7.0, 9.0)


def test_notify_address_and_watchdog_period() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@abstract") == "\0abstract"
    assert [notify_address(v) for v in (None, "", "@", "vsock:2:1234", "relative")] == [None] * 5
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "41"}, 42) is None
    assert watchdog_interval({}, 42) is None


def test_the_narrator_counts_ranks_per_generation_and_ignores_the_rest() -> None:
    n = Narrator()
    assert n.hear("rank_spawned", {"generation": 0, "local_rank": 0}) == ()
    assert n.hear("rank_spawned", {"generation": 0, "local_rank": 0}) == ()  # a dead standby replaced
    assert n.hear("generation_started", {"generation": 0}) == (
        "READY=1",
        "STATUS=running generation 0 with 1 rank",
    )
    assert n.hear("decision", {"generation": 0, "action": "continue", "reason": "none"}) == ()
    assert n.hear("decision", {"generation": 0, "action": "abort", "reason": "user_code_error"}) == (
        "STATUS=aborting after user_code_error (generation 0)",
    )
    assert n.hear("rank_exited", {"generation": 0}) == ()
    long = n.hear("reload_failed", {"error": "x" * 500 + "\nsecond line"})
    assert long[1].startswith("STATUS=aborting") and len(long[1]) <= len("STATUS=") + 200
    assert "\n" not in long[1]
