"""Reverse DNS on this node, timed once at start, beside the launch.

torch's store sockets name every peer that connects with ``getnameinfo``: the
rendezvous store, and each rank's ``init_process_group`` store, on both ends of every
connection (seen with strace: a PTR query per end). The stores listen on ``[::]``,
so a rank on 127.0.0.1 is ``::ffff:127.0.0.1`` to them, which many /etc/hosts files
lack. Where the name server then answers slowly or not at all, every connection
waits for the resolver's timeout (glibc's default: 5 s), and a store host serves
nobody meanwhile; torch stops looking names up only after a lookup fails, never
after a slow one. The job shows it as a start or a restart seconds slower than it
should be, with nothing in any log: so the daemon times the same lookups and says so.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from supervisor.clock import SYSTEM
from supervisor.core.catalogue.services import ReverseDnsChecked, ReverseDnsSlow
from supervisor.core.types import EventSink
from supervisor.process.orphans import off_loop

# A name server answers in milliseconds, /etc/hosts in microseconds; a second is a
# timeout and a retry, not a slow network.
SLOW = 1.0
# Each lookup is abandoned after this (glibc retries a silent server: 2 x 5 s).
BOUND = 12.0
LOOPBACK = "::ffff:127.0.0.1"  # a local rank, as a store listening on [::] sees it


def as_store_peer(address: str) -> str | None:
    """How a store listening on ``[::]`` sees a peer on another node connecting from
    ``address``; None for one no other node connects from (loopback, link-local)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_loopback or ip.is_link_local:
        return None
    return f"::ffff:{ip}" if ip.version == 4 else str(ip)


def node_addresses(local_addr: str | None) -> list[str]:
    """The addresses other nodes' stores would look up for this one (blocking: a thread's)."""
    try:
        infos = socket.getaddrinfo(local_addr or socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    found = (as_store_peer(str(info[4][0])) for info in infos)
    return [a for a in dict.fromkeys(found) if a is not None]


def lookup(address: str, clock: Callable[[], float] = SYSTEM.monotonic) -> tuple[str, float]:
    """The outcome of the lookup torch's store would make for ``address``, and its
    seconds, timed in the thread that waits on it: a busy loop is not a slow resolver
    (blocking: a thread's)."""
    began = clock()
    try:
        name = socket.getnameinfo((address, 0, 0, 0), socket.NI_NUMERICSERV)[0]
        outcome = f"named {name}" if name != address else "no name"
    except (OSError, UnicodeError) as exc:
        outcome = f"failed: {exc}"
    return outcome, clock() - began


def fix_for(address: str) -> str:
    name = "localhost" if address == LOOPBACK else socket.gethostname()
    return f"give it a name: '{address} {name}' in /etc/hosts, or a PTR record"


def verdict(address: str, seconds: float, outcome: str) -> dict[str, Any]:
    """One lookup's record; ``slow`` when a store connection would wait on it."""
    return {"address": address, "seconds": round(seconds, 3), "outcome": outcome, "slow": seconds >= SLOW}


async def check_reverse_dns(
    events: EventSink,
    *,
    multinode: bool,
    local_addr: str | None = None,
    bound: float = BOUND,
    clock: Callable[[], float] = SYSTEM.monotonic,
) -> list[dict[str, Any]]:
    """Time each lookup off the loop (the local ranks' address; on several nodes, this
    node's as the others see it); ``reverse_dns_slow`` for each slow one, then
    ``reverse_dns_checked`` with all of them. Never raises for the resolver's sake."""
    addresses = [LOOPBACK]
    if multinode:
        with contextlib.suppress(TimeoutError):
            addresses += await off_loop(functools.partial(node_addresses, local_addr), bound)
    records = []
    for address in addresses:
        try:
            outcome, seconds = await off_loop(functools.partial(lookup, address, clock), bound)
        except TimeoutError:
            outcome, seconds = f"no answer in {bound:g} s", bound
        record = verdict(address, seconds, outcome)
        records.append(record)
        if record["slow"]:
            events.emit(ReverseDnsSlow(address=address, seconds=record["seconds"], outcome=outcome,
                                       fix=fix_for(address)))  # fmt: skip
    events.emit(ReverseDnsChecked(lookups=records))
    return records
