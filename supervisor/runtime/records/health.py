"""The node's health ledger on disk: read at start and after a failure, written when
a hardware-looking failure leaves a mark. The rules are in supervisor.core.health.

The file is small and bounded (its newest marks of the last 30 days; reading stops
at 1 MiB); one that cannot be read counts as empty and is reported once, never
fatal: a damaged ledger must not keep a healthy node from its work.
"""

from __future__ import annotations

import asyncio
import os

import orjson

from supervisor.clock import Clock
from supervisor.config.health import HealthConfig
from supervisor.core.catalogue.health import (
    NodeHealthMarked,
    NodeHealthUnreadable,
    NodeHealthUnwritable,
    NodeQuarantined,
)
from supervisor.core.health import Ledger, mark_of, quarantined, screen
from supervisor.core.types import Decision, EventSink
from supervisor.runtime.records.reason import write_atomically

READ_MAX = 1 << 20


def read_ledger(cfg: HealthConfig, now: float) -> tuple[Ledger, str | None]:
    """The ledger, and what was wrong with the file (None when it is fine or absent)."""
    try:
        with cfg.ledger.open("rb") as f:
            data = f.read(READ_MAX + 1)
    except FileNotFoundError:
        return Ledger(), None
    except OSError as exc:
        return Ledger(), f"cannot read {cfg.ledger}: {exc.strerror or exc}"
    if len(data) > READ_MAX:
        return Ledger(), f"{cfg.ledger} is over {READ_MAX} bytes"
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return Ledger(), f"{cfg.ledger} is not JSON: {exc}"
    return Ledger.from_json(raw, now), None


def write_ledger(cfg: HealthConfig, ledger: Ledger) -> None:
    cfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(cfg.ledger, orjson.dumps(ledger.to_json(), option=orjson.OPT_INDENT_2))


class NodeHealth:
    def __init__(self, cfg: HealthConfig, events: EventSink, clock: Clock, run_id: str) -> None:
        self.cfg, self._events, self._clock, self._run_id = cfg, events, clock, run_id
        self._said_unreadable = False

    async def _load(self) -> Ledger:
        # off the loop: the state directory may be a slow or a full filesystem
        ledger, problem = await asyncio.to_thread(read_ledger, self.cfg, self._clock.wall())
        if problem is not None and not self._said_unreadable:
            self._said_unreadable = True
            self._events.emit(NodeHealthUnreadable(problem=problem))
        return ledger

    async def at_start(self) -> Decision | None:
        """The node's ranks stay off when its ledger already crosses the threshold."""
        if self.cfg.quarantine is None:
            return None
        refused = quarantined(await self._load(), self.cfg.quarantine, self._clock.wall())
        if refused is not None:
            self._quarantined(refused, when="start")
        return refused

    async def after(
        self, decision: Decision, nature: str | None, rule: str | None, generation: int, *,
        culprit: bool = False,
    ) -> Decision:  # fmt: skip
        """Record the mark a decision leaves; a restart that crosses the threshold
        becomes this node's leaving."""
        now = self._clock.wall()
        mark = mark_of(decision, nature, rule, now=now, run_id=self._run_id, generation=generation,
                       culprit=culprit)  # fmt: skip
        if mark is None and self.cfg.quarantine is None:
            return decision
        ledger = await self._load()
        if mark is not None:
            ledger = ledger.add(mark)
            try:
                await asyncio.to_thread(write_ledger, self.cfg, ledger)
            except OSError as exc:
                error = exc.strerror or str(exc)
                self._events.emit(NodeHealthUnwritable(path=str(self.cfg.ledger), error=error))
            self._events.emit(
                NodeHealthMarked(
                    generation=generation,
                    kind=mark.kind,
                    rule=mark.rule or None,
                    marks=len(ledger.marks),
                    path=str(self.cfg.ledger),
                )
            )
        screened = screen(decision, ledger, self.cfg.quarantine, now)
        if screened is not decision:
            self._quarantined(screened, when="restart")
        return screened

    def _quarantined(self, decision: Decision, when: str) -> None:
        self._events.emit(
            NodeQuarantined(
                when=when,
                quarantine=str(self.cfg.quarantine),
                ledger=str(self.cfg.ledger),
                detail=decision.detail,
                pid=os.getpid(),
            )
        )
