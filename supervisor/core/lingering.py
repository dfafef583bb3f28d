"""A rank still alive after every other rank of its generation exited 0.

Its peers finished: it is either stuck on its way out (a gloo process group's
destructor waiting for a worker thread that waits for the GIL, an atexit handler,
a non-daemon thread that never ends) or stuck in its own work. Without a look, it
would be waited for without end. Four pure questions, time a parameter:

* ``overdue``: which ranks have lingered ``grace`` seconds past their last peer's exit;
* ``idle``: whether such a rank does nothing (a rank still writing its final
  checkpoint is not stuck: it is left to finish);
* ``where_stuck``: from its stacks (faulthandler's dump, py-spy's native dump), is
  it past its program (tearing down) and where it stands;
* ``verdict``: the run's outcome: a success when the rank had finished its work
  (its last iteration reported, or a goodbye, or teardown stacks), else a decision
  saying why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.core.stacks import Frame, threads
from supervisor.core.states import RankState
from supervisor.core.types import Action, Decision, Reason


def overdue(
    states: Mapping[int, RankState], exited_at: Mapping[int, float], now: float, grace: float,
    other_nodes_done: float | None = None,
) -> tuple[int, ...]:  # fmt: skip
    """Local ranks still running ``grace`` s after every other rank of the job exited 0.

    ``exited_at``: when (monotonic) each local rank that exited did;
    ``other_nodes_done``: when this node learnt that every rank of every other node
    of the job had (None: a node alone, or not yet). A rank alone has no peer to be
    measured against: a long run and a stuck exit look the same."""
    running = [lr for lr, s in states.items() if s is RankState.RUNNING]
    others = [lr for lr in states if lr not in running]
    if not running or any(states[lr] is not RankState.SUCCEEDED for lr in others):
        return ()
    times = [exited_at[lr] for lr in others if lr in exited_at]
    if other_nodes_done is not None:
        times.append(other_nodes_done)
    if not times or now - max(times) < grace:
        return ()
    return tuple(sorted(running))


IDLE_CPU = 0.05  # share of one CPU below which a lingering rank does no work of its own
IDLE_IO = 1 << 20  # bytes a second read or written below which it does no work either
WINDOW = 1.0  # seconds, at most, over which a lingering rank's activity is measured


def idle(before: tuple[float, int] | None, after: tuple[float, int] | None, seconds: float) -> bool:
    """Did a lingering rank do nothing over ``seconds`` (CPU seconds, bytes read or
    written, before and after)? A deadlocked teardown does nothing; a rank writing
    its final checkpoint after its peers left works, and is left to finish. What
    cannot be read counts as idle: the rank is then ended, as it would have been."""
    if before is None or after is None or seconds <= 0:
        return True
    cpu, io = after[0] - before[0], after[1] - before[1]
    return cpu < IDLE_CPU * seconds and io < IDLE_IO * seconds


# py-spy's dump: a thread header, then one frame a line, innermost first; a Python
# frame names its file and line, a native one its library
_SPY_THREAD = re.compile(r'^Thread \d+ \([^)]*\)(?:: "(?P<name>[^"]*)")?')
_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<where>[^()]*)\)\s*$")
_SPY_PYTHON = re.compile(r"^(?P<file>.+):(?P<line>\d+)$")
# the interpreter on its way out: finalization, atexit handlers, waiting for threads
_FINALIZING = ("Py_FinalizeEx", "Py_Finalize", "atexit_callfuncs", "finalize_modules", "_PyImport_Cleanup",
               "call_py_exitfuncs", "wait_for_thread_shutdown", "Py_RunMain")  # fmt: skip
_THREAD_START = ("_bootstrap", "_bootstrap_inner")
MODULE = "<module>"
TOP = 5  # frames that say where a rank stands


@dataclass(frozen=True, slots=True)
class Stuck:
    """Where a lingering rank's main thread stands."""

    teardown: bool | None  # past its program; None: its stacks could not tell
    where: tuple[str, ...]  # its innermost Python frames (or native ones), innermost first
    why: str  # what decided ``teardown``


def _spy_main(text: str) -> list[tuple[str, str]]:
    """py-spy's main thread: (function, file:line or library), innermost first."""
    found: list[tuple[str | None, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        if m := _SPY_THREAD.match(line):
            found.append((m["name"], []))
        elif found and (f := _SPY_FRAME.match(line)):
            found[-1][1].append((f["func"], f["where"]))
    named = [frames for name, frames in found if name == "MainThread"]
    return named[0] if named else (found[0][1] if found else [])


def _python_main(text: str) -> list[Frame]:
    """faulthandler's main thread: the one not started by ``threading`` (at exit the
    main thread may sit in threading's ``_shutdown``, so the file alone does not tell)."""
    for frames in threads(text):
        if frames[-1].func not in _THREAD_START:
            return frames
    return []


def where_stuck(python: str | None, native: str | None) -> Stuck:
    """Is the rank past its program, and where is it? A program runs inside a
    module-level frame (the script's, or runpy's); code the interpreter calls on
    its way out (atexit handlers, threading's join of non-daemon threads) runs
    without one, and so does finalization itself. A destructor run by a module-level
    statement (the objects of a returned ``main()`` freed) is teardown too.
    py-spy's native dump says more (the destructors, finalization); faulthandler's
    is the fallback."""
    spy = _spy_main(native or "")
    found = _from_native(spy) if spy else None
    if found is not None and found.teardown is not None:
        return found
    frames = _python_main(python or "")
    if frames:
        where = found.where if found is not None else tuple(f"{f.func} ({f.file})" for f in frames[:TOP])
        if not any(f.func == MODULE for f in frames):
            return Stuck(True, where, f"called on the way out, outside the program ({frames[-1].func})")
        return Stuck(False, where, f"in {frames[0].func} ({frames[0].file})")
    return found or Stuck(None, (), "no stacks (no client to dump them, and no py-spy)")


def _from_native(spy: list[tuple[str, str]]) -> Stuck:
    py_frames = [(func, where) for func, where in spy if _SPY_PYTHON.match(where)]
    # the program's frames say where it is; native ones only where there is none
    where = tuple(f"{func} ({where})" for func, where in (py_frames or spy)[:TOP])
    finalizing = next((f for f, _ in spy if f.startswith(_FINALIZING)), None)
    if finalizing is not None:
        return Stuck(True, where, f"the interpreter is finalizing ({finalizing})")
    if not py_frames:
        return Stuck(None, where, "no Python frame in its main thread")
    if not any(func == MODULE for func, _ in py_frames):
        return Stuck(True, where, f"called on the way out, outside the program ({py_frames[-1][0]})")
    inner = next(i for i, (_, w) in enumerate(spy) if _SPY_PYTHON.match(w))
    freeing = next((f for f, _ in spy[:inner] if "dealloc" in f or "::~" in f), None)
    if spy[inner][0] == MODULE and freeing is not None:
        return Stuck(True, where, f"freeing objects after the program's last statement ({freeing})")
    return Stuck(False, where, f"in {py_frames[0][0]} ({py_frames[0][1]})")


def finished_work(iteration: int | None, peers_last: int | None, said_bye: bool) -> str | None:
    """Why the rank's own reports say it finished its work, or None."""
    if said_bye:
        return "its client said goodbye"
    if iteration is not None and peers_last is not None and iteration >= peers_last:
        return f"it reported its last iteration ({iteration}, as its peers)"
    return None


def verdict(
    rank: int, *, waited: float, finished: str | None, stuck: Stuck, iteration: int | None,
    peers_last: int | None, restarts_left: int,
) -> tuple[Decision | None, str]:  # fmt: skip
    """None (the run succeeded: the rank finished its work and is only slow to
    exit) or the decision, and why, in words, either way."""
    said = f"rank {rank} still ran {waited:.3g} s after every other rank exited 0"
    if finished is not None:
        return None, f"{said}: a success, {finished}"
    if stuck.teardown:
        return None, f"{said}: a success, its stacks show it past its program: {stuck.why}"
    progress = (
        "it reported no iteration" if iteration is None
        else f"its last iteration {iteration}" + ("" if peers_last is None else f", its peers' {peers_last}")
    )  # fmt: skip
    looks = "its stacks could not tell" if stuck.teardown is None else f"its stacks show it {stuck.why}"
    detail = f"{said}, not past its work: {progress}, and {looks}"
    action = Action.RESTART if restarts_left > 0 else Action.ABORT
    return Decision(action, Reason.RANK_HUNG, detail), detail
