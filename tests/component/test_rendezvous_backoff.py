"""A rendezvous write that lost the race (``coord/pace.py``, ``torch_private._PacedHolder``),
against a real TCPStore and torch's own state holder and op executor: another node's
write lands between ours read and our compare-and-set."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from supervisor.clock import Clock

pytestmark = pytest.mark.torch
torch_private = pytest.importorskip("supervisor.coord.torch_private")
PAUSED: list[float] = []


def _holder(endpoint: str, run_id: str, settings: Any, backend: Any = None) -> Any:
    from torch.distributed import TCPStore  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: PLC0415
        C10dRendezvousBackend,
    )

    host, port = endpoint.split(":")
    store = TCPStore(host, int(port), is_master=False, use_libuv=True)
    real = C10dRendezvousBackend(store, run_id)
    return dyn._BackendRendezvousStateHolder(backend(real) if backend else real, settings, cache_duration=0)


def test_a_node_whose_write_lost_the_race_backs_off_and_writes_on_what_it_reads_then(endpoint: str) -> None:
    # torch writes again at once on the state its lost write brought back: at 1,024 nodes
    # joining, hundreds of writers of a 270 KB state, each win making the others lose
    # (scale.py). Ours waits a random time, doubling its bound with each loss in a row,
    # then reads what the others wrote meanwhile and writes on that.
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415

    from supervisor.coord import pace  # noqa: PLC0415

    settings = dyn.RendezvousSettings(
        "r6", 2, 2, dyn.RendezvousTimeout(), timedelta(seconds=5), keep_alive_max_attempt=3
    )
    other = _holder(endpoint, "r6", settings)

    def write(round_: int) -> None:  # another node's write
        other.sync()
        other.state.round = round_
        other.mark_dirty()
        assert other.sync() is True

    class Racing(Clock):  # the other node writes while ours backs off
        def pause(self, seconds: float) -> None:
            PAUSED.append(seconds)
            write(7)

    PAUSED.clear()
    window = pace.Window(pace.Pace(), 2, Racing())
    window.open()
    ours = torch_private._PacedHolder(_holder(endpoint, "r6", settings), window, 1.0)
    ours.sync()
    write(5)  # between our read and our write
    for losses in (1, 2):
        ours.state.complete = True
        ours.mark_dirty()
        assert ours.sync() is False
        assert len(PAUSED) == losses and 0 <= PAUSED[-1] <= pace.FIRST_BACKOFF * 2 ** (losses - 1)
        assert ours.state.round == 7  # what was written while it waited, not what its write brought back
        if losses == 1:
            write(6)  # and again before its next write: a second loss in a row
    ours.state.complete = True
    ours.mark_dirty()
    assert ours.sync() is True and len(PAUSED) == 2  # on a fresh read the write went through
    assert window.losses == 0
    assert pace.Pace().backoff(0, 2, 0.99) == 0.0
    assert pace.Pace().backoff(40, 2, 0.99) < pace.Pace().interval(2)  # never longer than a look


def test_a_keep_alive_backs_off_within_its_deadline_and_counts_only_its_own_losses(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's keep-alive has its heartbeat timeout (5 s) to land its write. The back-off's
    # bound is a look's interval, which can be longer (scale.py paces a 1,024-node join at
    # 16 s), and a node's losses were carried from one operation to the next: after one
    # keep-alive that lost many times, every later one began at the longest back-off, past
    # its deadline, and failed (1,024 simulated nodes at rest: hundreds of keep-alives
    # failed, and the nodes that saw their peers' heartbeats go stale counted them lost).
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn  # noqa: PLC0415

    from supervisor.coord import pace  # noqa: PLC0415

    # torch names each rendezvous event with inspect.stack(), which reads the source of
    # every frame: ~0.1 s an event under pytest's deep stack (a keep-alive thread's is a
    # few frames), and this keep-alive has 5 s for thirteen attempts. The same name,
    # found without the source (as scripts/bench/scale.py does):
    monkeypatch.setattr(dyn, "get_method_name", lambda depth=2: sys._getframe(depth).f_code.co_name)
    settings = dyn.RendezvousSettings(
        "r7", 2, 1024, dyn.RendezvousTimeout(heartbeat=timedelta(seconds=5)), timedelta(seconds=2),
        keep_alive_max_attempt=10**6,  # nobody is ever dropped for a stale heartbeat here
    )  # fmt: skip
    other = _holder(endpoint, "r7", settings)
    me, peer = dyn._NodeDesc("127.0.0.1", 1, 0), dyn._NodeDesc("127.0.0.1", 2, 0)

    def due() -> None:  # our keep-alive is due: our last heartbeat is 10 s old
        other.sync()
        other.state.participants.update({me: 0, peer: 1})
        other.state.last_heartbeats.update({me: datetime.now(UTC) - timedelta(seconds=10)})
        other.mark_dirty()
        assert other.sync() is True

    races = [0]

    class Racing(dyn.RendezvousBackend):
        """The store, where the peer's keep-alive lands between our read and the next
        ``races`` of our compare-and-sets."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        @property
        def name(self) -> str:
            return "c10d"

        def get_state(self) -> Any:
            return self.inner.get_state()

        def set_state(self, state: bytes, token: Any = None) -> Any:
            if races[0] > 0:
                races[0] -= 1
                other.sync()
                other.state.last_heartbeats[peer] = datetime.now(UTC)
                other.mark_dirty()
                assert other.sync() is True
            return self.inner.set_state(state, token)

    op_deadline = [0.0]
    left: list[float] = []

    class Noting(Clock):  # the bound is under test, not the wait: nothing sleeps
        def pause(self, seconds: float) -> None:
            PAUSED.append(seconds)
            left.append(op_deadline[0] - self.monotonic())

    # a look every 16 s, as scale.py paces a 1,024-node join: longer than the keep-alive's 5 s
    window = pace.Window(pace.Pace(fast=16.0, slowest=16.0), 1024, Noting(), draw=lambda: 0.999)
    assert window.interval == 16.0
    ours = torch_private._PacedHolder(_holder(endpoint, "r7", settings, Racing), window, 0.0)
    executor = torch_private._PacedExecutor(dyn._DistributedRendezvousOpExecutor(me, ours, settings), window)

    def keep_alive(lost: int, seconds: float = settings.timeout.heartbeat.total_seconds()) -> None:
        due()
        PAUSED.clear()
        left.clear()
        races[0] = lost
        op_deadline[0] = Noting().monotonic() + seconds
        beaten = datetime.now(UTC)
        executor.run(dyn._RendezvousKeepAliveOp(), op_deadline[0])  # raises past its deadline
        other.sync()
        assert other.state.last_heartbeats[me] >= beaten  # it landed
        assert len(PAUSED) == lost and races[0] == 0

    keep_alive(12)  # a storm: bounds 0.01 s doubling, past the keep-alive's 5 s by the 10th
    within = [0 < p <= pace.DEADLINE_SHARE * rest for p, rest in zip(PAUSED, left, strict=True)]
    assert all(within), (PAUSED, left)
    assert window.losses == 0  # it landed: a loss in its next keep-alive is a first
    # one that never lands: every write loses until its deadline (torch's keep-alive logs it failed)
    with pytest.raises(dyn.RendezvousTimeoutError):
        keep_alive(10**6, seconds=0.3)
    assert len(PAUSED) >= 5 and window.losses == len(PAUSED)
    keep_alive(1)  # the next keep-alive's first loss is its own first, not the failed one's next
    assert PAUSED[0] <= pace.FIRST_BACKOFF, PAUSED
    # the bound itself: a quarter of what is left; none once the deadline has passed
    assert pace.Pace().backoff(30, 1024, 0.999, left=2.0) <= 0.5
    assert pace.Pace().backoff(30, 1024, 0.999, left=-1.0) == 0.0
