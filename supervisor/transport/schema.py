"""The wire format: versioned JSON objects (orjson), never pickles.

Every message a rank sends carries ``v`` (the schema version), ``type``, ``rank``,
``gen`` (its generation) and ``k`` (the rank's key, ``FT_SUPERVISOR_KEY``: the daemon
drops what does not carry the key of the rank and generation it claims)::

    {"v": 1, "type": "heartbeat", "rank": 3, "gen": 0, "k": "9f0c..."}
    {"v": 1, "type": "section", "rank": 3, "gen": 0, "op": "open", "name": "step", "iteration": 12}

Decoding checks everything and raises ``Dropped`` naming the reason; the daemon
counts drops by reason and never lets input take it down. Control requests
(``ft-supervisor status``...) use the same envelope without rank and generation,
and get a reply: ``{"v": 1, "id": ..., "ok": true, "data": {...}}``.

The decoded messages are ``supervisor.transport.messages``'s values, also importable
from here. Imported by the in-rank client: standard library and orjson only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from supervisor.transport.messages import (
    AdviceQuery,
    Bye,
    Calculate,
    Checkpoint,
    ExceptionReport,
    Heartbeat,
    Hello,
    Iteration,
    LoadTimeouts,
    NvrxServed,
    RankMessage,
    RequestAction,
    Resumed,
    Saved,
    SaverReady,
    Section,
    SectionOp,
    SnapshotBegin,
    SnapshotDone,
    SnapshotRestore,
    Timing,
    WorkloadRequest,
)

# what callers import from here, the message values of ``messages`` among them
__all__ = [
    "CONTROL_COMMANDS",
    "MAX_CAUSES",
    "MAX_MESSAGE",
    "MAX_SECTIONS",
    "MAX_SNAPSHOT_BYTES",
    "MAX_SNAPSHOT_STEP",
    "MAX_STEP_SECONDS",
    "MAX_TRACEBACK",
    "VERSION",
    "AdviceQuery",
    "Bye",
    "Calculate",
    "Checkpoint",
    "ControlRequest",
    "DropReason",
    "Dropped",
    "ExceptionReport",
    "Heartbeat",
    "Hello",
    "Iteration",
    "LoadTimeouts",
    "NvrxServed",
    "RankMessage",
    "RequestAction",
    "Resumed",
    "Saved",
    "SaverReady",
    "Section",
    "SectionOp",
    "SnapshotBegin",
    "SnapshotDone",
    "SnapshotRestore",
    "Timing",
    "WorkloadRequest",
    "decode_control",
    "decode_rank_message",
    "decode_signed",
    "encode",
    "reply",
]

VERSION = 1
MAX_MESSAGE = 1 << 20  # bytes; bigger messages are dropped as oversized


class DropReason(StrEnum):
    OVERSIZED = "oversized"
    MALFORMED = "malformed"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    STALE_GENERATION = "stale_generation"
    UNKNOWN_RANK = "unknown_rank"
    UNAUTHENTICATED = "unauthenticated"  # without the rank's key (FT_SUPERVISOR_KEY)
    UNMONITORED_SECTION = "unmonitored_section"  # a section the configuration does not name
    BAD_TIMING = "bad_timing"  # a step timing that is not two finite durations (told apart from others)
    # a snapshot said done for a slot not begun in this generation, or longer than its file
    SNAPSHOT_UNBEGUN = "snapshot_unbegun"


class Dropped(ValueError):
    def __init__(self, reason: DropReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail


def _int(m: dict[str, Any], key: str) -> int:
    value = m.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Dropped(DropReason.MALFORMED, f"{key} must be an integer")
    return value


def _opt_int(m: dict[str, Any], key: str) -> int | None:
    return None if m.get(key) is None else _int(m, key)


def _str(m: dict[str, Any], key: str, *, optional: bool = False, limit: int = 256) -> str | None:
    value = m.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise Dropped(DropReason.MALFORMED, f"{key} must be a string of at most {limit} characters")
    return value


def _enum(kind: type[StrEnum], value: object, key: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise Dropped(
            DropReason.MALFORMED, f"{key} {value!r} is not one of {[e.value for e in kind]}"
        ) from None


def _envelope(payload: bytes) -> dict[str, Any]:
    if len(payload) > MAX_MESSAGE:
        raise Dropped(DropReason.OVERSIZED, f"{len(payload)} bytes")
    try:
        m = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise Dropped(DropReason.MALFORMED, "not JSON") from None
    if not isinstance(m, dict):
        raise Dropped(DropReason.MALFORMED, "not a JSON object")
    if m.get("v") != VERSION:
        raise Dropped(DropReason.UNKNOWN_VERSION, f"v={m.get('v')!r}")
    return m


def _decode_hello(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    return Hello(rank, gen, _int(m, "pid"), _opt_int(m, "stack_signal"))


def _decode_section(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    op = _enum(SectionOp, m.get("op"), "op")
    name = _str(m, "name", optional=op is SectionOp.CLOSE_ALL)
    return Section(rank, gen, op, name, _opt_int(m, "iteration"), _bool(m, "failed"))


def _bool(m: dict[str, Any], key: str) -> bool:
    value = m.get(key, False)
    if not isinstance(value, bool):
        raise Dropped(DropReason.MALFORMED, f"{key} must be true or false")
    return value


MAX_SECTIONS = 64


def _decode_calculate(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    raw = m.get("sections")
    if raw is not None and (
        not isinstance(raw, list)
        or len(raw) > MAX_SECTIONS
        or not all(isinstance(x, str) and len(x) <= 256 for x in raw)
    ):
        raise Dropped(DropReason.MALFORMED, f"sections must be null or at most {MAX_SECTIONS} names")
    return Calculate(
        rank, gen, _str(m, "id", limit=64) or "", _bool(m, "heartbeat"),
        None if raw is None else tuple(raw), _bool(m, "sections_too"), _bool(m, "out_of_section"),
    )  # fmt: skip


MAX_STEP_SECONDS = 86400.0  # a step timing beyond a day is no timing


def _duration(m: dict[str, Any], key: str) -> float:
    value = m.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_STEP_SECONDS:
        # NaN and infinities fail the comparison too
        said = str(value)[:32]
        raise Dropped(DropReason.BAD_TIMING, f"{key} {said!r}: expected seconds, 0 to {MAX_STEP_SECONDS:g}")
    return float(value)


def _decode_timing(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    return Timing(rank, gen, _duration(m, "work"), _duration(m, "wait"))


def _decode_checkpoint(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    event = m.get("event")
    if event not in ("loaded", "saved"):
        raise Dropped(DropReason.MALFORMED, "event must be 'loaded' or 'saved'")
    return Checkpoint(rank, gen, str(event))


def _decode_timeouts(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    timeouts = m.get("timeouts")
    if not isinstance(timeouts, dict):
        raise Dropped(DropReason.MALFORMED, "timeouts must be an object")
    return LoadTimeouts(rank, gen, timeouts)


def _decode_request(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    action = _enum(RequestAction, m.get("action"), "action")
    reason = _str(m, "reason", optional=True, limit=4096) or ""
    return WorkloadRequest(rank, gen, action, reason, _str(m, "id", optional=True, limit=64))


MAX_TRACEBACK = 64 * 1024
MAX_CAUSES = 8


def _decode_exception(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    causes = m.get("causes", [])
    if (
        not isinstance(causes, list)
        or len(causes) > MAX_CAUSES
        or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) and len(x) <= 4096 for x in c)
            for c in causes
        )
    ):
        raise Dropped(DropReason.MALFORMED, f"causes must be at most {MAX_CAUSES} [type, message] pairs")
    return ExceptionReport(
        rank,
        gen,
        _str(m, "exc_type") or "",
        _str(m, "message", limit=4096) or "",
        _str(m, "traceback", limit=MAX_TRACEBACK) or "",
        tuple((c[0], c[1]) for c in causes),
        _opt_int(m, "pid"),
    )


def _decode_saved(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    ok, seconds = m.get("ok"), m.get("seconds")
    if not isinstance(ok, bool):
        raise Dropped(DropReason.MALFORMED, "ok must be true or false")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise Dropped(DropReason.MALFORMED, "seconds must be a number >= 0")
    return Saved(
        rank, gen, _str(m, "id", limit=64) or "", ok, _str(m, "error", optional=True, limit=4096) or "",
        float(seconds),
    )  # fmt: skip


MAX_SNAPSHOT_BYTES = 1 << 44  # 16 TiB: beyond any host's memory (the budget bounds it further)
MAX_SNAPSHOT_STEP = (1 << 63) - 1
_HEX = frozenset("0123456789abcdefABCDEF")


def _bounded(m: dict[str, Any], key: str, low: int, high: int) -> int:
    value = _int(m, key)
    if not low <= value <= high:
        raise Dropped(DropReason.MALFORMED, f"{key} {value}: expected {low} to {high}")
    return value


def _decode_snapshot_begin(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    slot, nbytes = _bounded(m, "slot", 0, 1), _bounded(m, "bytes", 1, MAX_SNAPSHOT_BYTES)
    return SnapshotBegin(rank, gen, _str(m, "id", limit=64) or "", slot, nbytes)


def _decode_snapshot_done(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    checksum = _str(m, "checksum", limit=16) or ""
    if not checksum or not _HEX.issuperset(checksum):
        raise Dropped(DropReason.MALFORMED, "checksum must be 1 to 16 hex digits (xxh3_64)")
    return SnapshotDone(
        rank, gen, _bounded(m, "slot", 0, 1), _bounded(m, "step", 0, MAX_SNAPSHOT_STEP),
        _bounded(m, "bytes", 1, MAX_SNAPSHOT_BYTES), checksum.lower(),
    )  # fmt: skip


RESUME_SOURCES = frozenset({"memory", "disk", "none"})


def _decode_resumed(m: dict[str, Any], rank: int, gen: int) -> RankMessage:
    source = _str(m, "source", limit=16)
    if source not in RESUME_SOURCES:
        raise Dropped(DropReason.MALFORMED, "source must be memory, disk or none")
    step = None if m.get("step") is None else _bounded(m, "step", 0, MAX_SNAPSHOT_STEP)
    return Resumed(rank, gen, source, step, _str(m, "why", optional=True, limit=400) or "")


_DECODERS: dict[str, Callable[[dict[str, Any], int, int], RankMessage]] = {
    "hello": _decode_hello,
    "heartbeat": lambda m, rank, gen: Heartbeat(rank, gen),
    "section": _decode_section,
    "iteration": lambda m, rank, gen: Iteration(rank, gen, _int(m, "iteration")),
    "timing": _decode_timing,
    "checkpoint": _decode_checkpoint,
    "timeouts": _decode_timeouts,
    "calculate": _decode_calculate,
    "checkpoint_interval": lambda m, rank, gen: AdviceQuery(rank, gen, _str(m, "id", limit=64) or ""),
    "request": _decode_request,
    "exception": _decode_exception,
    "bye": lambda m, rank, gen: Bye(rank, gen),
    "saver": lambda m, rank, gen: SaverReady(
        rank, gen, _int(m, "pid"), _str(m, "id", optional=True, limit=64)
    ),
    "saved": _decode_saved,
    "nvrx": lambda m, rank, gen: NvrxServed(rank, gen, _str(m, "version", optional=True, limit=64)),
    "snapshot_begin": _decode_snapshot_begin,
    "snapshot_done": _decode_snapshot_done,
    "snapshot_restore": lambda m, rank, gen: SnapshotRestore(rank, gen, _str(m, "id", limit=64) or ""),
    "resumed": _decode_resumed,
}


def decode_rank_message(payload: bytes) -> RankMessage:
    return decode_signed(payload)[0]


def decode_signed(payload: bytes) -> tuple[RankMessage, str | None]:
    """The message and the key it carries (``k``: the sending rank's, or None)."""
    m = _envelope(payload)
    kind = m.get("type")
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise Dropped(DropReason.UNKNOWN_TYPE, f"type={kind!r}")
    message: RankMessage = decoder(m, _int(m, "rank"), _int(m, "gen"))
    key = m.get("k")
    return message, key if isinstance(key, str) else None


def encode(kind: str, **fields: Any) -> bytes:
    return orjson.dumps({"v": VERSION, "type": kind, **fields})


# -- control ---------------------------------------------------------------------------

CONTROL_COMMANDS = ("status", "stop", "restart")


@dataclass(frozen=True, slots=True)
class ControlRequest:
    command: str
    id: str | None


def decode_control(payload: bytes) -> ControlRequest:
    m = _envelope(payload)
    command = m.get("type")
    if command not in CONTROL_COMMANDS:
        raise Dropped(DropReason.UNKNOWN_TYPE, f"type={command!r}")
    return ControlRequest(str(command), _str(m, "id", optional=True, limit=128))


def reply(request_id: str | None, *, ok: bool, data: Any = None, error: str | None = None) -> bytes:
    return orjson.dumps({"v": VERSION, "id": request_id, "ok": ok, "data": data, "error": error})
