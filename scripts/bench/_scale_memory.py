"""What one node's daemon costs in memory and start-up, alone and in a 2-node job (scale.py --memory).

Each daemon runs one rank that waits to be stopped (``tests/fixtures/ranks/fails.py
--rank 9``), no standby ranks. Multi-node: two daemons over torch's c10d rendezvous,
the store hosted here. Read from /proc: RSS, PSS (shared pages split between the
processes mapping them: the ranks map the same libtorch) and USS (private pages:
what the daemon alone frees by exiting), once the job has formed ("start") and
``--rest`` s later ("rest"), and the peak RSS. Start-up is the daemon's start to its
first rank spawned (single node) or to the rendezvous joined (multi-node). For
comparison, the same for a Python that imports only what our rendezvous needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ft_event_log, read_jsonl, read_status_kb

REPO = Path(__file__).resolve().parents[2]
RANK = REPO / "tests" / "fixtures" / "ranks" / "fails.py"
REST = 10.0
IMPORTS = (
    "import time, torch.distributed as d, torch.distributed.elastic.rendezvous.dynamic_rendezvous, "
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend; print('ready', flush=True); time.sleep(60)"
)


def smaps(pid: int) -> dict[str, float]:
    """MiB: Rss, Pss and Uss (private clean + dirty) of ``pid``."""
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        kb[name] = int(value.split()[0])
    return {
        "rss": kb["Rss"] / 1024,
        "pss": kb["Pss"] / 1024,
        "uss": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024,
    }


def _wait_event(log_dir: Path, event: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = ft_event_log(log_dir)
        if path is not None:
            hits = [e for e in read_jsonl(path) if e.get("event") == event]
            if hits:
                return hits[0]
        time.sleep(0.05)
    raise TimeoutError(f"no {event} in {log_dir} within {timeout} s")


def _daemons(tmp: Path, nodes: int, port: int | None) -> list[dict[str, Any]]:
    procs, logs, started = [], [], []
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO), "OMP_NUM_THREADS": "1"}
    for i in range(nodes):
        log_dir = tmp / f"n{nodes}-{i}"
        multi = [] if port is None else [
            "--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "mem", "--local-addr", "127.0.0.1", "--rdzv-conf", "is_host=0,last_call_timeout=1",
        ]  # fmt: skip
        cmd = [sys.executable, "-m", "supervisor", "run", "--nproc-per-node", "1", "--no-standby",
               "--log-dir", str(log_dir), *multi, str(RANK), "--rank", "9"]  # fmt: skip
        started.append(time.time())
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))  # fmt: skip
        logs.append(log_dir)
    try:
        event = "rank_spawned" if port is None else "rendezvous_joined"
        ready = [_wait_event(d, event, 120) for d in logs]
        at_start = [smaps(p.pid) for p in procs]
        time.sleep(REST)
        at_rest = [smaps(p.pid) for p in procs]
        peak = [read_status_kb(p.pid, "VmHWM").get("VmHWM", 0) / 1024 for p in procs]
        return [
            {"startup_s": e["t_wall"] - t0, "start": s, "rest": r, "peak_rss": pk}
            for e, t0, s, r, pk in zip(ready, started, at_start, at_rest, peak, strict=True)
        ]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def _imports_only() -> dict[str, Any]:
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", IMPORTS], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        return {"startup_s": time.time() - t0, "start": smaps(proc.pid)}
    finally:
        proc.kill()
        proc.wait(10)


def memory() -> str:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # noqa: PLC0415 - the store we host

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="ft-scale-mem-") as tmp:
        single = _daemons(Path(tmp), 1, None)
        multi = _daemons(Path(tmp), 2, store.port)
    base = _imports_only()
    rows = [
        "| daemon | start-up s | RSS MiB start / rest | PSS MiB start / rest | USS MiB start / rest "
        "| peak RSS MiB |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in (("single node", single), ("2-node job (each)", multi)):
        for r in runs[:1] if name == "single node" else runs:
            rows.append(
                f"| {name} | {r['startup_s']:.2f} | {r['start']['rss']:.0f} / {r['rest']['rss']:.0f} "
                f"| {r['start']['pss']:.0f} / {r['rest']['pss']:.0f} "
                f"| {r['start']['uss']:.0f} / {r['rest']['uss']:.0f} | {r['peak_rss']:.0f} |"
            )
    rows.append(
        f"| python importing torch's rendezvous only | {base['startup_s']:.2f} | {base['start']['rss']:.0f} "
        f"| {base['start']['pss']:.0f} | {base['start']['uss']:.0f} | |"
    )
    return "\n".join(rows)
