import signal
import sys
from pathlib import Path

import pytest

from supervisor.config.run import (
    ConfigError,
    RunConfig,
    count_gpus,
    parse_nnodes,
    parse_nproc,
    parse_ranks_filter,
    parse_signals,
    parse_std,
)
from supervisor.config.torchrun import torch_version
from supervisor.core.program import Program
from supervisor.core.topology import Topology
from supervisor.log import STDERR, STDOUT


def test_std_specs() -> None:
    assert parse_std("--tee", "3", 2) == {0: 3, 1: 3}
    assert parse_std("--redirects", "0:1,1:2", 3) == {0: 1, 1: 2, 2: 0}
    with pytest.raises(ConfigError, match="--redirects '5'"):
        parse_std("--redirects", "5", 2)
    with pytest.raises(ConfigError, match="local rank 4 does not exist"):
        parse_std("--tee", "4:1", 2)


def test_nproc_forms() -> None:
    assert parse_nproc("4", {}) == 4
    assert parse_nproc("cpu", {}) >= 1
    assert parse_nproc("auto", {"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert parse_nproc("gpu", {"CUDA_VISIBLE_DEVICES": "3"}) == 1
    with pytest.raises(ConfigError, match="at least 1"):
        parse_nproc("0", {})
    with pytest.raises(ConfigError, match="integer, cpu, gpu, xpu or auto"):
        parse_nproc("many", {})
    with pytest.raises(ConfigError, match="no CUDA device"):
        parse_nproc("gpu", {"CUDA_VISIBLE_DEVICES": ""})


def test_gpu_count_honours_visible_devices() -> None:
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0, 1"}) == 2


def test_nnodes_forms() -> None:
    assert parse_nnodes("1") == (1, 1)
    assert parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "3:2", "x", "1:"):
        with pytest.raises(ConfigError):
            parse_nnodes(bad)


def test_signals() -> None:
    assert parse_signals("SIGTERM,int") == (signal.SIGTERM, signal.SIGINT)
    with pytest.raises(ConfigError, match="unknown signal 'SIGNOPE'"):
        parse_signals("SIGNOPE")
    with pytest.raises(ConfigError, match="cannot be handled"):
        parse_signals("SIGKILL")


def test_ranks_filter() -> None:
    assert parse_ranks_filter("", 2) is None
    assert parse_ranks_filter("0,1", 2) == frozenset({0, 1})
    with pytest.raises(ConfigError, match=r"\[3\] do not exist"):
        parse_ranks_filter("0,3", 2)
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_ranks_filter("a", 2)


def _config(**kw: object) -> RunConfig:
    return RunConfig(program=Program("script", "x.py"), topology=Topology(2), **kw)  # type: ignore[arg-type]


def test_console_streams_follow_torchrun() -> None:
    assert _config().console_streams(0) == (STDOUT, STDERR)
    redirected = _config(redirects={0: 3, 1: 1})
    assert redirected.console_streams(0) == ()
    assert redirected.console_streams(1) == (STDERR,)
    assert _config(redirects={0: 3}, tee={0: 2}).console_streams(0) == (STDERR,)
    assert _config(local_ranks_filter=frozenset({1})).console_streams(0) == ()


def test_the_ranks_torch_version_is_read_from_metadata_without_importing_it(tmp_path: Path) -> None:
    import importlib.metadata  # noqa: PLC0415

    try:
        installed: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    assert torch_version(sys.executable) == installed
    # another interpreter is asked (here the same one under another name): same answer
    other = tmp_path / "python"
    other.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    other.chmod(0o755)
    assert torch_version(str(other)) == installed
    assert torch_version(str(tmp_path / "no-python")) is None
