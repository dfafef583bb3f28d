"""Which log lines are worth keeping as evidence: a literal keyword prefilter.

Every line a built-in rule can match contains one of these keywords (a test
holds the rules and the golden corpus to it), so a log of any size is reduced
to its candidate lines by plain substring search on the lower-cased text, at
memchr speed. A joined regex of every rule ran at about 1 MB/s, an alternation
of these keywords at about 10 MB/s; ``str.find`` per keyword at about 40 MB/s.
The live scanner (``supervisor.process.tail``) and ``ft-supervisor classify``
use the same list, so what is kept while a rank runs is what a rule may need.
"""

from __future__ import annotations

from collections.abc import Mapping

KEYWORDS = (
    "error", "exception", "traceback", "fatal", "fail", "abort", "killed", "timeout", "timed out",
    "watchdog", "nccl warn", "xid", "segmentation", "segfault", "out of memory", "oom", "no space left",
    "quota", "preempt", "time limit", "nan", "signal ", "ncclinvalid", "status=", "fallen off",
    "address already in use", "eaddrinuse", "exitcode", "by peer", "closed by", "broken pipe",
    "corrupt", "double free", "tcache", "free(): ", "malloc(): ", "interrupt", "cancelled",
    "process down",
)  # fmt: skip


# What torch prints as it takes a rank down on its own. A rank that said so and is
# still there is failing like one whose error file is written: its teardown is stuck
# (captured on an H200: the abort waited on a GPU kernel for as long as the kernel ran).
# Lower case, as ``is_notable`` reads. The first is said only on the way down; the
# watchdog's own lines mean that only where TORCH_NCCL_ASYNC_ERROR_HANDLING tears the
# process down (1, which the daemon sets unless told otherwise, or 3): with 0 or 2 the
# process lives on, and a program may recover in place (torchft does).
TAKEN_DOWN = ("we are taking the entire process down",)
WATCHDOG_FAILED = (
    "watchdog caught collective operation timeout",
    "watchdog thread terminated with exception",
)
GOING_DOWN = TAKEN_DOWN + WATCHDOG_FAILED

# What a rank says when it waited for its peers past a collective's timeout: NCCL's
# watchdog (rule N1) and gloo's own wait ("Timed out waiting 3000ms for recv operation
# to complete", rule D7). Such a rank witnesses a peer's trouble: its node declares the
# job's incident as a missed deadline does (supervisor.runtime.lifecycle.incident), and
# the job's blame, not this line, says who is to blame. Lower case.
WAITED = ("watchdog caught collective operation timeout",)
GLOO_WAITED, GLOO_OPS = "timed out waiting", ("ms for recv operation", "ms for send operation")


# What a rank says when a peer broke the collective it was in: gloo's size check
# ("Received data size doesn't match expected size": it holds the smaller buffer of a
# mismatch), torch's desync check, a peer's connection going away. Such a rank is a
# witness, not a culprit: its line goes into its node's summary (core.node_summary) and
# the job's blame names the peer. A mismatch line also makes the job's incident (a
# desync is the job's, whichever rank's receive caught it). Lower case.
MISMATCH = (
    "received data size doesn't match expected size",
    "is there a distributed collective mismatch",
    "detected mismatch between collectives on ranks",
)
PEER_WENT = ("connection reset by peer", "connection closed by peer", "connection closed by remote peer")


def says_peer_broke(line: str) -> bool:
    """Does the line blame a peer for the collective the rank was in (a witness)?"""
    low = line.lower()
    return any(k in low for k in MISMATCH) or any(k in low for k in PEER_WENT)


def says_mismatch(line: str) -> bool:
    """Does the line say the ranks' collectives did not match (a desync's witness)?"""
    low = line.lower()
    return any(k in low for k in MISMATCH)


def nccl_tears_down(environ: Mapping[str, str]) -> bool:
    """Does a watchdog failure take the rank's process down, by the environment the
    ranks get (the daemon sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless it is given)?"""
    return environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1").strip() not in ("0", "2")


def is_notable(line: str) -> bool:
    low = line.lower()
    return any(k in low for k in KEYWORDS)


def notable_lines(text: str, keywords: tuple[str, ...] = KEYWORDS) -> list[str]:
    """The lines of ``text`` (complete lines, newline-separated) that hold a keyword
    (lower case; one may end with the newline), in order, each once."""
    low = text.lower()
    if len(low) != len(text):  # a rare Unicode character whose lower case is longer
        return [line for line in text.splitlines() if any(k in f"{line.lower()}\n" for k in keywords)]
    starts: set[int] = set()
    for keyword in keywords:
        i = low.find(keyword)
        while i >= 0:
            start = low.rfind("\n", 0, i) + 1
            starts.add(start)
            end = low.find("\n", i)
            if end < 0:
                break
            i = low.find(keyword, end + 1)
    out = []
    for start in sorted(starts):
        end = text.find("\n", start)
        out.append(text[start : end if end >= 0 else len(text)])
    return out


def says_going_down(line: str, tears_down: bool = True) -> bool:
    """Does the line announce that torch is taking the process down? ``tears_down``:
    whether a watchdog failure does (``nccl_tears_down``)."""
    low = line.lower()
    return any(k in low for k in (GOING_DOWN if tears_down else TAKEN_DOWN))


def says_timed_out_waiting(line: str) -> bool:
    """Does the line say the rank waited in a collective past its timeout (a witness)?"""
    low = line.lower()
    if any(k in low for k in WAITED):
        return True
    return GLOO_WAITED in low and any(k in low for k in GLOO_OPS)
