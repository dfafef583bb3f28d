"""Rules as data, and the classifier over them: validation, unwrapping, peer blame."""

from __future__ import annotations

import pytest

from ft_supervisor_plugins.rules import builtin_layer, rule_set
from supervisor.core.classify import UNCLASSIFIED, classify, classify_rank
from supervisor.core.evidence import Evidence
from supervisor.core.notable import is_notable, notable_lines
from supervisor.core.rules import RuleError, compile_rule, compile_rules, prefilter
from supervisor.core.types import Action, ErrorRecord, ExitStatus, RankExit, RankFailure, ReportedException
from supervisor.core.watch import Hang, HangKind

RULES = rule_set()


def _failure(
    rank: int, *lines: str, at: float = 1.0, status: ExitStatus | None = None, **kw: object
) -> RankFailure:
    exit = RankExit(rank, rank, 100 + rank, status or ExitStatus(code=1), at=at, at_wall=at)
    return RankFailure(exit=exit, log_tail=lines, **kw)  # type: ignore[arg-type]


def test_every_builtin_rule_compiles_and_ids_are_unique() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids)) == len(builtin_layer())
    assert {"N1", "N14", "C1", "C9", "H1", "H2", "D1", "D5", "P1", "P8"} <= set(ids)
    assert prefilter(RULES).search("xx Watchdog caught collective operation timeout: yy")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"any": ["x"]}, "every rule needs an id"),
        ({"id": "U1", "any": ["("]}, "'U1': any pattern '(' is not a valid regex"),
        ({"id": "U1", "any": ["x"], "action": "explode"}, "'U1': action must be one of continue, restart"),
        ({"id": "U1", "any": ["x"], "nature": "weird"}, "'U1': nature must be one of transient"),
        ({"id": "U1"}, "'U1': needs something to match"),
        ({"id": "U1", "any": ["x"], "colour": "red"}, "'U1': unknown key(s) ['colour']"),
        ({"id": "U1", "signal": ["SIGNOPE"]}, "'U1': signal must be a list of signal names"),
        ({"id": "U1", "exit": [300]}, "'U1': exit must be a list of exit codes 0-255"),
        (
            {"id": "U1", "any": ["x"], "scope": "moon"},
            "'U1': scope must be one or a list of rank, dmesg, agent",
        ),
        ({"id": "U1", "any": ["x"], "after": 0}, "'U1': after must be an integer >= 1"),
    ],
)
def test_a_bad_rule_is_named_with_its_problem(raw: dict[str, object], message: str) -> None:
    with pytest.raises(RuleError) as err:
        compile_rule(raw)
    assert message in str(err.value)


def test_user_rules_go_first_and_replace_builtins_by_id() -> None:
    user = [
        {"id": "N1", "any": ["Watchdog caught collective operation timeout"], "action": "reschedule"},
        {"id": "MY1", "any": ["our filer is down"], "action": "reschedule", "nature": "hardware"},
    ]
    rules = compile_rules(builtin_layer(), user)
    assert rules[0].id == "MY1"
    assert next(r for r in rules if r.id == "N1").action is Action.RESCHEDULE
    assert len(rules) == len(RULES) + 1
    with pytest.raises(RuleError, match="defined twice"):
        compile_rules([{"id": "A", "any": ["x"]}, {"id": "A", "any": ["y"]}])


def test_wrappers_give_way_to_their_cause() -> None:
    line = (
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"
    )
    c = classify_rank(RULES, _failure(0, "Traceback (most recent call last):", line))
    assert (c.rule, c.action) == ("N7", Action.RESTART)
    assert set(c.wrapped_by) == {"N5", "D1"}
    # with no cause it can name, DistBackendError reschedules (as OSMO's cookbook does)
    c = classify_rank(RULES, _failure(0, "torch.distributed.DistBackendError: something went wrong"))
    assert (c.rule, c.action) == ("D1", Action.RESCHEDULE)


def test_a_peers_death_blames_the_peer_and_the_earliest_own_failure_is_the_root() -> None:
    victim = _failure(
        0,
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:4242",
        at=1.0,
    )
    culprit = _failure(1, "CUDA error: an illegal memory access was encountered", at=2.0)
    c = classify(RULES, Evidence((victim, culprit)))
    assert (c.rule, c.rank) == ("C2", 1)
    # all peers: the earliest stands
    c = classify(RULES, Evidence((victim,)))
    assert (c.rule, c.rank, c.peer) == ("D5", 0, True)


def test_kernel_evidence_wins_when_more_severe() -> None:
    rank = _failure(0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    xid = (
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, "
        "An uncorrectable double bit error (DBE) has been detected"
    )
    c = classify(RULES, Evidence((rank,), dmesg=(xid,)))
    assert (c.rule, c.action, c.rank) == ("H1", Action.RESCHEDULE, 0)
    assert c.lines[0].startswith("NVRM: Xid")
    benign = "NVRM: Xid (PCI:0000:3b:00): 63, pid=1234, Row Remapper: New row marked for remapping"
    assert classify(RULES, Evidence((rank,), dmesg=(benign,))).rule == "C2"


def test_a_python_error_is_a_user_error_only_before_the_first_step() -> None:
    lines = ("Traceback (most recent call last):", '  File "train.py", line 3', "KeyError: 'lr'")
    assert classify_rank(RULES, _failure(0, *lines, progressed=False)).rule == "P1"
    assert classify_rank(RULES, _failure(0, *lines, progressed=True)).rule == "P9"
    assert classify_rank(RULES, _failure(0, *lines)).rule == "P9"  # no client: unknown, not assumed
    # a missing module never fixes itself
    missing = ("ModuleNotFoundError: No module named 'apex'",)
    assert classify_rank(RULES, _failure(0, *missing, progressed=True)).action is Action.ABORT


def test_evidence_from_the_error_file_the_client_and_the_exit() -> None:
    error = ErrorRecord("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert classify_rank(RULES, _failure(0, error=error)).rule == "C1"
    reported = ReportedException(
        "torch.distributed.DistBackendError", "NCCL communicator was aborted on rank 3."
    )
    c = classify_rank(RULES, _failure(0, exception=reported))
    assert (c.rule, c.action) == ("D1", Action.RESCHEDULE)
    assert classify_rank(RULES, _failure(0, status=ExitStatus(signal=9))).rule == "X-SIGKILL"
    # a SIGKILL we sent (the termination procedure) is not the OOM killer's
    ours = RankExit(0, 0, 100, ExitStatus(signal=9), at=1.0, at_wall=1.0, terminated=True)
    assert classify_rank(RULES, RankFailure(exit=ours)).rule == UNCLASSIFIED
    assert classify_rank(RULES, _failure(0, status=ExitStatus(code=127))).action is Action.ABORT
    hang = Hang(0, HangKind.HEARTBEAT, None, open_for=2.0, timeout=1.0, late_by=0.001)
    c = classify_rank(RULES, _failure(0, status=ExitStatus(signal=9), hang=hang))
    assert (c.rule, c.category) == ("HANG", "hang")
    c = classify_rank(RULES, _failure(0, "step 3 done", status=ExitStatus(code=3)))
    assert (c.rule, c.action) == (UNCLASSIFIED, Action.RESTART)


def test_rank_prefixes_are_ignored_and_lines_deduplicated() -> None:
    line = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
    c = classify_rank(RULES, _failure(3, line, line, notable=(line,)))
    assert c.lines == ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",)


def test_the_keyword_prefilter_keeps_whole_lines_in_order() -> None:
    text = "step 1\nRuntimeError: boom\nfine\n[rank0]: NCCL WARN socket\nlast Broken pipe"
    assert notable_lines(text) == ["RuntimeError: boom", "[rank0]: NCCL WARN socket", "last Broken pipe"]
    assert notable_lines("İİ error\nok\n") == ["İİ error"]  # a lower case that changes length
    assert not is_notable("step 12 loss 1.92 lr 3e-4")


RESET = "ConnectionResetError: [Errno 104] Connection reset by peer"


def test_a_rank_killed_from_outside_is_not_blamed_on_its_peer() -> None:
    # issue 11: a forked data-loader worker printed a reset after its rank was SIGKILLed
    killed = _failure(1, RESET, status=ExitStatus(signal=9))
    c = classify_rank(RULES, killed)
    assert (c.rule, c.peer) == ("X-SIGKILL", False)
    # the same line from a rank that exited on its own does blame the peer
    assert classify_rank(RULES, _failure(1, RESET)).rule == "D5"
    # and a SIGKILL that was ours (the termination procedure) says nothing of the cause
    ours = RankExit(1, 1, 101, ExitStatus(signal=9), at=1.0, at_wall=1.0, terminated=True)
    assert classify_rank(RULES, RankFailure(exit=ours, log_tail=(RESET,))).rule == "D5"


def test_what_reached_a_ranks_log_after_it_died_explains_only_what_nothing_else_does() -> None:
    late = ("Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory")
    own = _failure(1, "RuntimeError: boom", after_exit=late)
    assert classify_rank(RULES, own).rule == "P9"  # its own last words win
    silent = _failure(1, status=ExitStatus(code=1), after_exit=late)
    assert classify_rank(RULES, silent).rule == "C1"  # nothing else explains it


def test_a_hung_ranks_reset_connection_is_the_consequence_of_its_hang() -> None:
    # a SIGSTOPped rank, resumed for its stack dump, read its peer's reset as the daemon
    # stopped the peer: its hang was called a peer's failure (D5) and blamed on itself
    hang = Hang(1, HangKind.HEARTBEAT, None, open_for=2.0, timeout=2.0, late_by=0.001)
    ours = RankExit(1, 1, 101, ExitStatus(signal=9), at=1.0, at_wall=1.0, terminated=True)
    gloo = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:47489: Connection reset by peer."
    hung = RankFailure(exit=ours, log_tail=(gloo,), hang=hang, hang_at=0.9)
    c = classify_rank(RULES, hung)
    assert (c.rule, c.peer, c.rank) == ("HANG", False, 1)
    peer = _failure(0, gloo, at=1.01)  # the peer, which did fail because of the hang
    assert (classify(RULES, Evidence(failures=(hung, peer))).rule) == "HANG"


WATCHDOG = (
    "RuntimeError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4021, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600046 milliseconds "
    "before timing out."
)


def test_a_reset_connection_blames_the_peer_we_stopped_while_it_raised() -> None:
    # rank 1 raised, its `finally` closed the process group, rank 0 read the reset and
    # exited first; we stopped rank 1 while it printed its own error. The decision named
    # rank 0 with D5 (a peer's failure), not rank 1's watchdog timeout
    reset = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:59567: Connection reset by peer."
    first = _failure(0, reset, at=1.0)
    ours = RankExit(1, 1, 101, ExitStatus(code=1), at=1.01, at_wall=1.01, terminated=True)
    raised = RankFailure(exit=ours, log_tail=(WATCHDOG,))
    c = classify(RULES, Evidence(failures=(first,), stopped=(raised,)))
    assert (c.rule, c.rank, c.peer) == ("N1", 1, False)
    # a rank we stopped that says only what being stopped may make any rank say is no cause
    vague = RankFailure(exit=ours, log_tail=("RuntimeError: interrupted",))
    c = classify(RULES, Evidence(failures=(first,), stopped=(vague,)))
    assert (c.rule, c.rank, c.peer) == ("D5", 0, True)
    # and a root cause of its own is never replaced by a stopped rank's text
    own = _failure(0, "RuntimeError: CUDA error: out of memory", at=1.0)
    assert classify(RULES, Evidence(failures=(own,), stopped=(raised,))).rule != "N1"
