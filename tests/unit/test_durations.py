"""One duration syntax: every option, variable and config-file setting that takes
seconds reads 90, 90.5, 90s, 5m, 2h and 1d alike, and refuses the rest by name."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

import pytest

from supervisor.cli import build_parser, main
from supervisor.config import durations
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.ft import load
from supervisor.config.rendezvous import parse_conf
from supervisor.config.run import RunConfig

FORMS = [("90", 90.0), ("90.5", 90.5), ("90s", 90.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0)]
BAD = ["-5", "-1m", "nan", "inf", "5x", "soon", "1h 30", ""]


@cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _config(tmp: Path, *argv: str, environ: dict[str, str] | None = None) -> RunConfig:
    script = tmp / "s.py"
    script.write_text("")
    return build_run_config(_parser().parse_args(["run", *argv, str(script)]), environ or {})


@pytest.mark.parametrize(("text", "seconds"), [*FORMS, ("0", 0.0), ("1h30m", 5400.0), (" 2.5m ", 150.0)])
def test_the_one_parser(text: str, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("value", [*BAD, float("nan"), float("inf"), -1, True, None, "1" * 65 + "x"])
def test_the_one_parser_refuses_what_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        durations.parse(value)


def test_a_refusal_names_the_option_and_a_long_value_is_cut() -> None:
    with pytest.raises(ConfigError, match=r"^--x '-5': a duration cannot be negative$"):
        durations.seconds("--x", "-5")
    with pytest.raises(ConfigError, match=r"^FT_X 0: must be more than 0 seconds$"):
        durations.seconds("FT_X", 0, positive=True)
    with pytest.raises(ConfigError) as err:
        durations.seconds("--x", "9" * 10_000)
    assert len(str(err.value)) < 200


@pytest.mark.parametrize(("text", "seconds"), FORMS)
def test_every_option_in_seconds_takes_every_form(text: str, seconds: float, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    cfg = _config(
        tmp_path,
        "--shutdown-timeout", text, "--kill-timeout", text, "--exit-grace", text, "--save-timeout", text,
        "--mtbf", text, "--term-timeout", text, "--restart-window", text, "--straggler-sustain", text,
        "--node-quarantine", f"3/{text}",
        "--checkpoint-path", str(tmp_path / "ckpt"), "--checkpoint-url", str(dest),
        "--checkpoint-frequency", text, "--checkpoint-final-timeout", text,
        "--checkpoint-restore-timeout", text, "--checkpoint-settle", text,
        "--ft-initial-rank-heartbeat-timeout", text, "--ft-rank_heartbeat_timeout", text,
        "--ft-param-rank_out_of_section_timeout", text,
        "--ft-rank-section-timeouts", f"setup:{text},step:{text}",
        "--ft-learned-timeout-floor", text, "--ft-stack-dump-timeout", text, "--ft-bundle-timeout", text,
    )  # fmt: skip
    assert cfg.checkpoint is not None and cfg.health.quarantine is not None
    got = [
        cfg.shutdown_timeout, cfg.kill_timeout, cfg.exit_grace, cfg.save_timeout, cfg.mtbf, cfg.term_timeout,
        cfg.policy.restart_window, cfg.stragglers.sustain, cfg.health.quarantine.window,
        cfg.checkpoint.frequency, cfg.checkpoint.final_timeout, cfg.checkpoint.restore_timeout,
        cfg.checkpoint.settle, cfg.ft.initial_rank_heartbeat_timeout, cfg.ft.rank_heartbeat_timeout,
        cfg.ft.rank_out_of_section_timeout, *cfg.ft.rank_section_timeouts.values(),
        cfg.ft.learned_timeout_floor, cfg.ft.stack_dump_timeout, cfg.ft.bundle_timeout,
    ]  # fmt: skip
    assert got == [seconds] * len(got)
    # ft_launcher's name for --shutdown-timeout, and the other commands' options in seconds
    assert _config(tmp_path, "--workers-stop-timeout", text).shutdown_timeout == seconds
    assert _parser().parse_args(["classify", "--restart-window", text, "x"]).restart_window == seconds
    assert _parser().parse_args(["stop", "--timeout", text]).timeout == seconds


@pytest.mark.parametrize(("text", "seconds"), FORMS)
def test_environment_and_config_files_take_every_form(text: str, seconds: float, tmp_path: Path) -> None:
    environ = {
        "FT_RANK_HEARTBEAT_TIMEOUT": text,
        "FT_SUPERVISOR_RESTART_WINDOW": text,
        "FT_SUPERVISOR_STRAGGLER_SUSTAIN": text,
        "FT_SUPERVISOR_NODE_QUARANTINE": f"2/{text}",
        "PET_SHUTDOWN_TIMEOUT": text,
    }
    cfg = _config(tmp_path, environ=environ)
    assert cfg.ft.rank_heartbeat_timeout == cfg.policy.restart_window == cfg.stragglers.sustain == seconds
    assert cfg.health.quarantine is not None and cfg.health.quarantine.window == seconds
    yaml = tmp_path / "ft.yaml"
    yaml.write_text(
        f"fault_tolerance:\n  rank_heartbeat_timeout: {text}\n  initial_rank_heartbeat_timeout: '{text}'\n"
        f"  rank_section_timeouts: {{step: {text}, setup: null}}\n"
    )
    toml = tmp_path / "ft.toml"
    toml.write_text(f'[fault_tolerance]\nrank_out_of_section_timeout = "{text}"\n'
                    f'rank_section_timeouts = "step:{text},setup:none"\n')  # fmt: skip
    for path in (yaml, toml):
        ft = load({}, {}, path)
        timeouts = [
            ft.rank_heartbeat_timeout,
            ft.initial_rank_heartbeat_timeout,
            ft.rank_out_of_section_timeout,
        ]
        assert [t for t in timeouts if t is not None] == [seconds] * (2 if path is yaml else 1)
        assert ft.rank_section_timeouts == {"step": seconds, "setup": None}


@pytest.mark.parametrize(("text", "seconds"), [(t, s) for t, s in FORMS if s == int(s)])
def test_rendezvous_timeouts_take_durations_in_whole_seconds(text: str, seconds: float) -> None:
    assert parse_conf(f"join_timeout={text},last_call_timeout={text},keep_alive_max_attempt=3") == {
        "join_timeout": str(int(seconds)),
        "last_call_timeout": str(int(seconds)),
        "keep_alive_max_attempt": "3",
    }
    with pytest.raises(ConfigError, match=r"--rdzv-conf join_timeout '90\.5': expected a whole number"):
        parse_conf("join_timeout=90.5")
    with pytest.raises(ConfigError, match="keep_alive_max_attempt=1m: expected a whole number"):
        parse_conf("keep_alive_max_attempt=1m")  # a count, not seconds


ARGPARSED = ["--shutdown-timeout", "--kill-timeout", "--exit-grace", "--save-timeout", "--mtbf",
             "--term-timeout", "--workers-stop-timeout"]  # fmt: skip
CONFIGURED = ["--restart-window", "--straggler-sustain", "--ft-rank-heartbeat-timeout",
              "--ft-rank-section-timeouts", "--ft-stack-dump-timeout", "--ft-bundle-timeout"]  # fmt: skip


@pytest.mark.parametrize("option", ARGPARSED)
def test_a_bad_duration_on_the_command_line_is_one_line_naming_the_option(
    option: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for bad in ("-5", "nan", "inf", "5x"):
        with pytest.raises(SystemExit) as exited:
            _config(tmp_path, option, bad)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {option}" in err and repr(bad) in err, err


@pytest.mark.parametrize("option", CONFIGURED)
def test_a_bad_duration_in_a_setting_is_a_config_error_naming_it(option: str, tmp_path: Path) -> None:
    for bad in ("-5", "nan", "inf", "5x"):
        value = f"step:{bad}" if option == "--ft-rank-section-timeouts" else bad
        with pytest.raises(ConfigError, match=f"^{option} "):
            _config(tmp_path, option, value)
    # an FT_SUPERVISOR_* variable is named as the option it stands for (config.environment.pick)
    for where, environ in (("FT_RANK_HEARTBEAT_TIMEOUT", {"FT_RANK_HEARTBEAT_TIMEOUT": "-1m"}),
                           ("--restart-window", {"FT_SUPERVISOR_RESTART_WINDOW": "nan"})):  # fmt: skip
        with pytest.raises(ConfigError, match=f"^{where} "):
            _config(tmp_path, environ=environ)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--node-quarantine", "3/-1d"), ("--checkpoint-frequency", "0"), ("--checkpoint-settle", "-1"),
     ("--restart-window", "0s")],
)  # fmt: skip
def test_zero_or_negative_where_it_makes_no_sense(option: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{option} '{value}'"):
        _config(tmp_path, option, value, "--checkpoint-path", str(tmp_path / "c"), "--checkpoint-url",
                str(tmp_path / "d"))  # fmt: skip


def test_a_bad_duration_in_a_config_file_names_the_file_and_key(tmp_path: Path) -> None:
    f = tmp_path / "ft.yaml"
    f.write_text("fault_tolerance:\n  rank_section_timeouts: {step: -5m}\n")
    with pytest.raises(ConfigError, match=f"^{f}: rank_section_timeouts"):
        load({}, {}, f)


def test_classify_and_run_refuse_a_bad_rules_file_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]\nid = 'x'\n")
    log = tmp_path / "rank.log"
    log.write_text("RuntimeError: boom\n")
    script = tmp_path / "s.py"
    script.write_text("")
    said = {}
    for command, argv in (("run", ["run", "--rules", str(bad), str(script)]),
                          ("classify", ["classify", "--rules", str(bad), str(log)]),
                          ("plugins", ["plugins", "--rules", str(bad)])):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"ft-supervisor {command}: error: --rules {bad}: "), (
            err
        )
        said[command] = err.split(": error: ", 1)[1].split(" (see ")[0]
    assert said["run"] == said["classify"] == said["plugins"]
