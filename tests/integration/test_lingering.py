"""A rank still running --exit-grace after every other rank exited 0 (issue 22): its
stacks are kept, it is ended, and the run succeeds only if it had finished its work.
The verdicts (done or not, stuck at exit or in its loop, left to finish) are in
tests/fast/test_lingering.py; here what needs real processes: the /proc read of a
rank's activity, and the other node's success learnt through the rendezvous store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support import RANKS, Daemon

LINGERS = str(RANKS / "lingers.py")
FAST = ("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "0", "--exit-grace", "1")
Start = Callable[..., Daemon]

pytestmark = pytest.mark.slow


def test_a_rank_still_writing_after_its_peers_left_is_left_to_finish(start: Start) -> None:
    d = start(*FAST, LINGERS, "--how", "save", "--save-time", "2.5")
    assert d.wait(60) == 0, d.story()
    assert not d.events("rank_exit_stuck")
    (slow,) = d.events("rank_exit_slow")
    assert slow["rank"] == 1
    exited = next(e for e in d.events("rank_exited") if e["rank"] == 1)
    assert (exited["exit_code"], exited["signal"]) == (0, None)


@pytest.mark.torch  # the daemons' rendezvous is torch's
def test_on_two_nodes_a_rank_stuck_at_exit_after_the_other_node_succeeded_is_ended(
    start: Start, endpoint: str
) -> None:
    # one rank a node: the stuck rank's only peer is on the other node, which succeeds and
    # waits to agree; the stuck node must learn that through the rendezvous, or it waits on
    # its rank without end, and the other node with it
    conf = "is_host=0,last_call_timeout=1,join_timeout=60"
    node = ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--local-addr", "127.0.0.1", "--rdzv-conf", conf, "--preload", "none", "--max-restarts", "0",
            "--exit-grace", "1")  # fmt: skip
    daemons = [start(*node, LINGERS, "--how", "atexit") for _ in range(2)]
    assert [d.wait(60) for d in daemons] == [0, 0], daemons[0].story() + daemons[1].story()
    stuck = [e for d in daemons for e in d.events("rank_exit_stuck")]
    # its verdict (waited, stacks) on the other node's success is tests/fast/test_multinode_fast.py's
    assert [(e["rank"], e["success"], e["after"]) for e in stuck] == [(1, True, "peers_succeeded")], stuck
    decisions = [e for d in daemons for e in d.events("job_decision")]
    assert {e["action"] for e in decisions} == {"continue"}, decisions
