"""The first code of every rank process: die with the daemon, warm up, wait, run.

The daemon starts each rank as::

    python -u .../supervisor/process/bootstrap.py BOOT_FD PARENT_PID CGROUP PRELOAD FLAGS KIND TARGET [ARG...]

(by path, not ``-m``: it needs nothing but the standard library, so any
``PYTHON_EXEC`` interpreter can run it, installed package or not)

0. Move into the generation's cgroup CGROUP (a directory; empty: none), before
   anything else: every process this rank ever starts is then born inside it,
   and ending the generation kills the cgroup (``supervisor.process.cgroups``).
   A rank that cannot get in does not run: its cgroup is the guarantee that none
   of its descendants outlives the generation.
1. ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this rank the moment the
   daemon dies, even by SIGKILL; no daemon code has to run for that.
2. Import the PRELOAD modules (comma separated, usually ``torch``). ``import
   torch`` is most of a restart's cost, so a standby rank pays it while the
   previous generation is still training. A go that arrives first ends the
   preload after the module being imported: the program imports what it needs
   itself, so a rank that got its go never waits for a module it may not use.
   A standby (FLAGS ``idle``) preloads at SCHED_IDLE, so it takes only CPU time
   the running generation leaves over, but only where it will be allowed back to
   SCHED_OTHER (CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0): a rank must
   never train at idle priority.
3. Say ``ready`` on BOOT_FD and wait for the go: one JSON line with the
   environment values fixed only when the generation starts (MASTER_PORT...).
   Every thread goes back to SCHED_OTHER before the program runs (the daemon
   does that too, right after writing a standby's go: a standby would otherwise
   wake at idle priority to read it, which a busy node may not allow for seconds).
4. Serve NVRx's client from ours: ``import nvidia_resiliency_ext.fault_tolerance``
   (and its ``rank_monitor_client``) in the program resolves to
   ``supervisor.client._nvrx_package`` (NVRx's names over the ft-supervisor
   client, whose messages are JSON: nothing a rank sends is unpickled). NVRx's
   own client needs ft_launcher's rank monitor socket, which no daemon offers.
   Everything else of NVRx stays its own. Where ft-supervisor's client cannot be
   imported (another ``PYTHON_EXEC`` interpreter) NVRx's own loads, and fails as
   it would (rule P0-NVRX says why).
5. Run TARGET the way ``python -u script.py`` / ``python -u -m module`` would
   (KIND ``script`` / ``module``), or exec it (KIND ``exec``, ``--no-python``: a new
   program, which 4 does not reach).
   FLAGS (comma separated): ``fast-exit`` skips the last GC passes at exit;
   ``idle``: a standby, see 2; ``fork-server``: see below.

With ``fork-server`` the process is not a rank but the node's fork server: after 2
it says ``ready`` and then serves fork requests on BOOT_FD, one datagram each (the
JSON of the rank's environment and cgroup, and three descriptors: the rank's boot
channel, stdout and stderr). Each rank is a grandchild (fork, fork, the middle
one exits) so that it is reparented to the daemon, its subreaper, which then
waits for it like any child. The rank takes its own session, files, environment
and cgroup, arms PDEATHSIG on the daemon, says ``pid N`` on its boot channel and
goes on at 3 with the preload already paid: a node imports torch once, not once
per rank per generation. EOF on BOOT_FD ends the server.

Standard library only, and nothing imported here may reach the daemon's modules.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from collections.abc import Iterable

_PR_SET_PDEATHSIG = 1
_CAP_SYS_NICE = 23  # capabilities(7)
_NOFILE_ENV = "FT_SUPERVISOR_NOFILE"  # the open-files limit the daemon was given (see daemon.py)
_NUMA_ENV = "FT_SUPERVISOR_NUMA_BINDING"  # torchrun's --numa-binding mode (core.topology)
# Frames that belong to the launch machinery, not to the user's program.
_LAUNCH_FILES = frozenset({os.path.abspath(__file__), "<frozen runpy>"})


def _join(cgroup: str) -> None:
    if not cgroup:
        return
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")  # "0": the writing process itself
        finally:
            os.close(fd)
    except OSError as exc:
        print(
            f"ft-supervisor: cannot enter the generation's cgroup {cgroup}: {exc.strerror}", file=sys.stderr
        )
        os._exit(1)


def _die_with_parent(parent_pid: int) -> None:
    import ctypes  # noqa: PLC0415 - only the rank pays for it, once

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The daemon may have died between fork and prctl: then nobody will send
    # the death signal, so check by hand once it is armed.
    if os.getppid() != parent_pid:
        os._exit(1)


def may_leave_idle() -> bool:
    """Whether this process may go back from SCHED_IDLE to SCHED_OTHER at nice 0
    (sched(7): CAP_SYS_NICE, or RLIMIT_NICE at least 20, i.e. nice 0 allowed)."""
    import resource  # noqa: PLC0415

    if not hasattr(os, "SCHED_IDLE"):
        return False
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
        return bool(int(caps, 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError):
        return False


def _idle() -> None:
    if may_leave_idle():
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass


def unidle(pid: int | str = "self") -> None:
    """Every thread of ``pid`` back to SCHED_OTHER (threads started while idle inherited it)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            if os.sched_getscheduler(int(tid)) == os.SCHED_IDLE:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
        except (OSError, ValueError):
            pass


def _go_arrived(fd: int) -> bool:
    """The go (or the daemon's EOF) is waiting to be read."""
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _preload(modules: str, fd: int) -> None:
    import importlib  # noqa: PLC0415

    # The preload must be invisible: importing torch._dynamo, for one, writes
    # TORCHINDUCTOR_CACHE_DIR into os.environ. The program starts with the
    # environment it was given; torch re-derives such values when it needs them.
    environ = dict(os.environ)
    for name in filter(None, modules.split(",")):
        if _go_arrived(fd):
            break
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112
            # The script's own import will raise the real error in its own log.
            continue
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)


def _bind_numa() -> None:
    """torchrun's --numa-binding, by torch's own code, as torchrun applies it to a rank:
    every thread's CPUs to those the mode gives the NUMA node of GPU LOCAL_RANK (with
    --virtual-local-rank, LOCAL_RANK 0 is the one GPU the rank sees). Before the go: a
    standby is bound while it waits; an exec'd program inherits the affinity. A failure
    raises, as under torchrun."""
    mode = os.environ.pop(_NUMA_ENV, "")
    if not mode:
        return
    from torch.numa.binding import (  # noqa: PLC0415
        AffinityMode,
        NumaOptions,
        _maybe_apply_numa_binding_to_current_process,
    )

    _maybe_apply_numa_binding_to_current_process(
        gpu_index=int(os.environ.get("LOCAL_RANK", "0")),
        numa_options=NumaOptions(affinity_mode=AffinityMode(mode)),
    )


_NVRX = "nvidia_resiliency_ext.fault_tolerance"
_NVRX_SERVED = "supervisor.client._nvrx_package"
# NVRx's modules that are ours in a rank: name -> whether it is the package
_NVRX_OURS = {_NVRX: True, _NVRX + ".rank_monitor_client": False}


class _NvrxFinder:
    """A meta path finder: NVRx's fault-tolerance client is ours (see 4 above)."""

    @classmethod
    def find_spec(cls, fullname: str, path: Iterable[str] | None = None, target: object = None) -> object:
        if fullname not in _NVRX_OURS:
            return None
        import importlib.util  # noqa: PLC0415

        try:
            ours = importlib.util.find_spec(_NVRX_SERVED)
        except (ImportError, ValueError):
            ours = None
        if ours is None or ours.origin is None:
            return None  # NVRx's own client then: the error it raises names the cause
        locations = None
        if _NVRX_OURS[fullname]:
            # NVRx's other submodules (config, data, utils...) are found where they are
            locations = [os.path.join(p, "fault_tolerance") for p in path or ()]
        return importlib.util.spec_from_file_location(
            fullname, ours.origin, submodule_search_locations=locations
        )


def _serve_nvrx() -> None:
    sys.meta_path.insert(0, _NvrxFinder)  # type: ignore[arg-type]


def _await_go(fd: int) -> dict[str, str] | None:
    try:
        os.write(fd, b"ready\n")
    except OSError:
        pass  # only informative; the go may still be waiting to be read
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return None  # the daemon dropped this standby, or died
        buf += chunk
    os.close(fd)
    go = json.loads(buf)
    env = go.get("env", {})
    return {str(k): str(v) for k, v in env.items()}


def _run_script(path: str, args: list[str]) -> None:
    import builtins  # noqa: PLC0415
    import importlib.machinery  # noqa: PLC0415
    import io  # noqa: PLC0415
    import types  # noqa: PLC0415

    sys.argv = [path, *args]
    if _is_main_archive(path):
        # a directory or zip with __main__.py: what CPython itself does
        _run_module("__main__", alter_argv=False)
        return
    abspath = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__file__ = abspath
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", abspath)
    sys.modules["__main__"] = main
    with io.open_code(abspath) as f:
        source = f.read()
    code = compile(source, abspath, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - running the user's script is the point


def _is_main_archive(path: str) -> bool:
    import zipfile  # noqa: PLC0415

    return os.path.isdir(path) or (not path.endswith((".py", ".pyw")) and zipfile.is_zipfile(path))


def _run_module(name: str, alter_argv: bool = True) -> None:
    import runpy  # noqa: PLC0415
    import types  # noqa: PLC0415

    # runpy runs the module in __main__'s namespace, which is ours until now.
    sys.modules["__main__"] = types.ModuleType("__main__")
    # The same entry point `python -m` uses, so __spec__, argv[0] and
    # sys.modules["__main__"] end up exactly as they would there.
    runpy._run_module_as_main(name, alter_argv=alter_argv)  # type: ignore[attr-defined]


def _trimmed(tb: object) -> object:
    # Hide the bootstrap and runpy frames: a rank's traceback should start in
    # the user's code, as under torchrun.
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in _LAUNCH_FILES:  # type: ignore[attr-defined]
            break
        tb = tb.tb_next  # type: ignore[attr-defined]
    return tb


def _exec(target: str, args: list[str]) -> None:
    # CPython ignores SIGPIPE and SIGXFSZ; an exec'd program must not inherit that.
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(target, [target, *args])
    except OSError as exc:
        print(f"ft-supervisor: cannot execute {target!r}: {exc.strerror}", file=sys.stderr)
        # the shell's convention: 127 not found, 126 found but not executable
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _path0(kind: str, target: str) -> str:
    """sys.path[0] as the interpreter sets it for ``python script`` / ``python -m``."""
    if kind == "module":
        return os.getcwd()
    if _is_main_archive(target):
        return target
    return os.path.dirname(os.path.realpath(target))


def _run(kind: str, target: str, args: list[str]) -> None:
    if kind == "exec":
        _exec(target, args)
    if kind == "module":
        sys.argv = ["-m", *args]
        _run_module(target)
        return
    _run_script(target, args)


def _restore_descriptors() -> None:
    """The daemon caps its own open files (connections cost it memory); a rank gets back
    the limit the daemon was started with (data loaders may need many)."""
    import resource  # noqa: PLC0415

    soft = os.environ.pop(_NOFILE_ENV, None)
    if soft is None or not soft.isdigit():
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = int(soft) if hard == resource.RLIM_INFINITY else min(int(soft), hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass


def _serve_forks(fd: int, parent_pid: int) -> int:
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
            return _become_rank(json.loads(msg), fds, parent_pid)
        for f in fds:
            os.close(f)
        try:
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


def _become_rank(request: dict[str, object], fds: list[int], parent_pid: int) -> int:
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
    _join(str(request.get("cgroup") or ""))
    deadline = time.monotonic() + 10.0
    while os.getppid() != parent_pid and time.monotonic() < deadline:
        time.sleep(0.001)  # the middle process is exiting; the daemon adopts us then
    _die_with_parent(parent_pid)
    _restore_descriptors()
    # What a fresh interpreter would have drawn anew (the random module reseeds itself)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    os.write(boot, f"pid {os.getpid()}\n".encode())
    return boot


def main(argv: list[str]) -> None:
    boot_fd, parent_pid, cgroup, preload, flags, kind, target, *args = argv
    _join(cgroup)
    _die_with_parent(int(parent_pid))
    _restore_descriptors()
    # Set before the preload: it must import from where the program will.
    idle = "idle" in flags.split(",")
    if idle:
        _idle()
        if _go_arrived(int(boot_fd)):
            # released before it got here: the daemon's unidle came before our _idle
            unidle()
    if kind != "exec":
        sys.path[0] = _path0(kind, target)
        _serve_nvrx()  # before the preload, which may import NVRx
        _preload(preload, int(boot_fd))
    if "fork-server" in flags.split(","):
        boot_fd = str(_serve_forks(int(boot_fd), int(parent_pid)))
    _bind_numa()
    env = _await_go(int(boot_fd))
    if env is None:
        sys.exit(0)
    if idle:
        unidle()
    os.environ.update(env)
    try:
        _run(kind, target, args)
    except Exception as exc:
        # hooks (torch's among them) may print exc.__traceback__ itself
        exc = exc.with_traceback(_trimmed(exc.__traceback__))  # type: ignore[arg-type]
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)
    finally:
        if "fast-exit" in flags.split(","):
            _fast_exit()


def _fast_exit() -> None:
    """Spare the interpreter's last garbage-collection passes over torch.

    With torch loaded, CPython spends 0.4-0.7 s at exit traversing millions of
    long-lived objects for cycles; a failed rank's exit is on the critical path
    of every restart. Frozen objects are still torn down by reference counting
    (files flush, atexit handlers run); only cyclic garbage left at exit keeps
    its finalizers uncalled, which CPython never promised to call anyway.
    """
    import gc  # noqa: PLC0415

    gc.freeze()


if __name__ == "__main__":
    main(sys.argv[1:])
