"""torchrun's options come from torch: the checked-in table is the installed torch's
parser, every option of that parser is known to us (honoured or ignored), and each
one, with a valid value, builds a RunConfig; the ignored ones, only those, are
reported with why. Fails the day a torch upgrade adds an option we do not know."""

from __future__ import annotations

import argparse
import logging
import os
import traceback
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config import torchrun
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.options import add_run_options
from supervisor.config.run import count_gpus

# A valid value other than torch's default, for every option of torch's torchrun
# (None: a flag), on one node. A new option of torch has none: the walk fails.
SAMPLES: dict[str, str | None] = {
    "nnodes": "1",
    "nproc_per_node": "2",
    "rdzv_backend": "etcd",
    "rdzv_endpoint": "127.0.0.1:29400",
    "rdzv_id": "job",
    "rdzv_conf": "join_timeout=60",
    "standalone": None,
    "max_restarts": "2",
    "monitor_interval": "0.5",
    "start_method": "fork",
    "event_log_handler": "console",
    "role": "trainer",
    "module": None,
    "no_python": None,
    "run_path": None,
    "log_dir": "logs",
    "redirects": "3",
    "tee": "0:1",
    "local_ranks_filter": "0",
    "duplicate_stdout_filters": "loss,,x,step",
    "duplicate_stderr_filters": "Error",
    "node_rank": "1",
    "master_addr": "127.0.0.2",
    "master_port": "29501",
    "local_addr": "127.0.0.1",
    "logs_specs": "default",
    "numa_binding": "socket",
    "signals_to_handle": "SIGTERM,SIGUSR1",
    "shutdown_timeout": "5",
    "virtual_local_rank": None,
}


@pytest.fixture(scope="module")
def torch_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser  # noqa: PLC0415 - torch's own parser is the truth

    with pytest.MonkeyPatch.context() as mp:  # its defaults, not the PET_* variables'
        for name in [k for k in os.environ if k.startswith("PET_")]:
            mp.delenv(name)
        return get_args_parser()


def _torch_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def test_every_option_of_torch_is_known(torch_parser: argparse.ArgumentParser) -> None:
    dests = {a.dest for a in _torch_options(torch_parser)}
    assert dests - set(torchrun.KNOWN) == set(), "torch has torchrun options we do not classify"
    assert set(torchrun.KNOWN) - dests == set(), "options we classify that torch no longer has"
    assert set(SAMPLES) == dests
    ignored = {d for d, how in torchrun.KNOWN.items() if how == "ignored"}
    assert ignored <= set(torchrun.WHY)


def test_the_table_is_the_installed_torchs_parser(torch_parser: argparse.ArgumentParser) -> None:
    table = {o.dest: o for o in torchrun.TABLE}
    for a in _torch_options(torch_parser):
        o = table.pop(a.dest)
        assert o.flags == tuple(a.option_strings)
        assert o.flag == (a.nargs == 0)
        assert o.default == a.default, a.dest
        assert o.choices == (None if a.choices is None else tuple(a.choices))
        assert o.type == (getattr(a.type, "__name__", "str") if a.type is not None else "str")
        assert o.env == (type(a).__name__ in ("env", "check_env"))
    assert not table, f"the table has options torch does not: {sorted(table)}"


@pytest.mark.parametrize("dest", sorted(SAMPLES))
def test_each_option_builds_a_run(dest: str, tmp_path: Path, torch_parser: argparse.ArgumentParser) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    action = next(a for a in _torch_options(torch_parser) if a.dest == dest)
    value = SAMPLES[dest]
    one_node = torchrun.numa_nodes() < 2 or count_gpus(os.environ) == 0
    for spelling in action.option_strings:
        argv = [spelling] if value is None else [spelling, value]
        if dest == "node_rank":  # another node than 0: a static job of two nodes
            argv += ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29500"]
        ns = build_parser().parse_args(["run", *argv, str(script)])
        assert getattr(ns, dest) not in (action.default, None, False, "none")
        cfg = build_run_config(ns, {})
        reported = [given for given, _ in cfg.torchrun_ignored]
        name = next(f for f in action.option_strings if f.startswith("--"))  # the one reported
        if torchrun.KNOWN[dest] == "ignored" or (dest == "numa_binding" and one_node):
            assert reported == [name if value is None else f"{name} {value}"]
        else:
            assert reported == [], reported


def test_honoured_values_reach_the_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    ns = build_parser().parse_args(
        ["run", "--duplicate_stdout_filters", "loss,,x,step", "--run-path", "--no-python",
         "--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:2379",
         "--rdzv-conf", "cacert=/ca.pem,timeout=90,etcd_prefix=/p", str(script)]
    )  # fmt: skip
    cfg = build_run_config(ns, {})
    assert cfg.duplicate_stdout == ("loss,x", "step")
    assert cfg.program.kind == "script"  # --run-path over --no-python, as torchrun
    assert cfg.rdzv is not None and cfg.rdzv.backend == "etcd-v2"
    assert dict(cfg.rdzv.conf) == {"ca_cert": "/ca.pem", "join_timeout": "90"}
    assert [given for given, _ in cfg.torchrun_ignored] == ["--rdzv-backend etcd"]


def test_an_option_of_a_newer_torch_is_accepted_and_reported(tmp_path: Path) -> None:
    knob = torchrun.TorchrunOption("new_knob", ("--new-knob",), False, None, None, "int", True)
    newer = torchrun.Options("9.0.0", (*torchrun.TABLE, knob), "test")
    parser = argparse.ArgumentParser()
    torchrun.add_options(parser, newer.options, {})
    ns = parser.parse_args(["--new-knob", "3"])
    assert ns.new_knob == 3
    found = torchrun.ignored(vars(ns), newer, numa=1, gpus=0, several_nodes=False)
    assert found == (("--new-knob 3", "an option of torch 9.0.0 unknown to ft-supervisor: not applied"),)


def test_an_older_torch_without_an_option_of_ours_still_builds_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch 2.11's torchrun has no --shutdown-timeout (found running the ranks' own torch on
    # a GPU machine): the run took an AttributeError; now the option is ours whatever torch
    older = torchrun.Options(
        "2.11.0", tuple(o for o in torchrun.TABLE if o.dest != "shutdown_timeout"), "test"
    )
    monkeypatch.setattr(torchrun, "installed", lambda *_: older)
    script = tmp_path / "train.py"
    script.write_text("")
    parser = build_parser()
    assert build_run_config(parser.parse_args(["run", str(script)]), {}).shutdown_timeout == 30.0
    ns = parser.parse_args(["run", "--shutdown-timeout", "5", str(script)])
    assert build_run_config(ns, {}).shutdown_timeout == 5.0


def test_another_torch_is_asked_once_then_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, asked_torch: Path
) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), "PET_NNODES": "2"}
    # our torch (its answer: tests/unit/conftest.py), as if another version
    first = torchrun.asked(str(asked_torch), env, "2.13.0+other")
    assert first.options == torchrun.TABLE  # torch's own defaults, not PET_NNODES's
    assert "parser" in first.source
    cached = torchrun.asked("/nonexistent/python", env, first.torch or "")
    assert cached.options == torchrun.TABLE and "cached" in cached.source
    with caplog.at_level(logging.WARNING):
        fallback = torchrun.asked("/nonexistent/python", env, "9.9.9")
    assert fallback.options == torchrun.TABLE and "table" in fallback.source
    assert "asking torch 9.9.9 for its parser failed" in caplog.text


def test_pet_variables_set_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_VIRTUAL_LOCAL_RANK", "1")
    monkeypatch.setenv("PET_LOGS_SPECS", "x")  # torch reads no variable for this one
    parser = argparse.ArgumentParser()
    add_run_options(parser)
    ns = parser.parse_args([])
    assert (ns.nproc_per_node, ns.virtual_local_rank, ns.logs_specs) == ("3", True, None)


def test_device_counts_are_torchs(asked_torch: Path) -> None:
    from supervisor.config.run import parse_nproc  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"^--nproc-per-node xpu: Xpu is not available\.$"):
        parse_nproc("xpu", {}, str(asked_torch))


def test_numa_binding_is_torchs_own_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where --numa-binding applies, a rank's bootstrap calls torch's own binding: torch's
    function, by its private name, must be there and take our arguments. Here (no CUDA,
    no numactl) torch itself refuses, as torchrun's ranks would; it binds nothing."""
    from supervisor.process import bootstrap  # noqa: PLC0415

    monkeypatch.setenv("FT_SUPERVISOR_NUMA_BINDING", "node")
    monkeypatch.setenv("LOCAL_RANK", "0")
    before = os.sched_getaffinity(0)
    try:
        bootstrap._bind_numa()
    except (ImportError, AttributeError, TypeError, ValueError):
        raise  # our call no longer fits torch's code
    except Exception as exc:  # torch's own refusal on a node without CUDA or numactl
        files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        assert any(f.endswith(os.path.join("torch", "numa", "binding.py")) for f in files), files
    finally:
        os.sched_setaffinity(0, before)
    assert "FT_SUPERVISOR_NUMA_BINDING" not in os.environ


def test_auto_asks_torch_where_a_node_has_an_accelerator_other_than_cuda(
    tmp_path: Path, asked_torch: Path
) -> None:
    # torchrun's auto counts any accelerator torch knows (XPU, HPU...), the CPUs only where
    # there is none: a node with another accelerator's device node asks the ranks' torch
    from supervisor.config.run import parse_nproc  # noqa: PLC0415

    asked = tmp_path / "asked"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ntouch {asked}\nexec {asked_torch} "$@"\n')
    python.chmod(0o755)
    quiet, xpu = tmp_path / "dev-cpu", tmp_path / "dev-xpu"
    quiet.mkdir()
    (xpu / "dri").mkdir(parents=True)
    (xpu / "dri" / "renderD128").touch()
    cpus = len(os.sched_getaffinity(0))
    assert parse_nproc("auto", {}, str(python), dev=quiet) == cpus
    assert not asked.exists()  # a CPU-only node: no torch to start
    assert parse_nproc("auto", {}, str(python), dev=xpu) == cpus  # torch: no XPU here, so the CPUs
    assert asked.exists()
