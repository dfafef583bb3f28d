"""Checkpoint sync options: forms, defaults, and a clear error for each mistake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config.build import build_run_config
from supervisor.config.checkpoints import check_url, split_url
from supervisor.config.errors import ConfigError
from supervisor.config.run import RunConfig


@pytest.fixture
def script(tmp_path: Path) -> Path:
    s = tmp_path / "s.py"
    s.write_text("pass\n")
    return s


def parse(script: Path, *argv: str, environ: dict[str, str] | None = None) -> RunConfig:
    ns = build_parser().parse_args(["run", *argv, str(script)])
    return build_run_config(ns, environ or {})


def test_off_unless_asked(script: Path) -> None:
    assert parse(script).checkpoint is None


def test_forms_and_defaults(script: Path, tmp_path: Path) -> None:
    cfg = parse(script, "--checkpoint-path", "ckpt", "--checkpoint-url", str(tmp_path / "dest")).checkpoint
    assert cfg is not None
    assert cfg.path == Path("ckpt").absolute() and cfg.url == str(tmp_path / "dest")
    assert (cfg.frequency, cfg.keep, cfg.final_timeout, cfg.settle) == (300.0, None, 300.0, 2.0)
    assert cfg.restore_timeout == 600.0
    cfg = parse(
        script,
        "--checkpoint-path",
        "ckpt",
        "--checkpoint-url",
        f"file://{tmp_path}/d",
        "--checkpoint-frequency",
        "30s",
        "--checkpoint-keep",
        "3",
        "--checkpoint-final-timeout",
        "2m",
        "--checkpoint-restore-timeout",
        "1h",
        "--checkpoint-settle",
        "0.5",
    ).checkpoint
    assert cfg is not None
    assert cfg.restore_timeout == 3600.0
    assert (cfg.url, cfg.frequency, cfg.keep, cfg.final_timeout, cfg.settle) == (
        f"{tmp_path}/d",
        30.0,
        3,
        120.0,
        0.5,
    )


def test_environment_variables_and_the_command_line_wins(script: Path, tmp_path: Path) -> None:
    env = {
        "FT_SUPERVISOR_CHECKPOINT_PATH": str(tmp_path / "l"),
        "FT_SUPERVISOR_CHECKPOINT_URL": "memory://bucket/run",
        "FT_SUPERVISOR_CHECKPOINT_FREQUENCY": "1h",
    }
    cfg = parse(script, "--checkpoint-frequency", "90", environ=env).checkpoint
    assert cfg is not None
    assert (cfg.path, cfg.url, cfg.frequency) == (tmp_path / "l", "memory://bucket/run", 90.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-path", "l"], "--checkpoint-path needs --checkpoint-url"),
        (["--checkpoint-url", "d"], "--checkpoint-url needs --checkpoint-path"),
        (["--checkpoint-keep", "2"], "--checkpoint-keep needs --checkpoint-path and --checkpoint-url"),
        (
            ["--checkpoint-path", "l", "--checkpoint-url", "d", "--checkpoint-frequency", "5 min"],
            "--checkpoint-frequency '5 min': expected a duration such as 90, 90.5, 30s, 5m",
        ),
        (
            ["--checkpoint-path", "l", "--checkpoint-url", "d", "--checkpoint-frequency", "0"],
            "--checkpoint-frequency '0': must be more than 0",
        ),
        (
            ["--checkpoint-path", "l", "--checkpoint-url", "d", "--checkpoint-keep", "0"],
            "--checkpoint-keep 0: must be at least 1",
        ),
        (
            ["--checkpoint-path", "l", "--checkpoint-url", "d", "--checkpoint-keep", "two"],
            "--checkpoint-keep 'two': expected a whole number",
        ),
        (
            ["--checkpoint-path", "l", "--checkpoint-url", "d", "--checkpoint-settle", "-1"],
            "--checkpoint-settle '-1': a duration cannot be negative",
        ),
        (["--checkpoint-path", "l", "--checkpoint-url", "l/dest"], "overlap: DEST must be another directory"),
        (["--checkpoint-path", "l", "--checkpoint-url", "nosuch://x"], "scheme nosuch://"),
    ],
)
def test_mistakes_are_named(script: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse(script, *argv)


def test_a_scheme_without_fsspec_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if it were not installed
    assert check_url("s3://bucket/run") == (
        "the s3:// scheme needs fsspec: pip install 'ft-supervisor[fsspec]'"
    )
    assert check_url("/mnt/shared/run") is None  # a directory needs nothing
    assert split_url("file:///mnt/x") == (None, "/mnt/x")


def test_the_command_line_exits_2_with_the_message(script: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "supervisor", "run", "--checkpoint-url", "d", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert "--checkpoint-url needs --checkpoint-path" in r.stderr
