"""Where the daemon listens, on real unix sockets."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import zmq
import zmq.asyncio

from supervisor.transport.endpoints import Endpoints, base_dir, bind, running_daemons

SUN_PATH_MAX = 107  # sockaddr_un.sun_path less its NUL


def test_a_runtime_dir_too_deep_for_a_socket_address_falls_back_to_a_short_one(tmp_path: Path) -> None:
    """pytest-xdist's temporary directories (and deep $XDG_RUNTIME_DIRs) left the control
    socket's path over 107 bytes: the daemon died in zmq's bind."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    env = {"XDG_RUNTIME_DIR": str(deep)}
    assert len(f"{deep}/ft-supervisor/4194304/control.sock") > SUN_PATH_MAX
    base = base_dir(env)
    assert not base.is_relative_to(deep)
    assert base == base_dir(env)  # the commands that look for daemons pick the same one
    endpoints = Endpoints.create(os.getpid(), env)
    ctx = zmq.asyncio.Context()
    try:
        sockets = bind(ctx, endpoints)
        sockets.close()
    finally:
        ctx.term()
        endpoints.remove()


def test_a_short_runtime_dir_is_used(tmp_path: Path) -> None:
    assert base_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "ft-supervisor"


def test_a_daemon_of_another_pid_namespace_is_listed_while_its_control_socket_answers(tmp_path: Path) -> None:
    # issue 22: its pid means nothing in this namespace (kill(pid, 0) probes another process,
    # or none, and its directory was taken for a dead daemon's); its socket tells
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    here = base_dir(env) / "1"
    here.mkdir(parents=True, mode=0o700)
    info = {"pid": 1, "run_id": "container", "pidns": "pid:[1]", "cwd": "/job", "starttime": 1}
    (here / "daemon.json").write_bytes(orjson.dumps(info))
    assert running_daemons(env) == []  # nobody listens: not listed, and its directory left alone
    assert here.exists()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(f"ipc://{here / 'control.sock'}")
        assert [d["run_id"] for d in running_daemons(env)] == ["container"]
    finally:
        sock.close(linger=0)
        ctx.term()
