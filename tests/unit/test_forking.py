"""When ranks are forked from the fork server, and the environment it preloads under."""

from __future__ import annotations

import pytest

from supervisor.config.run import RunConfig
from supervisor.core.program import Program
from supervisor.core.topology import ENV_TOKEN, RankSlot, Topology
from supervisor.runtime.lifecycle.forking import shared_env, why_not


def _cfg(program: Program, **kw: object) -> RunConfig:
    return RunConfig(program=program, topology=Topology(2), **kw)  # type: ignore[arg-type]


TORCH = Program("script", "train.py", preload=("torch",))


@pytest.mark.parametrize(
    ("cfg", "adopts", "why"),
    [
        (_cfg(TORCH), True, None),
        (_cfg(TORCH, fork_server=False), True, "--no-fork-server"),
        (_cfg(Program("exec", "true", preload=("torch",))), True, "--no-python"),
        (_cfg(Program("script", "train.py")), True, "--preload none"),
        (_cfg(TORCH), False, "no subreaper"),
    ],
)
def test_ranks_are_forked_only_where_every_promise_holds(
    cfg: RunConfig, adopts: bool, why: str | None
) -> None:
    said = why_not(cfg, adopts)
    assert said is None if why is None else why in (said or "")


def test_the_server_preloads_under_what_every_rank_shares_and_no_generations_token() -> None:
    def env_for(slot: RankSlot) -> dict[str, str]:
        ranks = {"RANK": str(slot.rank), "LOCAL_RANK": str(slot.local_rank)}
        return {"PATH": "/bin", "OMP_NUM_THREADS": "1", **ranks, ENV_TOKEN: "run/0"}

    env = shared_env(Topology(2, nnodes=2, node_rank=1), env_for, "run")
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", ENV_TOKEN: "run/fork-server"}
    # one rank a node: everything is shared, but the token still names no generation
    assert shared_env(Topology(1), env_for, "run")[ENV_TOKEN] == "run/fork-server"
