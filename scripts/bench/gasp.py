"""Dying-gasp benchmark: what asking ranks to save costs a restart.

    .venv/bin/python scripts/bench/gasp.py [--runs 5] [--nproc 2] [--out DIR]

Two ranks (no torch, ``--preload none``); in generation 0 rank 1 exits 1 once
every rank is up, and the daemon restarts (``--max-restarts 1``). Three variants:
no save callback; a callback that writes and fsyncs 1 MiB; the same with 64 MiB.
Figures, medians over ``--runs``: the save round trip as the daemon saw it
(``save_finished.seconds``: "save now" sent -> every answer in), and the
restart's critical path, from rank 1's failure (its ``rank_exited`` event) to
generation 1 started (``generation_started``), both on the daemon's monotonic
clock. The difference between the variants is what the dying gasp adds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import Launcher, fmt, median, read_jsonl

HERE = Path(__file__).resolve().parent
FT = str(Path(sys.executable).parent / "ft-supervisor")
VARIANTS = [("no callback", 0, "none"), ("callback, 1 MiB", 1 << 20, "callback"),
            ("callback, 64 MiB", 64 << 20, "callback")]  # fmt: skip


def one(out: Path, nproc: int, size: int, mode: str) -> tuple[float | None, float | None]:
    out.mkdir(parents=True)
    argv = [FT, "run", "--nproc-per-node", str(nproc), "--preload", "none", "--max-restarts", "1",
            "--log-dir", str(out / "logs"), "--rdzv-id", "gasp",
            str(HERE / "_gasp_rank.py"), str(out), str(size), mode]  # fmt: skip
    launcher = Launcher(argv, out)
    launcher.start()
    launcher.finish(time.monotonic() + 60)
    if launcher.run.exit_code != 0:
        print(f"run in {out} failed: exit {launcher.run.exit_code}", file=sys.stderr)
        return None, None
    events = read_jsonl(next((out / "logs" / "gasp").glob("*/events.jsonl")))
    failed = next(e["t_mono"] for e in events if e["event"] == "rank_exited" and e["state"] == "failed")
    started = next(e["t_mono"] for e in events if e["event"] == "generation_started" and e["generation"] == 1)
    saves = [e["seconds"] for e in events if e["event"] == "save_finished"]
    return (saves[0] if saves else None), started - failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-gasp-"))
    rows = []
    for name, size, mode in VARIANTS:
        results = [one(out / f"{mode}-{size}-{i}", args.nproc, size, mode) for i in range(args.runs)]
        saves = [s for s, _ in results if s is not None]
        restarts = [r for _, r in results if r is not None]
        rows.append((name, median(saves), median(restarts), len(restarts)))
    base = rows[0][2]
    print("| save callback | save round trip, median | failure -> generation 1 started, median | "
          "added vs no callback | runs ok |\n|---|---|---|---|---|")  # fmt: skip
    for name, save, restart, ok in rows:
        added = None if restart is None or base is None else restart - base
        save_ms = "n/a" if save is None else f"{fmt(save * 1000, 1)} ms"
        restart_ms = "n/a" if restart is None else f"{fmt(restart * 1000, 1)} ms"
        added_ms = "n/a" if added is None else f"{fmt(added * 1000, 1)} ms"
        print(f"| {name} | {save_ms} | {restart_ms} | {added_ms} | {ok}/{args.runs} |")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
