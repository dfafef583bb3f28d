"""Which daemon ``stop``/``restart``/``status`` act on when none is named: only the one of
this environment (pid namespace, and log dir or working directory)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.cli.control import Ambiguous, CtlError, Place, candidate_lines, choose

HERE = Place(pidns="pid:[1]", cwd="/jobs/a", log_dir="/jobs/a/ft-supervisor-logs")


def _daemon(pid: int, cwd: str, log_dir: str | None = None, pidns: str | None = "pid:[1]") -> dict[str, Any]:
    d = {"pid": pid, "run_id": f"r{pid}", "run_dir": f"{cwd}/logs/r{pid}", "cwd": cwd,
         "log_dir": log_dir or f"{cwd}/ft-supervisor-logs", "pidns": pidns}  # fmt: skip
    return {k: v for k, v in d.items() if v is not None}


def test_the_one_daemon_of_this_directory_or_log_dir_is_chosen_among_others() -> None:
    here, other = _daemon(10, "/jobs/a"), _daemon(11, "/jobs/b")
    assert choose([other, here], None, None, HERE, read_only=False) is here
    by_log_dir = _daemon(12, "/home/u", log_dir="/jobs/a/ft-supervisor-logs")
    assert choose([other, by_log_dir], None, None, HERE, read_only=False) is by_log_dir


@pytest.mark.parametrize("read_only", [False, True])
def test_two_daemons_here_are_listed_not_acted_on(read_only: bool) -> None:
    first, second = _daemon(10, "/jobs/a"), _daemon(11, "/elsewhere", log_dir="/jobs/a/ft-supervisor-logs")
    with pytest.raises(Ambiguous, match="2 daemons run in this environment") as e:
        choose([first, second, _daemon(12, "/jobs/b")], None, None, HERE, read_only=read_only)
    assert e.value.candidates == [first, second]


def test_another_jobs_daemon_is_never_stopped_unasked_but_may_be_read() -> None:
    # issue 22: the user's only daemon belonged to another job; `stop` stopped it
    other = _daemon(11, "/jobs/b")
    with pytest.raises(Ambiguous, match="no daemon runs in this environment") as e:
        choose([other], None, None, HERE, read_only=False)
    assert e.value.candidates == [other]
    assert choose([other], None, None, HERE, read_only=True) is other  # status, events


def test_a_daemon_of_another_pid_namespace_or_of_unknown_place_is_not_this_environments() -> None:
    container = _daemon(1, "/jobs/a", pidns="pid:[2]")  # same path, another container
    older = _daemon(10, "/jobs/a", pidns=None)  # a daemon.json from before pidns was written
    for d in (container, older):
        with pytest.raises(Ambiguous):
            choose([d], None, None, HERE, read_only=False)
    assert "another pid namespace: pid:[2]" in candidate_lines([container])[0]
    # its pid means nothing here; its run id does
    with pytest.raises(CtlError, match="no running ft-supervisor daemon matching"):
        choose([container], 1, None, HERE, read_only=False)
    assert choose([container], None, "r1", HERE, read_only=False) is container


def test_no_daemon_is_an_error_not_a_choice() -> None:
    with pytest.raises(CtlError) as e:
        choose([], None, None, HERE, read_only=False)
    assert not isinstance(e.value, Ambiguous)
