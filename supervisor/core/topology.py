"""Rank layout and the environment each rank gets, exactly as torchrun gives it.

torchrun 2.13 (``LocalElasticAgent._start_workers`` and ``run.config_from_args``)
sets RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE,
WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (``master_env``),
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE,
TORCHELASTIC_SIGNALS_TO_HANDLE, TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set) and
OMP_NUM_THREADS=1 when unset and more than one rank runs per node.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

# Our own variables. Every one a rank sees starts with this prefix.
ENV_PREFIX = "FT_SUPERVISOR_"
ENV_RUN_DIR = ENV_PREFIX + "RUN_DIR"
# ``<run token>/<generation>``: random per run, inherited by every descendant of
# a rank, so the sweeps find a generation's (or a run's) processes even after
# they left the rank's process group, and never a stranger's.
ENV_TOKEN = ENV_PREFIX + "TOKEN"
# a rank's own secret: the daemon accepts its messages only with it (see ``rank_key``)
ENV_KEY = ENV_PREFIX + "KEY"
# the open-files limit the daemon was started with, which ranks get back (bootstrap.py)
ENV_NOFILE = ENV_PREFIX + "NOFILE"
# where the in-rank client sends, and the timeouts in force (JSON): how the
# client knows which sections are monitored and what state_dict() returns
ENV_RANKS_ENDPOINT = ENV_PREFIX + "RANKS_ENDPOINT"
ENV_TIMEOUTS = ENV_PREFIX + "TIMEOUTS"
# torchrun's --numa-binding mode: the rank's bootstrap binds it with torch's own code
ENV_NUMA_BINDING = ENV_PREFIX + "NUMA_BINDING"
# a standby's: the daemon's snapshot directory, whose slot files of its rank it maps while
# it waits for its go (supervisor/process/bootstrap_premap.py)
ENV_PREMAP = ENV_PREFIX + "PREMAP"


@dataclass(frozen=True, slots=True)
class RankSlot:
    local_rank: int
    rank: int


@dataclass(frozen=True, slots=True)
class Topology:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    role: str = "default"

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError("nproc_per_node must be >= 1")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError("node_rank must be in [0, nnodes)")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def slots(self) -> list[RankSlot]:
        base = self.node_rank * self.nproc_per_node
        return [RankSlot(local, base + local) for local in range(self.nproc_per_node)]


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What every rank of every generation of this run shares."""

    run_id: str
    max_restarts: int
    signals_to_handle: str
    run_dir: str
    run_token: str
    virtual_local_rank: bool = False
    numa_binding: str | None = None  # torchrun's --numa-binding, where it applies
    key_secret: bytes = b""  # the daemon's own: every rank's key is derived from it


def rank_env(
    base: Mapping[str, str],
    topology: Topology,
    slot: RankSlot,
    ident: RunIdentity,
    *,
    generation: int,
    error_file: str,
) -> dict[str, str]:
    """A rank's environment in one generation, but for ``master_env``.

    The master address is fixed only when the generation starts (a fresh port
    each time), so a standby rank gets it with its go instead of at spawn.
    """
    env = dict(base)
    if "OMP_NUM_THREADS" not in env and topology.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    env.update(
        {
            "RANK": str(slot.rank),
            "GROUP_RANK": str(topology.node_rank),
            "ROLE_RANK": str(slot.rank),
            "ROLE_NAME": topology.role,
            "LOCAL_WORLD_SIZE": str(topology.nproc_per_node),
            "WORLD_SIZE": str(topology.world_size),
            "GROUP_WORLD_SIZE": str(topology.nnodes),
            "ROLE_WORLD_SIZE": str(topology.world_size),
            "TORCHELASTIC_RESTART_COUNT": str(generation),
            "TORCHELASTIC_MAX_RESTARTS": str(ident.max_restarts),
            "TORCHELASTIC_RUN_ID": ident.run_id,
            # Rank 0 of every generation hosts a fresh store on a fresh port: an
            # agent store outliving a generation is how torchrun's restarts read
            # a dead generation's gloo addresses.
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ident.signals_to_handle,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ENV_RUN_DIR: ident.run_dir,
            ENV_TOKEN: generation_token(ident.run_token, generation),
            ENV_KEY: rank_key(ident.key_secret, generation, slot.rank),
        }
    )
    env.update(_local_rank_env(base, slot.local_rank, ident.virtual_local_rank))
    if ident.numa_binding:
        env[ENV_NUMA_BINDING] = ident.numa_binding
    return env


def _local_rank_env(base: Mapping[str, str], local_rank: int, virtual: bool) -> dict[str, str]:
    if not virtual:
        return {"LOCAL_RANK": str(local_rank)}
    # --virtual-local-rank: every rank sees its own device as device 0
    visible = base.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible is not None else None
    if devices is not None and local_rank >= len(devices):
        raise ValueError(f"local rank {local_rank} has no device in CUDA_VISIBLE_DEVICES={visible}")
    device = devices[local_rank].strip() if devices is not None else str(local_rank)
    return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": device}


def rank_key(secret: bytes, generation: int, rank: int) -> str:
    """One rank's key in one generation. Derived (HMAC) from the daemon's secret, so the
    daemon checks any message without keeping a table, and a key tells nothing of another
    rank's or another generation's."""
    return hmac.new(secret, f"{generation}/{rank}".encode(), hashlib.sha256).hexdigest()[:32]


def generation_token(run_token: str, generation: int) -> str:
    return f"{run_token}/{generation}"


def token_entry(run_token: str, generation: int | None = None) -> bytes:
    """The environ entry of one generation, or (None) the prefix of a whole run.

    The run prefix ends in "/" so that generation 1 never matches generation 10.
    """
    value = f"{run_token}/" if generation is None else generation_token(run_token, generation)
    return f"{ENV_TOKEN}={value}".encode()


def master_env(addr: str, port: int) -> dict[str, str]:
    return {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
