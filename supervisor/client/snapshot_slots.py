"""The slot file of an in-memory snapshot: how a rank's state is laid out in the shared
memory its daemon owns, written and read back. The daemon records a slot complete with the
step, size and checksum the rank reports; of the file it reads only the header's seal.

Layout (all integers little-endian):

* a 64-byte header: ``b"FTSNAP01"``, u64 length of the skeleton, u64 offset of the data
  area, u64 step; the seal: u64 step + 1 and u64 bytes written, zero until the copy is
  whole (``core.memory_snapshots.sealed``: what the daemon reads of a rank gone before its
  done); zeros;
* the skeleton: JSON describing the state: mappings, lists, numbers, strings, bools and
  None as themselves; a tensor as ``{"__tensor__": i, "dtype", "shape", "offset",
  "nbytes"}`` (offset into the data area, 64-byte aligned; numpy arrays add ``"kind":
  "numpy"``); what JSON cannot say as ``{"__tuple__": [...]}``, ``{"__map__": [[key,
  value], ...]}`` (keys that are not strings), ``{"__float__": "nan"}``, ``{"__bytes__":
  "<base64>"}``, ``{"__int__": "<decimal>"}`` (beyond 64 bits);
* the data area, from the header's offset (64-byte aligned): the tensors' raw bytes.

``plan`` walks a state (on the caller's thread: it only looks at the tensors),
``Writer`` copies it into a writable mapping (tensors on CUDA devices asynchronously, into
the mapping page-locked: sealed once the copies are done), ``checksum`` is what the daemon records,
``read_slot`` maps a slot file copy-on-write, checks it against the recorded size and
checksum and rebuilds the state with tensors that are views of the mapping (no second
copy; the caller may modify them, the file stays as it was). torch and numpy are looked up
in ``sys.modules``, never imported here for a state without them.
"""

from __future__ import annotations

import base64
import contextlib
import math
import mmap
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from supervisor.client import snapshot_cuda
from supervisor.client.checksum_pool import checksum as checksum  # noqa: PLC0414 (re-exported: what the daemon records)
from supervisor.core.memory_snapshots import HEADER, HEADER_SIZE, MAGIC, SEAL

ALIGN = 64
MAX_DEPTH = 256
MARKERS = frozenset({"__tensor__", "__tuple__", "__map__", "__float__", "__bytes__", "__int__"})
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1


class SlotError(ValueError):
    """A slot that cannot be used: the message says why, in one line."""


@dataclass(slots=True)
class Array:
    """One tensor (or numpy array) of a plan: where its bytes go in the data area."""

    value: Any
    numpy: bool
    offset: int
    nbytes: int


@dataclass(slots=True)
class Plan:
    """A state flattened for one slot: the skeleton, the arrays, the bytes it takes."""

    skeleton: bytes
    arrays: list[Array] = field(default_factory=list)
    data_offset: int = 0
    total: int = 0


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(state: Mapping[str, Any]) -> Plan:
    """Flatten ``state`` (TypeError naming the first value that cannot be held)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a snapshot's state must be a mapping, not {type(state).__name__}")
    walker = _Flattener()
    skeleton = orjson.dumps(walker.walk(state, "state", 0))
    data_offset = _align(HEADER_SIZE + len(skeleton))
    return Plan(skeleton, walker.arrays, data_offset, data_offset + walker.size)


def _scalar(value: float | bytes | bytearray) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, int):
        return int(value) if INT64_MIN <= value <= UINT64_MAX else {"__int__": str(int(value))}
    return float(value) if math.isfinite(value) else {"__float__": repr(float(value))}


class _Flattener:
    def __init__(self) -> None:
        self.arrays: list[Array] = []
        self.size = 0
        self.torch = sys.modules.get("torch")
        self.numpy = sys.modules.get("numpy")
        self.open: set[int] = set()  # containers on the current path: a cycle is an error

    def walk(self, value: Any, where: str, depth: int) -> Any:
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int | float | bytes | bytearray):
            return _scalar(value)
        if self.torch is not None and isinstance(value, self.torch.Tensor):
            return self._tensor(value, where)
        if self.numpy is not None and isinstance(value, self.numpy.ndarray | self.numpy.generic):
            return self._ndarray(self.numpy.asarray(value), where)
        if depth >= MAX_DEPTH:
            raise TypeError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if id(value) in self.open:
            raise TypeError(f"{where}: refers to itself")
        self.open.add(id(value))
        try:
            return self._container(value, where, depth + 1)
        finally:
            self.open.discard(id(value))

    def _container(self, value: Any, where: str, depth: int) -> Any:
        if isinstance(value, Mapping):
            if all(isinstance(k, str) and k not in MARKERS for k in value):
                return {k: self.walk(v, f"{where}[{k!r}]", depth) for k, v in value.items()}
            pairs = [[self.walk(k, f"{where} (a key)", depth), self.walk(v, f"{where}[{k!r}]", depth)]
                     for k, v in value.items()]  # fmt: skip
            return {"__map__": pairs}
        if isinstance(value, list):
            return [self.walk(v, f"{where}[{i}]", depth) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"__tuple__": [self.walk(v, f"{where}[{i}]", depth) for i, v in enumerate(value)]}
        raise TypeError(f"{where}: a {type(value).__qualname__} cannot be held in a snapshot")

    def _place(self, value: Any, numpy: bool, nbytes: int) -> int:
        offset = self.size
        self.arrays.append(Array(value, numpy, offset, nbytes))
        self.size = _align(offset + nbytes)
        return len(self.arrays) - 1

    def _tensor(self, t: Any, where: str) -> dict[str, Any]:
        torch = self.torch
        assert torch is not None
        if t.layout != torch.strided or t.is_quantized:
            raise TypeError(f"{where}: a {t.layout} tensor cannot be held in a snapshot (dense tensors only)")
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        i = self._place(t, False, nbytes)
        return {"__tensor__": i, "dtype": dtype, "shape": list(t.shape), "offset": self.arrays[i].offset,
                "nbytes": nbytes}  # fmt: skip

    def _ndarray(self, a: Any, where: str) -> dict[str, Any]:
        if a.dtype.hasobject or a.dtype.fields is not None:
            raise TypeError(f"{where}: a numpy array of {a.dtype} cannot be held in a snapshot")
        i = self._place(a, True, int(a.nbytes))
        return {"__tensor__": i, "kind": "numpy", "dtype": a.dtype.str, "shape": list(a.shape),
                "offset": self.arrays[i].offset, "nbytes": int(a.nbytes)}  # fmt: skip


class Writer:
    """Copies plans into one writable mapping (a slot file mapped shared)."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self._torch_view: Any = None
        self._numpy_view: Any = None
        self.lock = snapshot_cuda.PageLock()  # the mapping, for copies from CUDA devices

    def write(self, p: Plan, step: int) -> snapshot_cuda.Copying | None:
        """Copy ``p`` into the slot; None: sealed. A ``Copying``: copies from CUDA devices in
        flight (``snapshot_cuda``): the caller waits for them off the training thread, then seals."""
        if p.total > len(self.mapping):
            raise SlotError(f"the snapshot takes {p.total} bytes, the slot holds {len(self.mapping)}")
        m = self.mapping
        end = HEADER_SIZE + len(p.skeleton)
        m[: HEADER.size] = HEADER.pack(MAGIC, len(p.skeleton), p.data_offset, int(step))
        m[HEADER.size : HEADER_SIZE] = bytes(HEADER_SIZE - HEADER.size)
        m[HEADER_SIZE:end] = p.skeleton
        tensors = [a for a in p.arrays if a.nbytes and not a.numpy]
        for a in p.arrays:
            if a.nbytes and a.numpy:
                start = p.data_offset + a.offset
                view = self._numpy()[start : start + a.nbytes].view(a.value.dtype)
                view.reshape(a.value.shape)[...] = a.value
        copying = None
        if tensors:
            whole = self._torch()
            torch = sys.modules["torch"]
            on_cuda = [a for a in tensors if a.value.is_cuda]
            # into pageable memory (any other device; CUDA when locking failed) a copy is synchronous
            later = bool(on_cuda) and self.lock.hold(torch, whole.data_ptr(), len(self.mapping))
            with torch.no_grad():
                for a in tensors:
                    start = p.data_offset + a.offset
                    view = whole[start : start + a.nbytes].view(a.value.dtype).view(a.value.shape)
                    view.copy_(a.value, non_blocking=later and a.value.is_cuda)
            if later:
                copying = snapshot_cuda.after(torch, {a.value.device for a in on_cuda})
        if copying is None:
            self.seal(p.total, step)
        return copying

    def seal(self, total: int, step: int) -> None:
        """Mark the copy whole: last, so a rank killed before it leaves the seal at zero."""
        self.mapping[HEADER.size : HEADER.size + SEAL.size] = SEAL.pack(int(step) + 1, total)

    def _torch(self) -> Any:
        if self._torch_view is None:
            self._torch_view = sys.modules["torch"].frombuffer(self.mapping, dtype=sys.modules["torch"].uint8)
        return self._torch_view

    def _numpy(self) -> Any:
        if self._numpy_view is None:
            self._numpy_view = sys.modules["numpy"].frombuffer(self.mapping, dtype="uint8")
        return self._numpy_view

    def close(self) -> None:
        """Unmap (unless something still holds a view of the mapping: then when it goes).
        Copies in flight must be done (the caller waits for its ``Copying`` first)."""
        if self.lock.address is not None:
            self.lock.release(sys.modules["torch"])
        self._torch_view = self._numpy_view = None
        _drop(self.mapping)


def map_for_writing(path: str, nbytes: int) -> mmap.mmap:
    """The slot file at ``path`` mapped shared and writable, all of it (at least ``nbytes``)."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = _regular_size(fd, path)
        if size < nbytes:
            raise SlotError(f"{path} holds {size} bytes, fewer than the {nbytes} asked for")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _regular_size(fd: int, path: str) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SlotError(f"{path} is not a regular file")
    return st.st_size


def read_slot(
    path: str, nbytes: int, expected: str, step: int | None = None, *, mapped: mmap.mmap | None = None
) -> tuple[int, dict[str, Any], mmap.mmap]:
    """The step and state held in the slot file at ``path``, checked against the recorded
    size and checksum (and step, when given); SlotError says what does not match. Tensors
    are views of a copy-on-write mapping (also returned): modifying them leaves the file
    as it was. ``mapped``: such a mapping of the file, made beforehand (a standby's,
    ``supervisor/process/bootstrap_premap.py``), checked the same way and used instead
    of mapping the file again."""
    if nbytes < HEADER_SIZE:
        raise SlotError(f"a slot of {nbytes} bytes cannot hold a snapshot")
    mapping = _map_copy(path, nbytes) if mapped is None else mapped
    try:
        held_step, state = _parse(mapping, path, nbytes, expected, step)
    except BaseException:
        _drop(mapping)
        raise
    return held_step, state, mapping


def _map_copy(path: str, nbytes: int) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SlotError(f"cannot open {path}: {e.strerror}") from None
    try:
        size = _regular_size(fd, path)
        if size < nbytes:
            raise SlotError(f"{path} holds {size} bytes, fewer than the {nbytes} recorded")
        return mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def _parse(mapping: mmap.mmap, path: str, nbytes: int, expected: str, step: int | None) -> tuple[int, Any]:
    found = checksum(mapping, nbytes)
    if found != expected:
        raise SlotError(f"{path}: checksum {found}, not the {expected} recorded (torn or damaged)")
    magic, length, data_offset, held_step = HEADER.unpack_from(mapping, 0)
    if magic != MAGIC:
        raise SlotError(f"{path} is not a snapshot slot (magic {magic!r})")
    if HEADER_SIZE + length > data_offset or data_offset > nbytes:
        raise SlotError(f"{path}: a header that does not fit its {nbytes} bytes")
    if step is not None and held_step != step:
        raise SlotError(f"{path} holds step {held_step}, not the {step} recorded")
    try:
        skeleton = orjson.loads(mapping[HEADER_SIZE : HEADER_SIZE + length])
        state = _Builder(mapping, data_offset, nbytes, path).build(skeleton, 0)
    except SlotError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise SlotError(f"{path}: a skeleton that cannot be rebuilt ({e})") from None
    if not isinstance(state, dict):
        raise SlotError(f"{path}: the state is not a mapping")
    return held_step, state


def _drop(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a view still holds it: unmapped when that goes
        mapping.close()


class _Builder:
    def __init__(self, mapping: mmap.mmap, data_offset: int, nbytes: int, path: str) -> None:
        self.mapping = mapping
        self.data_offset = data_offset
        self.room = nbytes - data_offset
        self.path = path

    def bad(self, why: str) -> SlotError:
        return SlotError(f"{self.path}: {why}")

    def build(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH + 1:
            raise self.bad("a skeleton nested too deep")
        if isinstance(node, list):
            return [self.build(v, depth + 1) for v in node]
        if not isinstance(node, dict):
            return node
        marker = next((k for k in _DECODERS if k in node), None)
        if marker is None:
            return {k: self.build(v, depth + 1) for k, v in node.items()}
        if marker == "__tensor__":
            return self._array(node)
        return _DECODERS[marker](self, node[marker], depth + 1)

    def _array(self, node: dict[str, Any]) -> Any:
        offset, nbytes, shape = node.get("offset"), node.get("nbytes"), node.get("shape")
        if not (isinstance(offset, int) and isinstance(nbytes, int) and isinstance(shape, list)
                and all(isinstance(n, int) and n >= 0 for n in shape)
                and offset >= 0 and nbytes >= 0 and offset + nbytes <= self.room):  # fmt: skip
            raise self.bad(f"a tensor entry out of bounds: {node}")
        if offset % ALIGN:
            raise self.bad(f"a tensor entry misaligned: {node}")
        numel = math.prod(shape)
        start = self.data_offset + offset
        if node.get("kind") == "numpy":
            numpy = _module("numpy", self.path)
            dtype = numpy.dtype(str(node.get("dtype")))
            if numel * dtype.itemsize != nbytes:
                raise self.bad(f"a numpy entry whose size does not match its shape: {node}")
            return numpy.frombuffer(self.mapping, dtype=dtype, count=numel, offset=start).reshape(shape)
        torch = _module("torch", self.path)
        dtype = getattr(torch, str(node.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise self.bad(f"an unknown dtype {node.get('dtype')!r}")
        if numel * dtype.itemsize != nbytes:
            raise self.bad(f"a tensor entry whose size does not match its shape: {node}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.mapping, dtype=dtype, count=numel, offset=start).view(shape)


_DECODERS: dict[str, Any] = {
    "__tensor__": None,
    "__tuple__": lambda b, v, d: tuple(b.build(x, d) for x in v),
    "__map__": lambda b, v, d: {_hashable(b.build(k, d)): b.build(x, d) for k, x in v},
    "__float__": lambda b, v, d: float(v),
    "__bytes__": lambda b, v, d: base64.b64decode(v),
    "__int__": lambda b, v, d: int(v),
}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def _module(name: str, path: str) -> Any:
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            raise SlotError(f"{path} holds {name} arrays and {name} cannot be imported") from None
    return sys.modules[name]


def make_private(mapping: mmap.mmap) -> None:
    """Give every page of a copy-on-write mapping its own copy, so that what the file
    holds next does not show through pages the caller never wrote (Linux shows a file's
    changes in the pages of a private mapping that were not written yet)."""
    if mapping.closed:
        return
    page = mmap.PAGESIZE
    with memoryview(mapping) as view, view[::page] as firsts:
        firsts[:] = bytes(firsts)
