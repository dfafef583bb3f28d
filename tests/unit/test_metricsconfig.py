"""``--metrics-port`` / ``--metrics-addr``: off by default, loopback unless told, clear errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.metrics import LOOPBACK, MetricsConfig
from supervisor.config.run import RunConfig


@pytest.fixture
def script(tmp_path: Path) -> Path:
    s = tmp_path / "s.py"
    s.write_text("pass\n")
    return s


def _parse(script: Path, *argv: str, environ: Mapping[str, str] | None = None) -> RunConfig:
    ns = build_parser().parse_args(["run", *argv, str(script)])
    return build_run_config(ns, environ or {})


def test_off_unless_a_port_is_given(script: Path) -> None:
    cfg = _parse(script).metrics
    assert cfg == MetricsConfig() and not cfg.enabled


def test_loopback_by_default_any_other_address_only_when_given(script: Path) -> None:
    assert _parse(script, "--metrics-port", "0").metrics == MetricsConfig(port=0, addr="127.0.0.1")
    assert LOOPBACK == "127.0.0.1"
    assert _parse(script, "--metrics-port", "9400", "--metrics-addr", "::1").metrics.addr == "::1"
    assert _parse(script, "--metrics-port", "9400", "--metrics-addr", "0.0.0.0").metrics.addr == "0.0.0.0"


def test_environment_variables_and_the_command_line_wins(script: Path) -> None:
    env = {"FT_SUPERVISOR_METRICS_PORT": "9401", "FT_SUPERVISOR_METRICS_ADDR": "localhost"}
    assert _parse(script, environ=env).metrics == MetricsConfig(port=9401, addr="localhost")
    assert _parse(script, "--metrics-port", "9402", environ=env).metrics.port == 9402


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metrics-port", "http"], "--metrics-port 'http': expected a port number"),
        (["--metrics-port", "70000"], "--metrics-port 70000: expected 0-65535"),
        (["--metrics-port", "-1"], "--metrics-port -1: expected 0-65535"),
        (["--metrics-addr", "127.0.0.1"], "--metrics-addr '127.0.0.1' without --metrics-port"),
        (
            ["--metrics-port", "0", "--metrics-addr", "no such host"],
            "expected an IP address .* or a host name",
        ),
        (["--metrics-port", "0", "--metrics-addr", "http://x"], "expected an IP address"),
    ],
)
def test_bad_values_name_the_option(script: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(script, *argv)


def test_without_the_extra_the_error_names_it(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry makes ``import prometheus_client`` fail, as when it is not installed
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match=r"pip install 'ft-supervisor\[metrics\]'"):
        _parse(script, "--metrics-port", "0")
    assert not _parse(script).metrics.enabled  # metrics off: the package is not needed


def test_the_missing_extra_exits_2_before_anything_starts(script: Path, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None; "
        "from supervisor.cli import main; sys.exit(main())"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "run", "--log-dir", str(tmp_path / "logs"), "--metrics-port", "0",
         str(script)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "pip install 'ft-supervisor[metrics]'" in r.stderr
    assert not (tmp_path / "logs").exists()
