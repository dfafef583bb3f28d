"""Free TCP ports for each generation's store."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now.

    Rank 0 binds it moments later; a fresh port per generation means a new
    generation can never reach a store (or gloo peer) of the dead one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
