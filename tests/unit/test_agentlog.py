"""Launcher logs (torchrun's, ft_launcher's, captured on this machine: see
tests/fixtures/failures/README.md) split into ranks: who failed, how it ended,
who hung, and which rank is the root cause."""

from __future__ import annotations

import signal
from pathlib import Path

from ft_supervisor_plugins.rules import rule_set
from supervisor.core.agentlog import is_launcher_log, launcher_ranks
from supervisor.core.classify import classify
from supervisor.core.evidence import Evidence
from supervisor.core.types import ExitStatus
from supervisor.core.watch import HangKind

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
RULES = rule_set()


def _lines(name: str) -> tuple[str, ...]:
    return tuple((CORPUS / name).read_text(errors="replace").splitlines())


def test_an_ft_launcher_hang_is_a_hang_of_the_rank_its_monitor_names() -> None:
    lines = _lines("hang_ft_launcher_section_agent.log")
    assert is_launcher_log(lines)
    ranks = launcher_ranks(lines)
    assert [r.exit.rank for r in ranks] == [1, 0]
    hung = ranks[0]
    assert hung.hang is not None
    assert (hung.hang.rank, hung.hang.kind, hung.hang.section, hung.hang.timeout) == (
        1, HangKind.SECTION, "step", 3.0,
    )  # fmt: skip
    assert hung.hang.open_for == 3.12
    # the monitor's SIGKILL is the hang's consequence, not its cause
    assert hung.exit.status == ExitStatus(signal=signal.SIGKILL) and hung.exit.terminated
    assert not any("Signal 9 (SIGKILL)" in line for line in hung.texts())
    assert ranks[1].exit.terminated  # the launcher's SIGTERM
    c = classify(RULES, Evidence((), agent_log=lines))
    assert (c.rule, c.rank) == ("HANG", 1)


def test_torchruns_report_names_the_root_cause_and_its_exit() -> None:
    lines = _lines("p6_sigkill_agent.log")
    ranks = launcher_ranks(lines)
    assert [(r.exit.rank, r.exit.local_rank, r.exit.pid) for r in ranks] == [(1, 1, 10818), (0, 0, 10817)]
    assert ranks[0].exit.status == ExitStatus(signal=signal.SIGKILL) and not ranks[0].exit.terminated
    assert ranks[1].exit.status == ExitStatus(signal=signal.SIGTERM) and ranks[1].exit.terminated
    # each rank's report entry is its own: rank 0's SIGTERM is not rank 1's evidence
    assert not any("Signal 15" in line for line in ranks[0].texts())
    assert not any("Signal 9" in line for line in ranks[1].texts())
    c = classify(RULES, Evidence((), agent_log=lines))
    assert (c.rule, c.rank, c.wrapped_by) == ("P6", 1, ("D4",))


def test_the_exit_status_from_torchruns_log_reaches_the_signal_rules() -> None:
    # with the text rule for SIGKILL out of the way, the rank's exit status decides
    rules = rule_set([{"id": "P6", "any": ["^no such line$"], "category": "oom"}])
    c = classify(rules, Evidence((), agent_log=_lines("p6_sigkill_agent.log")))
    assert (c.rule, c.rank) == ("X-SIGKILL", 1)
    rules = rule_set([{"id": "P4", "any": ["^no such line$"]}])
    c = classify(rules, Evidence((), agent_log=_lines("p4_sigsegv_agent.log")))
    assert c.rule == "X-SIGSEGV"


def test_mixed_output_by_local_rank_goes_to_the_global_rank_the_report_names() -> None:
    # torchrun --tee on the second node of two: [defaultN] is the local rank
    lines = (
        "[default1]:RuntimeError: bad batch",
        "E1122 18:08:36.705000 4273 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 1 (pid: 4286) of binary: /usr/bin/python3",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 1 (pid: 4286) ",
        "============================================================",
    )
    (only,) = launcher_ranks(lines)
    assert (only.exit.rank, only.exit.local_rank, only.exit.status) == (3, 1, ExitStatus(code=1))
    assert "[default1]:RuntimeError: bad batch" in only.texts()


def test_a_ranks_own_log_is_not_a_launchers() -> None:
    assert not is_launcher_log(_lines("p1_key_error.log"))
    assert is_launcher_log(_lines("d4_no_root_cause.log"))
