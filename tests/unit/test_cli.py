"""The command line: bad input exits 2 with a clear message."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import build_parser, main
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    s = tmp_path / "s.py"
    s.write_text("pass\n")
    return s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--nnodes", "2"], "--rdzv-backend static on several nodes needs --master-addr and --master-port"),
        (["--nnodes", "2", "--rdzv-backend", "c10d"], "needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-backend", "zk", "--rdzv-endpoint", "h:1"], "expected one of c10d, static"),
        (["--nnodes", "1:2", "--master-addr", "h", "--master-port", "5"], "the static backend needs a fixed"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank 2: must be in [0, 2)"),
        (["--nnodes", "2", "--standalone"], "--standalone is a single-node run"),
        (["--nnodes", "2", "--rdzv-conf", "join_timout=5"], "unknown key 'join_timout'"),
        (["--rdzv-conf", "foo=1"], "--rdzv-conf: unknown key 'foo'"),  # a single node checks it too
        (["--nnodes", "2", "--rdzv-conf", "join_timeout=soon"], "join_timeout 'soon': expected a duration"),
        (["--nnodes", "2", "--rdzv-conf", "is_host"], "'is_host' is not key=value"),
        (["--nnodes", "2", "--rdzv-conf", "is_host=perhaps"], "is_host=perhaps: expected true or false"),
        (["--nnodes", "x"], "--nnodes 'x': expected N or MIN:MAX"),
        (["--node-rank", "1"], "--node-rank 1: with one node the only node rank is 0"),
        (["--nproc-per-node", "zero"], "--nproc-per-node 'zero': expected an integer"),
        (["--no-python", "-m"], "--no-python and -m/--module contradict each other"),
        (["--standalone", "--rdzv-endpoint", "h:1"], "contradicts --rdzv-endpoint h:1"),
        (["--standalone", "--master-port", "5"], "contradicts --master-port"),
        (["--rdzv-id", "a", "--run-id", "b"], "--rdzv-id 'a' and --run-id 'b' contradict"),
        (["--max-restarts", "-1"], "--max-restarts -1: must be >= 0"),
        (["--master-port", "70000"], "--master-port 70000: expected 1-65535"),
        (["--local-ranks-filter", "7"], "local rank(s) [7] do not exist"),
        (["--redirects", "9"], "--redirects '9': expected 0-3"),
        (["--signals-to-handle", "SIGFOO"], "unknown signal 'SIGFOO'"),
        (["--kill-timeout", "0"], "--kill-timeout 0.0: must be > 0"),
        (["--logs-specs", "nosuch"], "--logs-specs 'nosuch': no torchrun.logs_specs entry point"),
        (["--start-method", "thread"], "invalid choice: 'thread'"),
        (["--autoresume"], "--autoresume needs the file to create: --finished-flag-file PATH"),
        (["--save-timeout", "-1"], "--save-timeout/--save_timeout: '-1': a duration cannot be negative"),
        (["--mtbf", "0"], "--mtbf 0.0: expected a positive number of seconds"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message(
    args: list[str],
    message: str,
    *,
    script: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # the command line's own entry point, in this process (thirty interpreters cost more than
    # the checks); a check that let the options through must not start a daemon here
    def started(*_: object) -> int:
        raise AssertionError(f"{args} passed validation and would have started a daemon")

    if args[:1] == ["--nproc-per-node"]:  # a name: the ranks' torch is asked what it counts
        monkeypatch.setenv("PYTHON_EXEC", str(request.getfixturevalue("asked_torch")))
    monkeypatch.setattr("supervisor.runtime.lifecycle.start.run_daemon", started)
    try:
        code = main(["run", *args, str(script)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    # one line that names the problem, not the usage block before it
    assert err.count("\n") == 1 and err.startswith("ft-supervisor"), err
    assert ": error: " in err and "usage:" not in err


def test_a_bad_option_exits_2_from_the_real_command_line(script: Path, tmp_path: Path) -> None:
    r = _cli("run", "--max-restarts", "-1", str(script), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    said = "ft-supervisor run: error: --max-restarts -1: must be >= 0 (see ft-supervisor run --help)\n"
    assert r.stderr == said


def test_missing_script_is_named(tmp_path: Path) -> None:
    r = _cli("run", "nope.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "training script 'nope.py' does not exist" in r.stderr


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    r = _cli(cwd=tmp_path)
    assert r.returncode == 2
    assert "COMMAND" in r.stderr


def test_unwritable_log_dir_is_reported_plainly(script: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = _cli("run", "--log-dir", str(blocker / "sub"), "--preload", "none", str(script), cwd=tmp_path)
    assert r.returncode == 2
    assert "cannot create the run directory" in r.stderr
    assert "Traceback" not in r.stderr


def test_supervisord_in_the_same_environment_is_named(script: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "supervisor-4.2.5.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: supervisor\nVersion: 4.2.5\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    r = _cli("run", str(script), cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert "supervisord 4.2.5" in r.stderr
    assert "cannot share one environment" in r.stderr


def _parse(*argv: str) -> object:
    ns = build_parser().parse_args(["run", *argv])
    return build_run_config(ns, {})


def test_the_default_preload_is_torchs_found_without_importing_it(script: Path) -> None:
    # --preload auto: torch when installed, by a stat; importing it in the daemon would cost
    # 200 MB (that the daemon, its fork server and standbys working, never maps libtorch:
    # tests/integration/test_torch_ranks.py)
    pytest.importorskip("torch")
    code = (
        "import sys; from supervisor.cli import build_parser; "
        "from supervisor.config.build import build_run_config; "
        f"c = build_run_config(build_parser().parse_args(['run', {str(script)!r}]), {{}}); "
        "print(','.join(c.program.preload), 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["torch,torch.distributed,torch.nn.parallel", "False"]


def test_a_prior_mean_time_between_failures(script: Path) -> None:
    assert _parse(str(script)).mtbf is None  # type: ignore[attr-defined]
    assert _parse("--mtbf", "3600", str(script)).mtbf == 3600.0  # type: ignore[attr-defined]
    assert _parse("--mtbf", "2d", str(script)).mtbf == 172800.0  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match="2"):
        _parse("--mtbf", "nan", str(script))


def test_torchrun_spellings_and_defaults(script: Path) -> None:
    cfg = _parse("--nproc_per_node", "2", "--max_restarts", "3", str(script), "--lr", "1")
    assert cfg.topology.nproc_per_node == 2  # type: ignore[attr-defined]
    assert cfg.max_restarts == 3  # type: ignore[attr-defined]
    assert cfg.program.args == ("--lr", "1")  # type: ignore[attr-defined]
    assert cfg.master_port is None  # type: ignore[attr-defined]
    assert len(cfg.run_id) == 36  # type: ignore[attr-defined]  # a uuid, as torchrun's


def test_pet_environment_defaults(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_STANDALONE", "1")
    cfg = _parse(str(script))
    assert cfg.topology.nproc_per_node == 3  # type: ignore[attr-defined]
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")
    assert _parse("--nproc-per-node", "1", str(script)).topology.nproc_per_node == 1  # type: ignore[attr-defined]


def test_static_master_port_keeps_the_run_id(script: Path) -> None:
    assert _parse("--master-port", "29555", str(script)).run_id == "none"  # type: ignore[attr-defined]
    assert _parse("--rdzv-id", "job7", str(script)).run_id == "job7"  # type: ignore[attr-defined]


def test_config_errors_are_value_errors(script: Path) -> None:
    with pytest.raises(ConfigError):
        _parse("--nnodes", "3", str(script))


def test_multi_node_options_as_torchrun_takes_them(script: Path) -> None:
    cfg = _parse(
        "--nnodes", "2:4", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "head:29400",
        "--rdzv_id", "job9", "--rdzv_conf", "join_timeout=60,last_call_timeout=5,is_host=false",
        "--master-port", "29500", str(script),
    )  # fmt: skip
    rdzv = cfg.rdzv  # type: ignore[attr-defined]
    assert (rdzv.backend, rdzv.endpoint, rdzv.run_id, rdzv.min_nodes, rdzv.max_nodes) == (
        "c10d",
        "head:29400",
        "job9",
        2,
        4,
    )
    assert rdzv.seconds("join_timeout") == 60 and rdzv.seconds("keep_alive_interval") == 5
    assert rdzv.keep_alive_bound == 15.0  # torch's default: 3 keep-alives of 5 s
    assert cfg.master_port is None  # type: ignore[attr-defined]  # node 0 picks one every generation
    assert cfg.run_id == "job9"  # type: ignore[attr-defined]
    # until the rendezvous says, a node expects the smallest world
    assert (cfg.topology.nnodes, cfg.topology.node_rank) == (2, 0)  # type: ignore[attr-defined]


def test_static_multi_node_takes_its_endpoint_from_the_master(script: Path) -> None:
    cfg = _parse(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "n0", "--master-port", "29500", str(script)
    )
    rdzv = cfg.rdzv  # type: ignore[attr-defined]
    assert (rdzv.backend, rdzv.endpoint, rdzv.node_rank, rdzv.run_id) == ("static", "n0:29500", 1, "none")
    assert cfg.topology.node_rank == 1  # type: ignore[attr-defined]


def test_one_node_needs_no_rendezvous(script: Path) -> None:
    assert _parse("--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", str(script)).rdzv is None  # type: ignore[attr-defined]


def test_the_scripts_options_stay_the_scripts_even_when_they_look_like_ours() -> None:
    ns = build_parser().parse_args(
        ["run", "--nproc-per-node", "1", "train.py", "--kill", "3", "--shutdown", "--log-level", "x"]
    )
    assert ns.training_script == "train.py"
    assert ns.training_script_args == ["--kill", "3", "--shutdown", "--log-level", "x"]
    assert ns.kill_timeout == 10.0 and ns.log_level == "info"


def _help(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", *argv])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_help_shows_the_essentials_and_help_all_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    short = _help("--help", capsys=capsys)
    full = _help("--help-all", capsys=capsys)
    assert short.startswith("usage: ft-supervisor run [options] SCRIPT [ARGS...]\n")
    assert len(short.splitlines()) < 100, short
    for essential in ("--nproc-per-node", "--max-restarts", "--rdzv-endpoint", "--ft-rank-heartbeat-timeout",
                      "--reschedule-exit-code", "--checkpoint-url", "--no-standby"):  # fmt: skip
        assert essential in short
    assert "--kill-timeout" not in short and "more options" in short and "--help-all" in short
    # every option a user may set, the crash-loop guard's included, in its first spelling once
    parser = build_parser()
    run = next(a for a in parser._actions if a.dest == "command").choices["run"]  # type: ignore[union-attr]
    for action in run._actions:
        shown = getattr(action, "full_help", action.help)
        if action.option_strings and shown != argparse.SUPPRESS:
            first = next(s for s in action.option_strings if s.startswith("--"))
            assert f"  {first}" in full or f", {first}" in full, first
    assert "--ft-max-no-progress-cycles" in full and "--ft-min-progress-iterations" in full
    assert "--nproc_per_node" not in full  # the aliases are accepted, not listed


def test_a_daemons_start_imports_no_offline_replay() -> None:
    # every `ft-supervisor run` builds the whole command line, classify's included: the
    # replay of run directories (supervisor.postmortem, ~80 ms) is for `classify` alone
    probe = (
        "import sys\n"
        "from supervisor.cli import build_parser\n"
        "build_parser()\n"
        "import supervisor.runtime.lifecycle.start\n"
        "print(sorted(m for m in sys.modules if m.startswith('supervisor.postmortem')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
