"""Suite-wide fixtures: every test runs under a leak check and a deadline."""

from __future__ import annotations

import gc
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.process.sentinel import kill_all, pids_with_env
from tests.support import LEAK_KEY, Daemon, wait_until

# pytest-xdist workers when the command line names none. The tests mostly wait on
# subprocesses, but those import torch, which is CPU heavy: on CI's 2 cores 3 workers
# were measured best (serial 11.5 min, -n 2 6.4, -n 3 5.6, -n 4 7.6, all beside another
# suite on the same cores). -n N picks another count; -n 0 or -p no:xdist runs
# everything in this one process. Set here and not in addopts, where -n would be an
# unknown option once -p no:xdist has removed the plugin.
WORKERS = 3


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # no xdist, or this is one of its workers
    if config.option.numprocesses is None and not config.option.usepdb and not config.option.collectonly:
        config.option.numprocesses = WORKERS
        if config.option.dist == "no":
            # a worker that is done takes tests queued on a busy one: the durations here
            # range from milliseconds to a minute, and are not known in advance
            config.option.dist = "worksteal"


# after the slow tests, the tiers by their tests' usual length: real processes (seconds
# each) before the unit tests and the fast tier (milliseconds)
TIER_ORDER = {"integration": 0, "component": 1}


def _workers(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput.get("workercount", 1))
    return int(getattr(config.option, "numprocesses", None) or 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, then the longer tiers (a stable sort: otherwise in file order),
    dealt round-robin into one run per xdist worker, laid end to end.

    xdist's worksteal hands each worker a contiguous share of this order and lets an idle
    one take the end of a busy one's. Sorted alone, the first worker's share held every
    slow test: it ran them in a row while the others, done with the unit tests, took
    them one by one, and the run ended on one worker with the others idle (6 min 41 s with
    4 workers, 1.2 cores busy of 2). Dealt, every share starts with its part of the slow
    tests and ends with unit and fast tests, which even out the end."""

    def tier(item: pytest.Item) -> int:
        parts = item.path.parts
        return TIER_ORDER.get(parts[parts.index("tests") + 1], 2) if "tests" in parts else 2

    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, tier(item)))
    workers = _workers(config)
    if workers > 1:
        items[:] = [item for share in range(workers) for item in items[share::workers]]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def no_leaked_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves any process behind, grandchildren included.

    Every process a test starts inherits a per-test token in its environment;
    afterwards /proc must hold none that carries it (a few seconds are allowed
    for processes already on their way out, such as a sentinel's last sweep).
    """
    entry = f"{LEAK_KEY}={uuid.uuid4().hex}"
    key, value = entry.split("=")
    monkeypatch.setenv(key, value)
    # CI's environment has no PYTHONUNBUFFERED; a developer's shell may, and
    # then buffering bugs pass here and fail there
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    yield
    probe = entry.encode()
    try:
        wait_until(lambda: not pids_with_env(probe), 10.0, "the test's processes to exit")
    except AssertionError:
        leaked = pids_with_env(probe)
        described = [f"{pid}: {_cmdline(pid)}" for pid in leaked]
        kill_all(leaked, signal.SIGKILL)
        pytest.fail("leaked processes:\n" + "\n".join(described))


@pytest.fixture(autouse=True)
def node_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own node state ($XDG_STATE_HOME): a health ledger a test leaves
    (a hardware-looking failure) never reaches the next test, or the machine's."""
    state = tmp_path_factory.mktemp("xdg-state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Daemons started by a test; any still running at the end is killed.

    Every daemon that ended on its own and left a reason file is judged again by
    ``ft-supervisor classify``'s code, in this process (milliseconds): where the two
    disagree, the test fails with both sides shown.
    """
    started: list[Daemon] = []
    yield started
    ended = [d for d in started if d.proc.poll() is not None]
    for d in started:
        d.close()
    differ = [text for d in ended for text in d.disagreements()]
    if differ:
        pytest.fail("ft-supervisor classify disagrees with the daemon:\n" + "\n\n".join(differ))


@pytest.fixture
def start(tmp_path: Path, daemons: list[Daemon], request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    # The daemon's default preload (auto) imports torch into its fork server when torch is
    # installed, 2.7 CPU-s a daemon whatever its ranks run: a test whose ranks are torch-free
    # (not marked torch) preloads what they import instead (supervisor.client, ~0.1 CPU-s
    # once rather than in every rank and standby of every generation: a 3-generation job
    # of 2 ranks 2.2 -> 1.3 CPU-s) unless it names its own preload. Their ranks are then
    # forked, as production's are; spawned ones: the tests that say --preload none
    torch_free = request.node.get_closest_marker("torch") is None

    def _start(
        *args: str, env: dict[str, str] | None = None, run_id: str = "t", prefix: tuple[str, ...] = ()
    ) -> Daemon:
        sub = tmp_path / f"d{len(daemons)}"
        sub.mkdir()
        if torch_free and not any(a == "--preload" or a.startswith("--preload=") for a in args):
            args = ("--preload", "supervisor.client", *args)
        d = Daemon(sub, args, env=env, run_id=run_id, prefix=prefix)
        daemons.append(d)
        return d

    return _start


@pytest.fixture
def endpoint() -> Iterator[str]:
    """A c10d rendezvous store hosted by the test, as a stable endpoint would be in
    production: any daemon under test may then die or leave without taking it along."""
    from torch.distributed import TCPStore  # noqa: PLC0415 - only multi-node tests need torch here

    from supervisor.process.ports import free_port  # noqa: PLC0415

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    yield f"127.0.0.1:{port}"
    del store


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection loaded (torch among it: ~10^6 objects) lives for the whole worker:
    out of the collector's reach, a full collection costs 1 ms instead of 90 (the
    in-process daemon's runs each end with one; the unit and fast tiers lost 10 CPU-s)."""
    gc.collect()
    gc.freeze()
