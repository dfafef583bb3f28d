"""Learned timeouts that outlive the run (``--state-dir``): read once, written on change."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.catalogue.daemon import StateUnreadable, StateUnwritable
from supervisor.core.learning import Learned
from supervisor.runtime.records import statefile
from supervisor.runtime.records.events import EventLog


class LearnedFile:
    def __init__(self, state_dir: Path, run_id: str, events: EventLog) -> None:
        self.path = statefile.path_in(state_dir)
        self._run_id, self._events = run_id, events

    def load(self) -> Learned:
        """What earlier runs learned; a file that cannot be read is reported, and learning starts over."""
        learned, problem = statefile.load(self.path)
        if problem is not None:
            self._events.emit(StateUnreadable(problem=problem))
        return learned

    def save(self, learned: Learned, generation: int | None) -> None:
        """A failed write is reported; the run goes on."""
        try:
            statefile.save(self.path, learned, run_id=self._run_id, generation=generation)
        except OSError as exc:
            self._events.emit(StateUnwritable(path=str(self.path), error=str(exc)))
