"""A rank still running after every other rank exited 0 (supervisor.core.lingering)."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.lingering import Stuck, finished_work, idle, overdue, verdict, where_stuck
from supervisor.core.states import RankState
from supervisor.core.types import Action, Reason

STACKS = Path(__file__).resolve().parent.parent / "fixtures" / "stacks"
R, S, F = RankState.RUNNING, RankState.SUCCEEDED, RankState.FAILED


def test_a_rank_is_overdue_grace_seconds_after_its_last_peer_exited_0() -> None:
    states = {0: S, 1: R, 2: S}
    exited = {0: 10.0, 2: 12.0}
    assert overdue(states, exited, now=13.9, grace=2.0) == ()
    assert overdue(states, exited, now=14.0, grace=2.0) == (1,)


def test_nobody_is_overdue_while_a_peer_runs_failed_or_there_is_no_peer() -> None:
    assert overdue({0: R, 1: R}, {}, now=100.0, grace=1.0) == ()
    assert overdue({0: F, 1: R}, {0: 1.0}, now=100.0, grace=1.0) == ()  # a failure: judged as one
    assert overdue({0: R}, {}, now=100.0, grace=1.0) == ()  # alone: a long run looks the same
    assert overdue({0: S, 1: S}, {0: 1.0, 1: 1.0}, now=100.0, grace=1.0) == ()


def test_on_several_nodes_the_grace_counts_from_when_every_other_node_was_done() -> None:
    # one rank a node: its peers are on the other nodes, whose success this node learns
    assert overdue({0: R}, {}, now=100.0, grace=2.0, other_nodes_done=None) == ()  # not yet
    assert overdue({0: R}, {}, now=11.9, grace=2.0, other_nodes_done=10.0) == ()
    assert overdue({0: R}, {}, now=12.0, grace=2.0, other_nodes_done=10.0) == (0,)
    # local peers too: from the later of the two
    assert overdue({0: S, 1: R}, {0: 20.0}, now=21.0, grace=2.0, other_nodes_done=10.0) == ()
    assert overdue({0: S, 1: R}, {0: 5.0}, now=12.0, grace=2.0, other_nodes_done=10.0) == (1,)
    # a local peer that failed is a failure, whatever the other nodes did
    assert overdue({0: F, 1: R}, {0: 5.0}, now=100.0, grace=2.0, other_nodes_done=10.0) == ()


def test_a_lingering_rank_that_uses_cpu_or_writes_is_working_not_stuck() -> None:
    assert idle((3.0, 1000), (3.01, 1000), seconds=1.0)  # a deadlock: no CPU, no I/O
    assert not idle((3.0, 1000), (3.5, 1000), seconds=1.0)  # half a CPU
    assert not idle((3.0, 1000), (3.0, 1000 + (8 << 20)), seconds=1.0)  # 8 MiB written
    assert idle(None, (3.5, 1000), seconds=1.0)  # unreadable: ended, as before


def test_the_gloo_teardown_deadlock_of_the_ddp_tutorial_is_past_the_program() -> None:
    stuck = where_stuck(None, (STACKS / "gloo_exit_deadlock_native.txt").read_text())
    assert stuck.teardown is True
    assert "freeing objects after the program's last statement" in stuck.why
    assert stuck.where[0] == "<module> (multigpu_torchrun.py:111)"


def test_an_atexit_handler_or_finalization_is_past_the_program() -> None:
    python = ('Thread 0x00007f01 (most recent call first):\n'
              '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
              '  File "/app/train.py", line 9 in _flush_at_exit\n')  # fmt: skip
    assert where_stuck(python, None).teardown is True
    native = ('Thread 7 (idle): "MainThread"\n    pthread_join (libc.so.6)\n'
              "    Py_FinalizeEx (libpython3.11.so)\n    Py_RunMain (libpython3.11.so)\n")  # fmt: skip
    found = where_stuck(None, native)
    assert found.teardown is True and "Py_FinalizeEx" in found.why


def test_a_rank_in_its_training_step_is_not_past_the_program() -> None:
    python = ('Thread 0x00007f01 (most recent call first):\n'
              '  File "/app/train.py", line 30 in train_step\n'
              '  File "/app/train.py", line 50 in main\n'
              '  File "/app/train.py", line 60 in <module>\n'
              'Thread 0x00007f02 (most recent call first):\n'
              '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n')  # fmt: skip
    found = where_stuck(python, None)
    assert found.teardown is False and found.why == "in train_step (/app/train.py)"
    native = ('Thread 7 (idle): "MainThread"\n    nanosleep (libc.so.6)\n    train_step (train.py:30)\n'
              "    main (train.py:50)\n    <module> (train.py:60)\n")  # fmt: skip
    assert where_stuck(python, native) == Stuck(
        False, ("train_step (train.py:30)", "main (train.py:50)", "<module> (train.py:60)"),
        "in train_step (train.py:30)",
    )  # fmt: skip
    assert where_stuck(None, None).teardown is None


def test_the_rank_finished_its_work_by_its_own_reports() -> None:
    assert finished_work(20, 20, said_bye=False) == "it reported its last iteration (20, as its peers)"
    assert finished_work(None, None, said_bye=True) == "its client said goodbye"
    assert finished_work(17, 20, said_bye=False) is None
    assert finished_work(None, 20, said_bye=False) is None


def test_the_verdict_is_a_success_when_done_else_a_decision_that_says_why() -> None:
    done = Stuck(True, ("<module> (t.py:9)",), "the interpreter is finalizing (Py_FinalizeEx)")
    decision, why = verdict(1, waited=10.0, finished=None, stuck=done, iteration=None, peers_last=None,
                            restarts_left=0)  # fmt: skip
    assert decision is None and "a success, its stacks show it past its program" in why
    looping = Stuck(False, ("train_step (t.py:3)",), "in train_step (t.py:3)")
    decision, why = verdict(1, waited=10.0, finished=None, stuck=looping, iteration=17, peers_last=20,
                            restarts_left=2)  # fmt: skip
    assert decision is not None and (decision.action, decision.reason) == (Action.RESTART, Reason.RANK_HUNG)
    assert (
        decision.detail
        == why
        == (
            "rank 1 still ran 10 s after every other rank exited 0, not past its work: "
            "its last iteration 17, its peers' 20, and its stacks show it in train_step (t.py:3)"
        )
    )
    decision, _ = verdict(1, waited=10.0, finished=None, stuck=looping, iteration=None, peers_last=None,
                          restarts_left=0)  # fmt: skip
    assert decision is not None and decision.action is Action.ABORT
