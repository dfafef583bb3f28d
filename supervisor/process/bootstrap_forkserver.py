"""The bootstrap's ``fork-server`` mode: the node's fork server, and each rank it forks.

With ``fork-server`` in its FLAGS the bootstrap (``supervisor/process/bootstrap.py``)
is not a rank but the node's fork server: after its preload it says ``ready`` and
then serves fork requests on BOOT_FD, one datagram each (the JSON of the rank's
environment and cgroup, and three descriptors: the rank's boot channel, stdout and
stderr). Each rank is a grandchild (fork, fork, the middle one exits) so that it is
reparented to the daemon, its subreaper, which then waits for it like any child. The
rank takes its own session, files, environment and cgroup, arms PDEATHSIG on the
daemon, says ``pid N`` on its boot channel and goes on at the bootstrap's step 3
with the preload already paid: a node imports torch once, not once per rank per
generation. EOF on BOOT_FD ends the server.

The bootstrap loads this file by its path, and only in that mode: a spawned rank
never pays for it. Standard library only, like the bootstrap; the bootstrap's own
steps (joining the cgroup, dying with the daemon, the open-files limit) are handed
in, so that nothing here imports the bootstrap back.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable


def serve_forks(
    fd: int,
    parent_pid: int,
    *,
    join: Callable[[str], None],
    die_with_parent: Callable[[int], None],
    restore_descriptors: Callable[[], None],
) -> int:
    """The fork server's loop (see the module's docstring). Returns only in a forked
    rank, with its boot channel; the server itself exits at EOF."""
    import socket  # noqa: PLC0415

    sys.stdout.flush()
    sys.stderr.flush()
    server = socket.socket(fileno=fd)
    server.setblocking(True)
    device = _device_initialised()
    if device:
        # a fork cannot inherit a device context: CUDA refuses to run in the child
        server.sendall(f"unforkable {device}\n".encode())
        os._exit(0)
    server.sendall(b"ready\n")
    import gc  # noqa: PLC0415

    while True:
        # What the preload built is never garbage: out of the collector's sight, a rank's
        # collections leave those pages shared instead of copying them (CPython's advice
        # for a process that forks without exec)
        gc.freeze()
        try:
            msg, fds, _, _ = socket.recv_fds(server, 1 << 20, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            os._exit(0)
        if len(fds) != 3:
            for f in fds:
                os.close(f)
            continue
        middle = os.fork()
        if middle == 0:
            server.close()
            if os.fork() != 0:
                os._exit(0)  # the rank is orphaned at once: the daemon adopts it
            return _become_rank(
                json.loads(msg),
                fds,
                parent_pid,
                join=join,
                die_with_parent=die_with_parent,
                restore_descriptors=restore_descriptors,
            )
        for f in fds:
            os.close(f)
        try:  # noqa: SIM105 - contextlib is one import more, for one line
            os.waitpid(middle, 0)
        except ChildProcessError:
            pass


def _device_initialised() -> str:
    """The accelerator the preload initialised in this process (``cuda``...), or ""."""
    torch = sys.modules.get("torch")
    for name in ("cuda", "xpu"):
        backend = getattr(torch, name, None)
        try:
            if backend is not None and backend.is_initialized():
                return name
        except Exception:  # noqa: S112 - a backend that cannot say has not been set up by us
            continue
    return ""


def _become_rank(
    request: dict[str, object],
    fds: list[int],
    parent_pid: int,
    *,
    join: Callable[[str], None],
    die_with_parent: Callable[[int], None],
    restore_descriptors: Callable[[], None],
) -> int:
    import time  # noqa: PLC0415

    boot, out, err = fds
    os.setsid()  # its own session and process group, as a spawned rank has
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
        os.close(source)
    env = request.get("env")
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {})
    join(str(request.get("cgroup") or ""))
    deadline = time.monotonic() + 10.0
    while os.getppid() != parent_pid and time.monotonic() < deadline:
        time.sleep(0.001)  # the middle process is exiting; the daemon adopts us then
    die_with_parent(parent_pid)
    restore_descriptors()
    # What a fresh interpreter would have drawn anew (the random module reseeds itself)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    os.write(boot, f"pid {os.getpid()}\n".encode())
    return boot
