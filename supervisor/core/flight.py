"""What NCCL's Flight Recorder says about a hang, read from its dump.

torch's ProcessGroupNCCL keeps a ring of each process group's last collectives
(``TORCH_NCCL_TRACE_BUFFER_SIZE``) and, asked through its pipe, dumps it: a dict of
``pg_config`` (each group's ranks), ``pg_status`` (the last collective enqueued,
started and completed, by sequence number) and ``entries`` (one per collective:
``profiling_name``, ``collective_seq_id``, ``state`` scheduled/started/completed,
sizes, the Python frames that issued it). The raw dump is kept in the bundle; this
is the part an operator reads first: per group, how far the rank got and the oldest
collective it has not finished, with the user's line that issued it. Across the
node's ranks, one that enqueued fewer collectives in a group than its peers is
behind: the others wait for a collective it never issued (torch's fr_trace analysis
makes the same comparison across the whole job).

Pure: the dump comes in as a value (``supervisor.process.native`` reads the file).
Anything malformed is skipped, never raised: a dump is evidence, not input we trust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# where no watchdog answers the debug-info pipe (gloo), the rank's client does, on a FIFO
# of its own beside it (supervisor.client.flight); a dump it cannot make is a pickle of
# {NO_DUMP: why}
OWN_PIPE_SUFFIX = ".fr.pipe"
NO_DUMP = "ft_supervisor_no_dump"
FRAMEWORK = ("/torch/", "/site-packages/", "/dist-packages/", "supervisor/process/bootstrap.py", "<frozen")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _where(frames: Any) -> str | None:
    """The innermost frame of the user's own code that issued the collective."""
    if not isinstance(frames, Sequence):
        return None
    for frame in frames:
        if not isinstance(frame, Mapping):
            continue
        name, line, func = frame.get("filename"), frame.get("line"), frame.get("name")
        if isinstance(name, str) and not any(part in name for part in FRAMEWORK):
            return f"{name}:{line} {func}"
    return None


def _pending(entries: Sequence[Any], pg: str) -> dict[str, Any] | None:
    """The oldest collective of group ``pg`` not seen completed."""
    oldest: tuple[int, Mapping[str, Any]] | None = None
    for e in entries:
        if not isinstance(e, Mapping) or e.get("state") == "completed" or e.get("is_p2p"):
            continue
        group = e.get("process_group")
        name = group[0] if isinstance(group, Sequence) and group and not isinstance(group, str) else group
        seq = _int(e.get("collective_seq_id"))
        if str(name) != pg or seq is None:
            continue
        if oldest is None or seq < oldest[0]:
            oldest = (seq, e)
    if oldest is None:
        return None
    seq, e = oldest
    op = e.get("profiling_name")
    return {
        "seq": seq,
        "op": op.removeprefix("nccl:") if isinstance(op, str) else None,
        "state": e.get("state") if isinstance(e.get("state"), str) else None,
        "sizes": e.get("input_sizes") if isinstance(e.get("input_sizes"), list) else None,
        "issued_at": _where(e.get("frames")),
    }


def summarize(dump: Any) -> list[dict[str, Any]]:
    """Per process group: its description and ranks, the last collective enqueued,
    started and completed, and the oldest one not completed (None: all were)."""
    if not isinstance(dump, Mapping):
        return []
    config, status, entries = dump.get("pg_config"), dump.get("pg_status"), dump.get("entries")
    config = config if isinstance(config, Mapping) else {}
    entries = entries if isinstance(entries, list) else []
    out = []
    for pg, st in status.items() if isinstance(status, Mapping) else ():
        if not isinstance(st, Mapping):
            continue
        cfg = config.get(pg)
        cfg = cfg if isinstance(cfg, Mapping) else {}
        out.append(
            {
                "group": str(pg),
                "desc": cfg.get("desc") if isinstance(cfg.get("desc"), str) else None,
                "ranks": cfg.get("ranks") if isinstance(cfg.get("ranks"), str) else None,
                "enqueued": _int(st.get("last_enqueued_collective")),
                "started": _int(st.get("last_started_collective")),
                "completed": _int(st.get("last_completed_collective")),
                "pending": _pending(entries, str(pg)),
            }
        )
    return out


def enqueued(groups: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """From one rank's summary: the collectives it enqueued, by process group."""
    return {str(g.get("group")): n for g in groups if isinstance(n := g.get("enqueued"), int)}


def behind(enqueued: Mapping[int, Mapping[str, int]]) -> dict[str, tuple[list[int], int, int]]:
    """By process group: the ranks (of those given, by rank) that enqueued fewer
    collectives than another rank of the group, the fewest and the most; only the
    groups where they differ."""
    counts: dict[str, dict[int, int]] = {}
    for rank, groups in enqueued.items():
        for group, n in groups.items():
            counts.setdefault(group, {})[rank] = n
    found = {}
    for group, by_rank in sorted(counts.items()):
        most = max(by_rank.values())
        late = sorted(r for r, n in by_rank.items() if n < most)
        if late:
            found[group] = (late, min(by_rank.values()), most)
    return found
