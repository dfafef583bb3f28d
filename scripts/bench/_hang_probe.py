"""A rank for scripts/bench/hang.py (no torch): run by ``ft-supervisor run --preload none``.

_hang_probe.py cost OUT.json [--calls N] [--warmup N] [--gap-us G]
    times client.heartbeat(), a monitored section open+close pair, an unmonitored
    one, and the floor (a raw pyzmq DEALER of its own sending prebuilt orjson bytes
    to the daemon's socket, NOBLOCK) with time.perf_counter_ns around each call,
    paced (a --gap-us sleep before each) and back-to-back (blocks of --burst
    calls); writes the raw samples.
_hang_probe.py hang OUT.jsonl --kind heartbeat|section [--interval S] [--hang-after S]
    heartbeats (or opens and closes ``step``) every --interval for --hang-after
    seconds, appends when its last sign of life left (time.time()), then hangs
    in time.sleep until it is killed. Every generation does the same.
_hang_probe.py load OUT_PREFIX [--rate R] [--duration S] [--release FILE]
    heartbeats R times a second for S seconds (R = 0: none, only connected),
    writes OUT_PREFIX.rank<N>.json, then waits without heartbeats for --release
    to appear (at most --release-timeout s), and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time
from pathlib import Path

import orjson
import zmq

from supervisor import client
from supervisor.core.topology import ENV_RANKS_ENDPOINT

RANK = int(os.environ.get("RANK", "0"))
GENERATION = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def client_dropped() -> int:
    c = client._held.client
    return -1 if c is None else c.channel.dropped


KINDS = ("timer", "heartbeat", "section", "unmonitored_section", "floor_send", "floor_dumps_send")


def cost(args: argparse.Namespace) -> None:
    if not client.init():
        raise SystemExit("no ft-supervisor daemon: run me under `ft-supervisor run`")
    held = client._held.client
    monitored = held is not None and "step" in held.monitored
    # The floor: a raw DEALER of our own, with the client's options, to the same
    # daemon socket (the daemon counts what it sends as this rank's heartbeats).
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, 10_000)
    dealer.connect(os.environ[ENV_RANKS_ENDPOINT])
    message = {"v": 1, "type": "heartbeat", "rank": RANK, "gen": GENERATION}
    prebuilt = orjson.dumps(message)
    floor_dropped = 0

    def floor_send(payload: bytes) -> None:
        nonlocal floor_dropped
        try:
            dealer.send(payload, zmq.NOBLOCK)
        except zmq.ZMQError:
            floor_dropped += 1

    clock = time.perf_counter_ns

    def one(kind: str) -> int:
        if kind == "timer":
            t0 = clock()
        elif kind == "heartbeat":
            t0 = clock()
            client.heartbeat()
        elif kind == "section":
            t0 = clock()
            client.start_section("step")
            client.end_section("step")
        elif kind == "unmonitored_section":
            t0 = clock()
            client.start_section("not_monitored")
            client.end_section("not_monitored")
        elif kind == "floor_send":
            t0 = clock()
            floor_send(prebuilt)
        else:
            t0 = clock()
            floor_send(orjson.dumps(message))
        return clock() - t0

    gap_s = args.gap_us / 1e6
    dropped: dict[str, dict[str, int]] = {}  # regime -> client / floor -> sends dropped (queue full)

    def drops() -> tuple[int, int]:
        return client_dropped(), floor_dropped

    # paced: a pause before every call (as in training, each send finds the
    # socket idle); kinds interleaved, so that every kind sees the same moments of a busy machine
    paced: dict[str, list[int]] = {k: [] for k in KINDS}
    order = list(KINDS)
    shuffle = random.Random(0).shuffle
    before = drops()
    gc.collect()
    for i in range(args.warmup + args.calls):
        shuffle(order)  # no kind always follows the same one
        for kind in order:
            time.sleep(gap_s)
            ns = one(kind)
            if i >= args.warmup:
                paced[kind].append(ns)
    after = drops()
    dropped["paced"] = {"client": after[0] - before[0], "floor": after[1] - before[1]}
    time.sleep(0.5)
    # burst: back-to-back calls of one kind, in blocks of --burst calls with a
    # pause between them in which the daemon drains its queue: no send finds it full
    burst: dict[str, list[int]] = {k: [] for k in KINDS}
    before = drops()
    for kind in KINDS:
        gc.collect()
        done = 0
        while done < args.warmup + args.calls:
            for _ in range(min(args.burst, args.warmup + args.calls - done)):
                ns = one(kind)
                if done >= args.warmup:
                    burst[kind].append(ns)
                done += 1
            time.sleep(args.burst_pause)
    after = drops()
    dropped["burst"] = {"client": after[0] - before[0], "floor": after[1] - before[1]}
    result = {
        "rank": RANK,
        "generation": GENERATION,
        "pid": os.getpid(),
        "calls": args.calls,
        "warmup": args.warmup,
        "gap_us": args.gap_us,
        "step_monitored": monitored,
        "burst": args.burst,
        "dropped": dropped,
        "message_bytes": len(prebuilt),
        "paced_ns": paced,
        "burst_ns": burst,
    }
    dealer.close(linger=0)
    ctx.term()
    Path(args.out).write_text(json.dumps(result))


def hang(args: argparse.Namespace) -> None:
    if not client.init():
        raise SystemExit("no ft-supervisor daemon: run me under `ft-supervisor run`")
    end = time.monotonic() + args.hang_after
    sent = 0
    if args.kind == "heartbeat":
        while True:
            client.heartbeat()
            last = time.time()
            sent += 1
            if time.monotonic() >= end:
                break
            time.sleep(args.interval)
    else:
        while time.monotonic() < end:
            client.start_section("step")
            time.sleep(args.interval)
            client.end_section("step")
            sent += 2
        client.start_section("step")  # ... and never close it
        last = time.time()
        sent += 1
    line = {
        "rank": RANK,
        "generation": GENERATION,
        "kind": args.kind,
        "last_t": last,
        "sent": sent,
        "client_dropped": client_dropped(),
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(line) + "\n")
    while True:  # hung: the daemon must notice, dump our stacks and kill us
        time.sleep(3600)


def load(args: argparse.Namespace) -> None:
    if not client.init():
        raise SystemExit("no ft-supervisor daemon: run me under `ft-supervisor run`")
    period = 1.0 / args.rate if args.rate > 0 else args.duration
    sent = 0
    t_start = time.time()
    start = next_at = time.monotonic()
    end = start + args.duration
    late_max = 0.0
    if args.rate <= 0:  # the idle baseline: connected (hello sent), silent
        next_at = end
        time.sleep(args.duration)
    while next_at < end:
        now = time.monotonic()
        if next_at > now:
            time.sleep(next_at - now)
        else:
            late_max = max(late_max, now - next_at)
        client.heartbeat()
        sent += 1
        next_at += period
    t_end = time.time()
    result = {
        "rank": RANK,
        "generation": GENERATION,
        "pid": os.getpid(),
        "t_start": t_start,
        "t_end": t_end,
        "sent": sent,
        "rate": args.rate,
        "schedule_late_max_s": late_max,
        "client_dropped": client_dropped(),
    }
    out = Path(f"{args.out}.rank{RANK}.json")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    if args.release:
        deadline = time.monotonic() + args.release_timeout
        while not Path(args.release).exists() and time.monotonic() < deadline:
            time.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["cost", "hang", "load"])
    p.add_argument("out")
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--gap-us", type=float, default=200.0, help="paced: sleep before each call")
    p.add_argument("--burst", type=int, default=1000, help="back-to-back: calls per block")
    p.add_argument("--burst-pause", type=float, default=0.1, help="back-to-back: s between blocks")
    p.add_argument("--kind", choices=["heartbeat", "section"], default="heartbeat")
    p.add_argument("--interval", type=float, default=0.01)
    p.add_argument("--hang-after", type=float, default=0.3)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--release", default=None)
    p.add_argument("--release-timeout", type=float, default=20.0)
    args = p.parse_args()
    {"cost": cost, "hang": hang, "load": load}[args.mode](args)


if __name__ == "__main__":
    main()
