import dataclasses

import pytest

from supervisor.core.topology import (
    ENV_TOKEN,
    RunIdentity,
    Topology,
    master_env,
    rank_env,
    token_entry,
)

IDENT = RunIdentity("run-1", 3, "SIGTERM,SIGINT", "/runs/x", "tok")


def _env(base: dict[str, str], nproc: int = 2, local: int = 1, **ident: object) -> dict[str, str]:
    topo = Topology(nproc_per_node=nproc)
    slot = topo.slots()[local]
    who = dataclasses.replace(IDENT, **ident)  # type: ignore[arg-type]
    return rank_env(base, topo, slot, who, generation=2, error_file="/e.json")


def test_torchrun_variables() -> None:
    env = _env({"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    expected = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "ROLE_RANK": "1",
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "run-1",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/e.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert {k: env[k] for k in expected} == expected
    assert "MASTER_ADDR" not in env  # comes with the go
    assert master_env("h", 5) == {"MASTER_ADDR": "h", "MASTER_PORT": "5"}


def test_user_settings_win_where_torchrun_lets_them() -> None:
    env = _env({"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_single_rank_keeps_omp_unset() -> None:
    assert "OMP_NUM_THREADS" not in _env({}, nproc=1, local=0)


def test_generation_token_finds_only_its_generation() -> None:
    env = _env({})
    assert f"{ENV_TOKEN}={env[ENV_TOKEN]}".encode() == token_entry("tok", 2)
    assert token_entry("tok") == f"{ENV_TOKEN}=tok/".encode()
    assert not token_entry("tok", 10).startswith(token_entry("tok", 1) + b"/")


def test_virtual_local_rank_maps_devices() -> None:
    env = _env({"CUDA_VISIBLE_DEVICES": "4,5"}, virtual_local_rank=True)
    assert env["LOCAL_RANK"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert _env({}, virtual_local_rank=True)["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(ValueError, match="no device"):
        _env({"CUDA_VISIBLE_DEVICES": "4"}, virtual_local_rank=True)


def test_topology_validates() -> None:
    with pytest.raises(ValueError):
        Topology(nproc_per_node=0)
    with pytest.raises(ValueError):
        Topology(nproc_per_node=1, nnodes=2, node_rank=2)
    assert [s.rank for s in Topology(nproc_per_node=2, nnodes=2, node_rank=1).slots()] == [2, 3]
