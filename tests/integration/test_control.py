"""``stop``, ``restart`` and ``status`` with several daemons of one user: each names the run
it acted on, and without --pid/--run-id acts only on the one daemon of its environment."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.transport.endpoints import base_dir, running_daemons
from tests.support import RANKS, Daemon, wait_until

ARGS = ("--nproc-per-node", "1", "--preload", "none", str(RANKS / "behave.py"), "--forever")


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.mark.slow
def test_control_commands_act_only_on_this_environments_daemon_and_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 22: `stop` with no --pid stopped another job's daemon and said only stopping=True
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # these daemons only, not other tests'
    env = dict(os.environ)

    def _ctl(env: dict[str, str], cwd: Path, *args: str) -> Result:
        """The command, run in this process (as its console script would) from ``cwd``."""
        monkeypatch.chdir(cwd)
        code = main(list(args))
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    assert base_dir(env).is_relative_to(tmp_path)
    dirs = {name: tmp_path / name for name in ("a", "b", "elsewhere")}
    for d in dirs.values():
        d.mkdir()
    a = Daemon(dirs["a"], ARGS, env=env, run_id="a")  # each runs in its directory, logs under it
    b = Daemon(dirs["b"], ARGS, env=env, run_id="b")
    try:
        wait_until(lambda: len(running_daemons(env)) == 2, 30, "both daemons to publish themselves")
        for d in (a, b):  # a daemon publishes itself before its generation starts
            d.wait_event("generation_started", 60)
        info: dict[int, dict[str, Any]] = {d["pid"]: d for d in running_daemons(env)}

        def named(out: str, daemon: Daemon) -> bool:
            i = info[daemon.pid]
            return f"run {i['run_id']}  pid {daemon.pid}  run dir {i['run_dir']}" in out

        # neither runs here: nothing is stopped, both are listed
        r = _ctl(env, dirs["elsewhere"], "stop")
        assert r.returncode == 2, r.stderr
        assert "no daemon runs in this environment" in r.stderr and "Traceback" not in r.stderr
        assert named(r.stderr, a) and named(r.stderr, b), r.stderr
        assert f"cwd {dirs['a']}" in r.stderr and f"cwd {dirs['b']}" in r.stderr
        # a runs in this directory and b writes to this --log-dir: both are this environment's
        r = _ctl(env, dirs["a"], "restart", "--log-dir", str(b.log_dir))
        assert r.returncode == 2 and "2 daemons run in this environment" in r.stderr, r.stderr
        assert named(r.stderr, a) and named(r.stderr, b)
        assert a.proc.poll() is None and b.proc.poll() is None
        assert len(a.events("generation_started")) == len(b.events("generation_started")) == 1

        # exactly one: acted on, and named
        r = _ctl(env, dirs["b"], "restart")
        assert r.returncode == 0 and named(r.stdout, b) and "restarting" in r.stdout, r.stdout + r.stderr
        b.wait_event("generation_started", where=lambda e: e["generation"] == 1)
        r = _ctl(env, dirs["elsewhere"], "status", "--log-dir", str(a.log_dir))
        assert r.returncode == 0 and f"run {info[a.pid]['run_id']}  pid {a.pid}" in r.stdout, r.stderr
        assert f"run dir: {info[a.pid]['run_dir']}" in r.stdout
        r = _ctl(env, dirs["a"], "stop")
        assert r.returncode == 0 and r.stdout.startswith("ft-supervisor stop: stopping"), r.stderr
        assert named(r.stdout, a)
        assert a.wait(30) == 128 + signal.SIGTERM
        assert b.proc.poll() is None and len(a.events("generation_started")) == 1

        # the user's only daemon now, but another job's: still not stopped unasked
        r = _ctl(env, dirs["elsewhere"], "stop")
        assert r.returncode == 2 and named(r.stderr, b) and b.proc.poll() is None, r.stderr
        # named: wherever it runs
        r = _ctl(env, dirs["elsewhere"], "stop", "--run-id", info[b.pid]["run_id"])
        assert r.returncode == 0 and named(r.stdout, b), r.stdout + r.stderr
        assert b.wait(30) == 128 + signal.SIGTERM
    finally:
        a.close()
        b.close()
