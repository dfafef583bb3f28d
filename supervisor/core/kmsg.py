"""The kernel's log as /dev/kmsg hands it out: one record per read,
``PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];TEXT`` then continuation lines
(`` KEY=value``, dropped here). Pure: bytes in, a line out."""

from __future__ import annotations

from dataclasses import dataclass

TEXT_MAX = 512  # characters of a kernel line kept: an Xid line is under 200


@dataclass(frozen=True, slots=True)
class KernelLine:
    seq: int
    at: float  # seconds since boot (the kernel's clock; CLOCK_MONOTONIC in practice)
    text: str


def parse_record(raw: bytes) -> KernelLine | None:
    """One record, or None for anything that is not one."""
    header, sep, body = raw.partition(b";")
    if not sep:
        return None
    fields = header.split(b",")
    if len(fields) < 3:
        return None
    try:
        seq, micros = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    text = body.split(b"\n", 1)[0].decode("utf-8", "replace")
    return KernelLine(seq, micros / 1e6, text[:TEXT_MAX])
