"""A launcher's log names the same root rank wherever it is cut after the failure
(issue 26): the real torchrun logs of a job whose rank 1 was SIGKILLed while rank 0
waited in an all_reduce (tests/fixtures/failures/README.md), classified as
``ft-supervisor classify`` reads a file (``supervisor.postmortem.logs``), once for every
line the log could end at from torchrun's first ``failed (exitcode...)`` line on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ft_supervisor_plugins.rules import rule_set
from supervisor.core.classify import Classification, classify, classify_lines
from supervisor.core.evidence import Evidence
from supervisor.core.types import ExitStatus, RankExit, RankFailure
from supervisor.postmortem import logs

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
RULES = rule_set()
FAILED = "failed (exitcode:"


def _classify_cut(tmp_path: Path, lines: list[str], end: int) -> Classification:
    cut = tmp_path / "agent.log"
    cut.write_text("\n".join(lines[:end]) + "\n")
    log = logs.read_log(cut)
    assert log.launcher
    return classify(RULES, Evidence((), agent_log=log.lines))


@pytest.mark.parametrize(
    ("name", "root"),
    [
        # the whole log of a job that recovered, and of one whose next generation failed too
        ("p6_torchrun_recovered_agent.log", ("P6", 1, False, "")),
        ("p6_torchrun_restart_failed_again_agent.log", ("P6", 1, False, "")),
        # torchrun named rank 0 (it exited before torchrun looked) and never rank 1's
        # signal: the root stays the rank that saw it, and the peer is gloo's address
        ("d5_torchrun_names_the_waiting_rank_agent.log", ("D5", 0, True, "[127.0.0.1]:28059")),
    ],
)
def test_every_cut_after_the_failure_names_the_same_root(tmp_path: Path, name: str, root: tuple) -> None:
    lines = (CORPUS / name).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if FAILED in line)
    found = {}
    for end in range(first + 1, len(lines) + 1):
        c = _classify_cut(tmp_path, lines, end)
        found[end] = (c.rule, c.rank, c.peer, c.blames)
    wrong = {end: got for end, got in found.items() if got != root}
    assert not wrong, wrong
    assert len(found) > 15  # the test saw the later generations' lines too


def test_gloo_peer_lines_name_the_peer_they_blame() -> None:
    closed = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
              "peer [127.0.0.1]:6020. This is typically caused by a remote worker crashing.")  # fmt: skip
    reset = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
             "[10.1.2.3]:62660: Connection reset by peer")  # fmt: skip
    for line, peer in ((closed, "[127.0.0.1]:6020"), (reset, "[10.1.2.3]:62660"), ("Broken pipe", "")):
        c = classify_lines(RULES, [line])
        assert c is not None and (c.rule, c.peer, c.blames) == ("D5", True, peer)


WATCHDOG = ("[rank0]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=37, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600045 milliseconds before timing out.")  # fmt: skip


def _failed(rank: int, at: float, status: ExitStatus, *lines: str) -> RankFailure:
    return RankFailure(RankExit(rank, rank, 100 + rank, status, at=at, at_wall=at), log_tail=lines)


def test_a_rank_that_failed_on_its_own_outranks_an_earlier_waiting_ranks_timeout() -> None:
    # rank 0's watchdog fired first; rank 1, the one it waited for, died of a signal
    waited = _failed(0, 1.0, ExitStatus(code=1), WATCHDOG)
    died = _failed(1, 2.0, ExitStatus(signal=9))
    c = classify(RULES, Evidence((waited, died)))
    assert (c.rule, c.rank) == ("X-SIGKILL", 1)
    # alone, the timeout is the rank's own failure, as before
    alone = classify(RULES, Evidence((waited,)))
    assert (alone.rule, alone.rank, alone.waiting) == ("N1", 0, True)
