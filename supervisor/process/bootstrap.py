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
   A standby given ``FT_SUPERVISOR_PREMAP`` maps its snapshot slots meanwhile (bootstrap_premap.py).
4. Serve NVRx's client from ours: ``import nvidia_resiliency_ext.fault_tolerance``
   (and its ``rank_monitor_client``) resolves to ``supervisor.client._nvrx_package``
   (NVRx's names over our client, whose messages are JSON: nothing is unpickled; NVRx's
   own needs ft_launcher's rank monitor socket). The rest of NVRx stays its own. Without
   our client (another ``PYTHON_EXEC``) NVRx's own loads, and fails as it would (P0-NVRX).
5. Run TARGET the way ``python -u script.py`` / ``python -u -m module`` would
   (KIND ``script`` / ``module``), or exec it (KIND ``exec``, ``--no-python``: a new
   program, which 4 does not reach).
   FLAGS (comma separated): ``fast-exit`` skips the last GC passes at exit;
   ``idle``: a standby, see 2; ``fork-server``: not a rank but the node's fork server,
   which after 2 forks ranks that go on at 3 with the preload already paid
   (``supervisor/process/bootstrap_forkserver.py``).

Standard library only, and nothing imported here may reach the daemon's modules.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import types
from collections.abc import Iterable

_PR_SET_PDEATHSIG = 1
_CAP_SYS_NICE = 23  # capabilities(7)
_NOFILE_ENV = "FT_SUPERVISOR_NOFILE"  # the open-files limit the daemon was given (see daemon.py)
_NUMA_ENV = "FT_SUPERVISOR_NUMA_BINDING"  # torchrun's --numa-binding mode (core.topology)
_PREMAP = "FT_SUPERVISOR_PREMAP"  # a standby's snapshot directory (bootstrap_premap.py)
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

    # The preload must be invisible: importing torch._dynamo, for one, writes TORCHINDUCTOR_CACHE_DIR
    # into os.environ. The program starts with the environment it was given; torch re-derives it.
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


def _await_go(fd: int, premap: types.ModuleType | None = None) -> dict[str, str] | None:
    try:
        os.write(fd, b"ready\n")
    except OSError:
        pass  # only informative; the go may still be waiting to be read
    if premap is not None:
        premap.wait(fd)  # its rank's slots mapped, kept current, until the go (or EOF) is here
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


def _sibling(filename: str) -> types.ModuleType:
    """A module beside this file, by its path (this file has no package): _ft_supervisor_<name>."""
    import importlib.util  # noqa: PLC0415

    name = "_ft_supervisor_" + filename.removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), filename))
    assert spec is not None and spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _serve_forks(fd: int, parent_pid: int) -> int:
    """The fork server (``bootstrap_forkserver.py``): returns only in a forked rank, its boot fd."""
    server = _sibling("bootstrap_forkserver.py")
    steps = {"join": _join, "die_with_parent": _die_with_parent, "restore_descriptors": _restore_descriptors}
    return int(server.serve_forks(fd, parent_pid, **steps))


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
    premap = _sibling("bootstrap_premap.py") if _PREMAP in os.environ and kind != "exec" else None
    env = _await_go(int(boot_fd), premap)
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
    """Spare the last GC passes over torch's objects (0.4-0.7 s of a failed rank's exit, on every
    restart's critical path): reference counting still tears frozen objects down (files flush,
    atexit handlers run); only cyclic garbage left at exit keeps its finalizers uncalled."""
    import gc  # noqa: PLC0415

    gc.freeze()


if __name__ == "__main__":
    main(sys.argv[1:])
