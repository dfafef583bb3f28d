"""Bad config and rules files never wedge or kill the daemon (issue 12, items 2, 3, 7):
at start `run` exits 2 with one line; on SIGHUP the old settings stay, supervision goes
on and SIGTERM still stops it; a catastrophic rule regex cannot stall a decision.
Real daemons, real (torch-free) ranks; every wait has a deadline."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.config.files import MAX_BYTES
from tests.support import RANKS, Daemon, alive, rank_pids, wait_until

Start = Callable[..., Daemon]
BEHAVE = str(RANKS / "behave.py")
FAILS = str(RANKS / "fails.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
QUICKLY = 20.0  # seconds: before the fix, each of these never happened at all

SELF_ALIAS = b"a: &a [*a]\n"  # the 11 bytes
LAUGHS = b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + b"".join(
    b"%c: &%c [%s]\n" % (name, name, b",".join([b"*%c" % prev] * 9))
    for prev, name in zip(b"abcdefgh", b"bcdefghi", strict=True)
)
NOT_UTF8 = b"fault_tolerance:\n  rank_heartbeat_timeout: 60\n  log_level: \xff\n"
ALIASES = "not valid YAML: anchor &a: anchors and aliases are not accepted"
CONFIG, RULES = ("--ft-cfg-path", "ft.yaml"), ("--rules", "rules.yaml")


@pytest.mark.parametrize(
    ("given", "data", "said"),
    [
        (CONFIG, SELF_ALIAS, ALIASES),
        (CONFIG, LAUGHS, ALIASES),
        (CONFIG, NOT_UTF8, "not UTF-8: byte 0xff at offset 59"),
        (CONFIG, b"fault_tolerance: {}\n" + b"#" * MAX_BYTES, "larger than 1048576 bytes (1 MiB)"),
        (RULES, b"rules: &r [*r]\n", "not valid YAML: anchor &r"),
    ],
    ids=["self-alias", "billion-laughs", "not-utf8", "size", "rules-self-alias"],
)
def test_run_refuses_a_bad_file_at_once_with_exit_2(
    start: Start, tmp_path: Path, given: tuple[str, str], data: bytes, said: str
) -> None:
    option, name = given
    path = tmp_path / name
    path.write_bytes(data)
    d = start(*FAST, option, str(path), BEHAVE)
    assert d.wait(timeout=QUICKLY) == 2, d.stderr()
    line = next(ln for ln in d.stderr().splitlines() if said in ln)
    assert str(path) in line
    assert rank_pids(d) == []  # refused before anything started


def test_sighup_with_a_bad_file_keeps_supervising(start: Start, tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 60\n")
    d = start(*FAST, "--max-restarts", "3", "--ft-cfg-path", str(cfg), BEHAVE, "--forever")
    d.wait_event("generation_started")
    wait_until(lambda: len(rank_pids(d, 0)) == 2, QUICKLY, "both ranks spawned")
    first = sorted(rank_pids(d, 0))

    for count, (data, said) in enumerate(
        [(SELF_ALIAS, ALIASES), (NOT_UTF8, "not UTF-8: byte 0xff at offset 59")], 1
    ):
        cfg.write_bytes(data)
        d.signal(signal.SIGHUP)
        failed = d.wait_event("reload_failed", timeout=QUICKLY, count=count)[-1]
        assert failed["error"].startswith(f"config file {cfg}: {said}"), failed
    assert d.events("config_reloaded") == [] and d.events("generation_ended") == []
    assert all(alive(pid) for pid in first)  # the ranks were not touched

    # supervision goes on: a rank killed from outside is noticed and the rank group restarted
    os.kill(first[0], signal.SIGKILL)
    d.wait_event("generation_started", timeout=QUICKLY, where=lambda e: e["generation"] == 1)
    decision = d.events("decision")[0]
    assert decision["action"] == "restart" and decision["rank"] is not None
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=QUICKLY) == 128 + signal.SIGTERM, d.stderr()


def test_a_catastrophic_rule_regex_cannot_stall_the_decision(start: Start, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "[[rule]]\nid = 'BACKTRACK'\nany = ['(a+)+$']\naction = 'abort'\n\n"
        "[[rule]]\nid = 'AAA'\nany = ['a{34}!']\naction = 'restart'\ncategory = 'test'\n"
    )
    d = start(*FAST, "--max-restarts", "3", "--rules", str(rules),
              FAILS, "--rank", "0", "--generations", "0", "--say", "a" * 34 + "!", "--exit", "1")  # fmt: skip
    # Python's re took hours over that line, on the loop: no decision, SIGTERM ignored
    decision = d.wait_event("decision", timeout=QUICKLY)[0]
    assert (decision["action"], decision["rule"], decision["rank"]) == ("restart", "AAA", 0)
    d.wait_event("generation_started", timeout=QUICKLY, where=lambda e: e["generation"] == 1)
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=QUICKLY) == 128 + signal.SIGTERM, d.stderr()
