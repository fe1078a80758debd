"""The wire between the judge's processes: framed JSON messages and shared tensors (no pickle).

Used on both sides of the trust boundary, so it imports only the standard library and torch
(the candidate process loads it by path, never through the `mkb` package). Nothing that crosses
it is ever unpickled: messages are JSON, tensors travel as memory-mapped files (CPU) or CUDA IPC
handles (GPU) that the trusted referee allocates and the candidate only maps.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import json.decoder
import json.encoder
import math
import os
import select
import struct
import sys
import threading
import time
from typing import Any

import torch

MAX_MESSAGE_BYTES = 64 << 20
"""A reply larger than this is a protocol violation (a candidate flooding the referee)."""


def await_spec(argv: list[str]) -> dict | None:
    """The spec of a judge process started ahead of its grading (argv[1]: the go pipe's fd).

    Blocks until the judge has written the spec (JSON) on the go pipe and closed it; None when the
    pipe closes with nothing written (the judge discarded this spare, or died).
    """
    go, chunks = int(argv[1]), []
    while chunk := os.read(go, 1 << 16):  # retried by Python when a signal interrupts it
        chunks.append(chunk)
    os.close(go)
    return json.loads(b"".join(chunks)) if chunks else None


def leave(code: int) -> None:
    """End a judge process at once, its one output line written: an interpreter holding torch and a DSL
    takes up to 0.8 s to tear down, time the judge would otherwise wait for."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class WireError(Exception):
    """The peer closed the channel or broke the protocol."""


class Unanswered(WireError):
    """The peer did not answer before the channel's deadline (Channel.deadline): it hangs, or works too long."""


class ForgedFrame(WireError):
    """A frame on a harness's reply pipe that the harness did not write (its tag does not match): a kernel wrote it."""


TAG_BYTES = 16
"""Once the load command has given the harness the grading's key, every frame it writes ends with a tag: keyed
BLAKE2b of the frame's number (counted per direction) and bytes. A kernel can write frames of its own on the reply
pipe it holds (a reply to the profile command claiming every microsecond was the DSL's, a flood of text): without
the key it cannot tag them, so the referee refuses them (tests/kernels/forged_profile_reply.py)."""


def tag(key: bytes, number: int, data: bytes) -> bytes:
    """The tag of the number-th frame (from 0) with these bytes (header and JSON)."""
    return hashlib.blake2b(number.to_bytes(8, "big") + data, key=key, digest_size=TAG_BYTES).digest()


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name} in a message")


def _unencodable(obj):
    raise TypeError(f"cannot send a {type(obj).__name__} in a message")


EVIDENCE = 255
"""The flag of an evidence message: what the candidate process saw, streamed the moment it saw it."""
_HEADER = struct.Struct(">IB")
_ENCODE = json.encoder.c_make_encoder(None, _unencodable, json.encoder.c_encode_basestring_ascii, None, ":", ",",
                                      False, False, False)
_SCAN = json.decoder.JSONDecoder(parse_constant=_reject_constant).scan_once


def frame(message: dict, flag: int = 0, _encode=_ENCODE, _pack=_HEADER.pack, _join="".join) -> bytes:
    """One message on the wire: size and flag, then compact JSON (no NaN or Infinity)."""
    data = _join(_encode(message, 0)).encode()
    return _pack(len(data), flag) + data


def unframe(data: bytes, _scan=_SCAN, _len=len, _type=type, _dict=dict,
            _errors=(ValueError, StopIteration, UnicodeDecodeError)) -> dict:
    """The message in a frame's JSON bytes; WireError when it is not exactly one JSON object."""
    try:
        text = data.decode()
        message, end = _scan(text, 0)
    except _errors:
        raise WireError("malformed message: not JSON") from None
    if end != _len(text) or _type(message) is not _dict:
        raise WireError("malformed message: not one JSON object")
    return message


class Channel:
    """Length-prefixed JSON messages, each with a one-byte flag, over a pair of pipe file descriptors.

    The functions it calls are bound when this module is imported (the C JSON scanner and encoder,
    os.read, os.write), ahead of kernel.py: a candidate that replaces json, struct or os functions
    afterwards sees nothing that passes here, the flag included (it carries the knock-out's mode).
    With a sink, evidence messages (flag EVIDENCE) go to sink(message) as they arrive and recv()
    returns the next other message.
    """

    def __init__(self, read_fd: int, write_fd: int, sink=None, _lock=threading.Lock):
        self.read_fd, self.write_fd, self.sink = read_fd, write_fd, sink
        self._spin = False
        self.lock = _lock()
        """Held while a frame is written: evidence from other threads never splits a frame."""
        self.key: bytes | None = None
        """Set (authenticate()) when the load command carries the key: from then on every frame read must be tagged."""
        self.read_frames = 0
        self.deadline: float | None = None
        """A time.monotonic() by which every read must have its bytes, else Unanswered (a blocking channel only)."""

    def authenticate(self, key: bytes) -> None:
        """Refuse, from now on, every frame the peer did not tag with key (TAG_BYTES)."""
        self.key, self.read_frames = key, 0

    @property
    def spin(self) -> bool:
        """Busy-poll for replies: a blocked read wakes ~10 us late, which would sit inside timed brackets."""
        return self._spin

    @spin.setter
    def spin(self, value: bool) -> None:
        self._spin = bool(value)
        os.set_blocking(self.read_fd, not value)

    def send(self, message: dict, flag: int = 0, _frame=frame, _write=os.write, _view=memoryview) -> None:
        data = _frame(message, flag)
        try:
            with self.lock:
                view = _view(data)
                while view:
                    view = view[_write(self.write_fd, view):]
        except (BrokenPipeError, OSError) as exc:
            raise WireError(f"peer closed the channel ({exc.__class__.__name__})") from None

    def recv(self) -> dict:
        return self.recv_flagged()[0]

    def recv_flagged(self, _unpack=_HEADER.unpack, _unframe=unframe, _size=_HEADER.size,
                     _limit=MAX_MESSAGE_BYTES, _evidence=EVIDENCE) -> tuple[dict, int]:
        """The next message that is not evidence, and its flag."""
        while True:
            header = self._read_exact(_size)
            size, flag = _unpack(header)
            if size > _limit:
                raise WireError(f"message of {size} bytes exceeds the {_limit}-byte limit")
            data = self._read_exact(size)
            if self.key is not None:
                number, self.read_frames = self.read_frames, self.read_frames + 1
                if not hmac.compare_digest(self._read_exact(TAG_BYTES), tag(self.key, number, header + data)):
                    raise ForgedFrame("a frame on the harness's reply pipe that the harness did not write (a reply or "
                                      "evidence forged by the kernel)")
            message = _unframe(data)
            if flag == _evidence and self.sink is not None:
                self.sink(message)
                continue
            return message, flag

    def _read_exact(self, n: int, _read=os.read, _join=b"".join, _len=len, _blocked=BlockingIOError,
                    _oserror=OSError) -> bytes:
        chunks, got = [], 0
        while got < n:
            if self.deadline is not None:
                self._await_bytes()
            try:
                chunk = _read(self.read_fd, n - got if n - got < (1 << 20) else (1 << 20))
            except _blocked:
                continue
            except _oserror as exc:
                raise WireError(f"read failed: {exc}") from None
            if not chunk:
                raise WireError("peer closed the channel")
            chunks.append(chunk)
            got += _len(chunk)
        return _join(chunks)

    def _await_bytes(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
            raise Unanswered("no answer before the deadline")


MASK_KEY_BYTES = 32
"""A solve command's flag (the draw's mode, which the knock-out's guarantee rests on) travels XORed with a byte
derived from a key the referee sends with the load command, before kernel.py is imported, and a nonce of the
command (mask()): a kernel that reads the command pipe (it can put a pipe of its own in the harness's place and
forward every frame) sees the nonce and a uniform byte, never the mode."""


def mask(key: bytes, nonce: str) -> int:
    """The byte a solve command's flag is XORed with: keyed BLAKE2b of the command's nonce."""
    return hashlib.blake2b(nonce.encode(), key=key, digest_size=1).digest()[0]


def unmasker(key: bytes):
    """The harness's side of mask(): unmask(flag, nonce) -> the mode; a closure over the key (which it alone holds
    once the load command is gone) and the functions it calls, bound before kernel.py is imported."""
    blake2b, str_, type_, encode = hashlib.blake2b, str, type, str.encode

    def unmask(flag: int, nonce) -> int:
        if type_(nonce) is not str_:
            return 0
        return flag ^ blake2b(encode(nonce), key=key, digest_size=1).digest()[0]

    return unmask


def endpoint(read_fd: int, write_fd: int) -> tuple:
    """The candidate's side of a channel as closures: recv_flagged(), send(message, flag=0), emit(event) and
    authenticate(key) (every frame sent afterwards is tagged: tag()).

    No class is involved: a candidate can replace any attribute of any class it reaches (class attributes
    are not audited), and Channel's methods would then see the command bytes, the flag included. These
    closures look up no global name (a test disassembles them); emit streams one evidence message and
    never raises (a closed peer ends the grading anyway).
    """
    read, write, unpack, size, limit, evidence = os.read, os.write, _HEADER.unpack, _HEADER.size, MAX_MESSAGE_BYTES, \
        EVIDENCE
    frame_, unframe_, lock, view, len_, join = frame, unframe, threading.Lock(), memoryview, len, b"".join
    Blocked, OSError_, WireError_ = BlockingIOError, OSError, WireError
    fstat = os.fstat

    def identity(fd: int) -> tuple:
        try:
            st = fstat(fd)
        except OSError_:
            return ()
        return (st.st_dev, st.st_ino)

    blake2b, to_bytes, tag_bytes, keyed, sent = hashlib.blake2b, int.to_bytes, TAG_BYTES, [], [0]
    """The key (set once by authenticate(), from the load command, before kernel.py runs) and the frames tagged."""

    pipes = (identity(read_fd), identity(write_fd))
    """The pipes the judge gave this process: a candidate can put pipes of its own on the same descriptors (os.dup2)
    and sit between the harness and the referee, reading and rewriting every frame; each frame is read and written
    only while both descriptors still name the judge's pipes."""

    def check() -> None:
        if (identity(read_fd), identity(write_fd)) != pipes:
            raise WireError_("the judge's pipes were replaced (a descriptor of the harness now names another file)")

    def read_exact(n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = read(read_fd, n - got if n - got < (1 << 20) else (1 << 20))
            except Blocked:
                continue
            except OSError_ as exc:
                raise WireError_(f"read failed: {exc}") from None
            if not chunk:
                raise WireError_("peer closed the channel")
            chunks.append(chunk)
            got += len_(chunk)
        return join(chunks)

    def recv_flagged() -> tuple[dict, int]:
        check()
        length, flag = unpack(read_exact(size))
        if length > limit:
            raise WireError_(f"message of {length} bytes exceeds the {limit}-byte limit")
        data = read_exact(length)
        check()
        return unframe_(data), flag

    def send(message: dict, flag: int = 0) -> None:
        data = frame_(message, flag)
        check()
        try:
            with lock:
                if keyed:
                    data += blake2b(to_bytes(sent[0], 8, "big") + data, key=keyed[0], digest_size=tag_bytes).digest()
                    sent[0] += 1
                rest = view(data)
                while rest:
                    rest = rest[write(write_fd, rest):]
        except OSError_ as exc:
            raise WireError_(f"peer closed the channel ({exc.strerror})") from None

    def emit(event: dict) -> None:
        try:
            send(event, evidence)
        except WireError_:
            pass

    def authenticate(key: bytes) -> None:
        with lock:
            if not keyed:
                keyed.append(key)

    return recv_flagged, send, emit, authenticate


# -- trees of values and tensors ---------------------------------------------------------------

def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"unknown dtype {name!r}")
    return dtype


def encode(obj: Any, share) -> dict:
    """A JSON tree of obj; each tensor becomes share(tensor, path)."""
    return _encode(obj, share, "in")


def _encode(obj: Any, share, path: str) -> dict:
    if isinstance(obj, (list, tuple)):
        return {"k": type(obj).__name__, "v": [_encode(o, share, f"{path}[{i}]") for i, o in enumerate(obj)]}
    if isinstance(obj, torch.Tensor):
        return {"k": "tensor", "v": share(obj, path)}
    if isinstance(obj, float):
        return {"k": "float", "v": repr(obj)}
    if isinstance(obj, torch.dtype):
        return {"k": "dtype", "v": dtype_name(obj)}
    if obj is None or isinstance(obj, (bool, int, str)):
        return {"k": "value", "v": obj}
    raise WireError(f"{path}: cannot transport a {type(obj).__name__}")


def decode(tree: dict, open_leaf) -> Any:
    """The object a tree describes; each tensor leaf becomes open_leaf(leaf)."""
    kind, value = tree.get("k"), tree.get("v")
    if kind in ("list", "tuple"):
        items = [decode(v, open_leaf) for v in value]
        return items if kind == "list" else tuple(items)
    if kind == "tensor":
        return open_leaf(value)
    if kind == "float":
        return float(value)
    if kind == "dtype":
        return dtype_from(value)
    if kind == "value":
        return value
    raise WireError(f"unknown tree node {kind!r}")


def leaves(tree: dict, path: str = "out") -> list[tuple[str, dict]]:
    """(path, leaf) of every tensor leaf, depth first, paths as tensortree.flatten names them."""
    if tree.get("k") in ("list", "tuple"):
        return [pair for i, v in enumerate(tree["v"]) for pair in leaves(v, f"{path}[{i}]")]
    return [(path, tree["v"])] if tree.get("k") == "tensor" else []


# -- tensors: memory-mapped files (CPU) --------------------------------------------------------

def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the bytes of a storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


def file_name(directory: str) -> str:
    """A fresh file under directory, named at random: a shared file's name, like its size and place, must not
    say what the referee shares it for (a graded draw, a knock-out, the repeat), since the candidate can list
    the grading's /dev/shm and read /proc/self/maps."""
    return os.path.join(directory, os.urandom(12).hex() + ".bin")


def file_share(directory: str):
    """A share function writing each tensor's storage to a file under directory."""

    def share(t: torch.Tensor, path: str) -> dict:
        t = t.detach()
        storage = t.untyped_storage()
        name = file_name(directory)
        nbytes = max(storage.nbytes(), 1)
        mapped = torch.from_file(name, shared=True, size=nbytes, dtype=torch.uint8)
        if storage.nbytes():
            mapped.copy_(byte_view(storage).cpu())
        return {"file": name, "nbytes": nbytes, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                "stride": list(t.stride()), "offset": t.storage_offset(), "device": t.device.type}

    return share


def file_slot(directory: str):
    """A share function making an empty, contiguous output slot file shaped like each tensor."""

    def share(t: torch.Tensor, path: str) -> dict:
        name = file_name(directory)
        nbytes = max(t.numel() * t.element_size(), 1)
        torch.from_file(name, shared=True, size=nbytes, dtype=torch.uint8)
        return {"file": name, "nbytes": nbytes, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                "stride": list(torch.empty(t.shape, device="meta").stride()), "offset": 0,
                "device": t.device.type}

    return share


def open_file_leaf(leaf: dict, device: str | None = None) -> torch.Tensor:
    """The tensor a file leaf describes, mapped shared (writes reach the file); moved to device."""
    mapped = torch.from_file(leaf["file"], shared=True, size=int(leaf["nbytes"]), dtype=torch.uint8)
    t = torch.empty(0, dtype=dtype_from(leaf["dtype"])).set_(
        mapped.untyped_storage(), int(leaf["offset"]), tuple(leaf["shape"]), tuple(leaf["stride"]))
    target = device or leaf.get("device", "cpu")
    return t if target == "cpu" else t.to(target)


def read_file_leaf(leaf: dict) -> torch.Tensor:
    """A private copy of what a file leaf holds now."""
    return open_file_leaf(leaf, "cpu").clone()


# -- tensors: CUDA IPC (GPU) -------------------------------------------------------------------

def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def ipc_storage(storage: torch.UntypedStorage) -> dict:
    """The CUDA IPC description of a storage, once the device has finished writing it (a leaf carries no IPC
    event: see Signal). Describe a storage once and reuse the description (ipc_leaf): every _share_cuda_()
    call wraps the storage in a new reference count."""
    torch.cuda.synchronize()
    device, handle, size, offset, rc_handle, rc_offset, _event, _sync = storage._share_cuda_()
    return {"ipc": _b64(handle), "device": "cuda", "index": int(device), "nbytes": int(size),
            "storage_offset_bytes": int(offset), "rc": _b64(rc_handle), "rc_offset": int(rc_offset)}


def ipc_leaf(storage: dict, t: torch.Tensor) -> dict:
    """The leaf of a tensor viewing a storage that ipc_storage() described."""
    return {**storage, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset()}


def ipc_share(t: torch.Tensor, path: str = "") -> dict:
    """A CUDA IPC description of a tensor's storage (the producer keeps the tensor alive), once the device has
    finished writing it."""
    t = t.detach()
    return ipc_leaf(ipc_storage(t.untyped_storage()), t)


def open_ipc_leaf(leaf: dict) -> torch.Tensor:
    """Map a producer's CUDA tensor into this process (writes reach the producer's memory)."""
    torch.cuda._lazy_init()  # the caching allocator must exist before it maps a handle (else getIpcDevPtr segfaults)
    torch.cuda.set_device(int(leaf["index"]))
    storage = torch.UntypedStorage._new_shared_cuda(
        int(leaf["index"]), _unb64(leaf["ipc"]), int(leaf["nbytes"]), int(leaf["storage_offset_bytes"]),
        _unb64(leaf["rc"]), int(leaf["rc_offset"]), b"", False)  # no IPC event: the producer synced first
    return torch.empty(0, dtype=dtype_from(leaf["dtype"]), device=f"cuda:{int(leaf['index'])}").set_(
        storage, int(leaf["offset"]), tuple(leaf["shape"]), tuple(leaf["stride"]))


def open_leaf(leaf: dict) -> torch.Tensor:
    """Open a file or IPC leaf."""
    return open_ipc_leaf(leaf) if "ipc" in leaf else open_file_leaf(leaf)


# -- signals between processes: CUDA IPC memory, not CUDA IPC events ---------------------------

class Signal:
    """An interprocess event made of one int32 slot of device memory that both processes map.

    CUDA IPC event handles do not open inside the judge's sandbox cells (measured on the H200:
    "mapping of buffer object failed" in every cell variant, while IPC memory maps), so the
    judge's cross-process ordering uses IPC memory only: record() writes the next count into the
    slot from a stream, after the work queued before it (cuStreamWriteValue32, with its memory
    fence); wait_next() makes a stream wait until the slot holds at least its own next count
    (cuStreamWaitValue32, GEQ). The two sides count their records and waits separately, one record
    per wait. A process that never records leaves the waiter's stream blocked: release() ends such
    a wait from another stream. The slots come from the referee's shared pool (transport.py).
    """

    FREE = 0x7FFFFFFF
    """What release() writes: at least every count a grading reaches."""

    def __init__(self, slot: torch.Tensor):
        self.slot, self.count = slot, 0

    def record(self, stream=None) -> None:
        self.count += 1
        _driver_call("cuStreamWriteValue32", _handle(stream), self.slot.data_ptr(), self.count, 0)

    def wait_next(self, stream=None) -> None:
        self.count += 1
        _driver_call("cuStreamWaitValue32", _handle(stream), self.slot.data_ptr(), self.count, 0)

    def release(self) -> None:
        side = torch.cuda.Stream()
        _driver_call("cuStreamWriteValue32", side.cuda_stream, self.slot.data_ptr(), self.FREE, 0)
        side.synchronize()


def signals(tree: dict) -> list[Signal]:
    """The Signals over the int32 slots of a shared tensor (one per element)."""
    slots = decode(tree, open_leaf)
    return [Signal(slots[i:i + 1]) for i in range(slots.numel())]


def _handle(stream) -> int:
    return (stream if stream is not None else torch.cuda.current_stream()).cuda_stream


def _driver_call(name: str, *args) -> None:
    from cuda.bindings import driver  # with the CUDA DSLs' runtime (nvidia-cutlass-dsl needs it too)

    err = getattr(driver, name)(*args)[0]
    if int(err) != 0:
        raise RuntimeError(f"{name} failed: {getattr(err, 'name', err)}")


def finite(x: float) -> float | None:
    """x, or None when it is NaN/Inf (messages are strict JSON)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
