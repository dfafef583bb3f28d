"""The bootstrap runs a program exactly as ``python -u`` would, and dies with its parent."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.core.program import Program
from supervisor.process.spawn import rank_argv
from tests.support import alive, wait_until


def _argv(
    fd: int, kind: str, target: str, *args: str, preload: str = "", fast_exit: bool = True
) -> list[str]:
    modules = tuple(filter(None, preload.split(",")))
    program = Program(kind, target, args, sys.executable, modules, fast_exit=fast_exit)
    return rank_argv(program, fd, os.getpid())


def _boot(
    tmp: Path,
    kind: str,
    target: str,
    *args: str,
    go: dict[str, str] | None = None,
    preload: str = "",
    fast_exit: bool = True,
) -> subprocess.CompletedProcess[str]:
    ours, theirs = socket.socketpair()
    with ours:
        p = subprocess.Popen(
            _argv(theirs.fileno(), kind, target, *args, preload=preload, fast_exit=fast_exit),
            pass_fds=[theirs.fileno()],
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        theirs.close()
        assert ours.recv(16) == b"ready\n"
        ours.sendall(json.dumps({"env": go or {}}).encode() + b"\n")
        out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


PROBE = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__,
                      "name": __name__, "spec": None if __spec__ is None else __spec__.name,
                      "go": os.environ.get("GO"), "wt": sys.stdout.write_through,
                      "preloaded": "json" in sys.modules}))
""")


def _native(tmp: Path, *argv: str) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-u", *argv],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, GO="native"),
    )
    return json.loads(r.stdout)


def test_script_runs_as_python_would_run_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    r = _boot(tmp_path, "script", "sub/probe.py", "a", "--b", go={"GO": "native"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == _native(tmp_path, "sub/probe.py", "a", "--b")


def test_module_runs_as_python_m_would_run_it(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(PROBE)
    r = _boot(tmp_path, "module", "pkg.probe", "x", go={"GO": "native"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == _native(tmp_path, "-m", "pkg.probe", "x")


def test_preloaded_modules_are_imported_before_the_go(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text("import sys; print('sqlite3' in sys.modules)")
    assert _boot(tmp_path, "script", "probe.py", preload="sqlite3,no_such_module").stdout == "True\n"


def test_the_preload_leaves_the_environment_alone(tmp_path: Path) -> None:
    (tmp_path / "meddler.py").write_text("import os\nos.environ['MEDDLED'] = '1'\nos.environ.pop('KEEP')")
    (tmp_path / "probe.py").write_text("import os; print(os.environ.get('MEDDLED'), os.environ['KEEP'])")
    env = dict(os.environ, KEEP="kept")
    ours, theirs = socket.socketpair()
    with ours:
        p = subprocess.Popen(
            _argv(theirs.fileno(), "script", "probe.py", preload="meddler"),
            pass_fds=[theirs.fileno()],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        theirs.close()
        ours.recv(16)
        ours.sendall(b"{}\n")
        out, _ = p.communicate(timeout=30)
    assert out == "None kept\n"


def test_traceback_starts_in_the_users_code(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def f():\n    raise ValueError('boom')\nf()\n")
    r = _boot(tmp_path, "script", "boom.py")
    native = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == native.returncode == 1
    assert r.stderr == native.stderr
    assert "bootstrap" not in r.stderr


EXIT_PROBE = """
import atexit, gc, sys
log = open("unclosed.txt", "w")  # never closed: teardown must still flush it
log.write("flushed")
atexit.register(lambda: print("atexit frozen" if gc.get_freeze_count() else "atexit plain"))
sys.exit(3)
"""


@pytest.mark.parametrize("fast", [True, False])
def test_fast_exit_keeps_atexit_and_file_flushes(tmp_path: Path, fast: bool) -> None:
    (tmp_path / "x.py").write_text(EXIT_PROBE)
    r = _boot(tmp_path, "script", "x.py", fast_exit=fast)
    assert r.returncode == 3
    assert r.stdout == ("atexit frozen\n" if fast else "atexit plain\n")
    assert (tmp_path / "unclosed.txt").read_text() == "flushed"


def test_system_exit_code_passes_through(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("import sys; sys.exit(7)")
    assert _boot(tmp_path, "script", "x.py").returncode == 7


def test_exec_mode_and_its_errors(tmp_path: Path) -> None:
    r = _boot(tmp_path, "exec", "sh", "-c", "echo $GO; exit 5", go={"GO": "went"})
    assert (r.returncode, r.stdout) == (5, "went\n")
    missing = _boot(tmp_path, "exec", "no-such-program-xyz")
    assert missing.returncode == 127
    assert "cannot execute 'no-such-program-xyz'" in missing.stderr


def test_dropped_standby_exits_quietly(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    p = subprocess.Popen(
        _argv(theirs.fileno(), "script", "never.py"),
        pass_fds=[theirs.fileno()],
        stderr=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    ours.close()
    _, err = p.communicate(timeout=30)
    assert (p.returncode, err) == (0, "")


def test_rank_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: no daemon code runs, the kernel kills the rank."""
    pidfile = tmp_path / "rank.pid"
    (tmp_path / "forever.py").write_text(
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(3600)"
    )
    parent = textwrap.dedent("""
        import os, socket, subprocess, sys, time
        from supervisor.core.program import Program
        from supervisor.process.spawn import rank_argv
        ours, theirs = socket.socketpair()
        argv = rank_argv(Program("script", "forever.py"), theirs.fileno(), os.getpid())
        subprocess.Popen(argv, pass_fds=[theirs.fileno()])
        ours.recv(16); ours.sendall(b"{}\\n")
        time.sleep(3600)
    """)
    p = subprocess.Popen([sys.executable, "-c", parent], cwd=tmp_path)
    try:
        rank = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30, "the rank"))
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        wait_until(lambda: not alive(rank), 10, "the rank to die with its parent")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
