"""The store for a destination: a directory here, or anything fsspec reaches."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from supervisor.checkpoints.store import CHUNK, Maker, Store
from supervisor.config.checkpoints import split_url


def open_store(url: str, executor: Executor, *, chunk: int = CHUNK, maker: Maker | None = None) -> Store:
    scheme, location = split_url(url)
    maker = maker or Maker.here()
    if scheme is None:
        from supervisor.checkpoints.local import LocalStore  # noqa: PLC0415

        return LocalStore(Path(location).absolute(), executor=executor, chunk=chunk, maker=maker)
    import fsspec  # noqa: PLC0415 - the optional extra; checked with the options

    from supervisor.checkpoints.remote import FsspecStore  # noqa: PLC0415

    fs, root = fsspec.core.url_to_fs(url)
    return FsspecStore(fs, root, url=url, executor=executor, chunk=chunk, maker=maker)
