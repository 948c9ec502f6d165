"""Checkpoint files: a documented, versioned, portable ``.npz`` format, written atomically.

Every model (``OnlineEM``, ``OnlineSGA``, ``VIFA``, ``MiniBatchEM``, ``OnlineFactorAnalysis``, ``VBFA``,
``OnlineVBFA``, ``GFA``, ``OnlineGFA``) checkpoints through the two functions of this module: the model turns itself into a
*state* — a flat ``dict`` mapping names to
NumPy arrays and Python scalars, everything needed to continue bit-identically — and
:func:`save_state` / :func:`load_state` move that dict to and from disk.

File format, version 1
----------------------
A checkpoint is an uncompressed zip archive of ``.npy`` files, i.e. a NumPy ``.npz`` file: it opens with
``numpy.load(path, allow_pickle=False)`` and with any other ``.npy`` reader (no pickles anywhere). All
arrays are stored little-endian and C-ordered, so files move between machines unchanged. Members:

=================  ==========================  ==================================================
member             stored as                   meaning
=================  ==========================  ==================================================
``__format__``     int64 scalar                format version, :data:`FORMAT_VERSION`
``__class__``      unicode scalar              model class, e.g. ``"OnlineEM"``
``__manifest__``   unicode scalar (JSON)       ``{name: type}`` for every state entry, type one of
                                               ``"array"``, ``"int"``, ``"float"``, ``"bool"``,
                                               ``"str"``, ``"none"``
``__sha256__``     unicode scalar              SHA-256 digest of the content (hex), see below
``<name>``         array / 0-d array           one state entry (none for type ``"none"``)
=================  ==========================  ==================================================

Scalar entries are 0-d arrays: ``"int"`` as int64 (uint64 above 2⁶³ − 1), ``"float"`` as float64,
``"bool"`` as bool, ``"str"`` as unicode. ``"array"`` entries keep their dtype (bool, integer or float).

The state of a streaming model (``OnlineEM``, ``OnlineSGA``, ``VIFA``, ``MiniBatchEM``) is its engine's
state map. The estimators' states hold these entries:

=========================  =========================================================================
entry                      meaning
=========================  =========================================================================
``param.<name>``           hyper-parameter ``<name>`` when it is None, a bool, int, float or str
``param.<name>.json``      any other hyper-parameter (e.g. GFA's ``groups`` as a sequence of labels or
                           of group sizes) as JSON text; NumPy arrays and scalars become lists and
                           numbers, so a tuple or an array reads back as a list
``engine.<key>``           ``VBFA``, ``OnlineVBFA``, ``GFA``, ``OnlineGFA``: entry ``<key>`` of the
                           engine's state map (fitted estimators only)
``group_labels``           ``GFA``, ``OnlineGFA``: the group labels as a JSON list (fitted only)
``model.class``,           ``OnlineFactorAnalysis``: the class of its streaming model and that
``model.<key>``            model's state map (fitted only)
=========================  =========================================================================

GFA checkpoints written before this layout held all hyper-parameters as one JSON object in the entry
``params``; ``GFA.load`` and ``OnlineGFA.load`` still read them (a hyper-parameter missing from such a file
takes its constructor default, as it did then).

The digest is SHA-256 over, in order: ``b"onlinefa-checkpoint\\0"``, the format version and class as
``"<version>\\0<class>\\0"``, then for every entry in sorted name order
``"<name>\\0<type>\\0<dtype.str>\\0<shape as comma-separated ints>\\0"`` (UTF-8) followed by the
entry's little-endian C-order bytes (nothing for ``"none"``).

Reading checks, in this order: that the path is a regular file (devices such as ``/dev/zero``, FIFOs and
directories fail at once), the archive's directory, the format version, the class, that the members are
exactly the manifest's, then every member's CRC (zip) and the digest as the members are streamed, then the
entries' types. Anything wrong raises
:class:`ValueError` naming the file and the problem, so a truncated, corrupted, foreign, future-version
or wrong-class file never turns into a silently wrong model. The model's own ``from_state`` then checks
every shape and every value the algorithm relies on (finite arrays, sample count <= 2⁵³, step sizes in
(0, 1], non-negative running squares and variances, symmetric bounded K×K statistics with a positive
diagonal where they are covariances, hyper-parameters in range); its errors name the file too.

**What the digest detects, and what it does not.** The SHA-256 digest is an *unkeyed* checksum: it
detects accidental damage (bit flips, truncation, a member copied from another file) with certainty for
all practical purposes, but **not deliberate edits** — anyone can change a value and recompute the digest.
Such a file still passes the value checks above only if every value is one the algorithm can continue
from; the model it loads is then simply a different model. Treat a checkpoint from an untrusted source
like any other untrusted data. Loading one never executes code (no pickles are read), whereas
**pickles** of models (``pickle.dumps(model)``) must never be loaded from an untrusted source: unpickling
can execute arbitrary code, as for any pickle.

Reading streams: each member is read in chunks of 4 MiB straight into its final array (the digest and the
zip CRC are computed on the way), so :func:`load_state` needs the state's size plus one chunk, and a
model's ``load`` hands its arrays to the engine without copying them (peak about 1.1× the file).

Writing is atomic: the archive goes to a temporary file ``.<name>.<12 hex digits>.tmp`` in the
destination's directory, locked with ``flock`` while it is written, flushed and ``fsync``-ed, then renamed
over the destination with :func:`os.replace`. A crash or exception mid-save leaves any previous checkpoint
untouched and removes the temporary file. A writer killed outright (``kill -9``, power loss) cannot remove
its temporary file; the next save to the same destination deletes such leftovers — temporary files of that
destination whose lock is free and which were last written more than :data:`STALE_TEMPORARY_SECONDS` ago
(a save in progress in another process holds its lock and is never touched).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import secrets
import stat
import time
import zipfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: Version of the file layout written by :func:`save_state`; :func:`load_state` reads only this one.
FORMAT_VERSION = 1

_VERSION_KEY = "__format__"
_CLASS_KEY = "__class__"
_MANIFEST_KEY = "__manifest__"
_DIGEST_KEY = "__sha256__"
_RESERVED = (_VERSION_KEY, _CLASS_KEY, _MANIFEST_KEY, _DIGEST_KEY)
_DIGEST_PREFIX = b"onlinefa-checkpoint\0"
#: Age (seconds since the last write) above which an unlocked temporary file of a save is stale.
STALE_TEMPORARY_SECONDS = 60.0
_TOKEN_BYTES = 6
#: Fixed zip timestamp, so the same state always gives the same bytes.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_ARRAY_KINDS = "biuf"
_ENTRY_TYPES = ("array", "int", "float", "bool", "str", "none")

StateDict = dict[str, Any]


# -- encoding ----------------------------------------------------------------------------------------
def _encode_int(name: str, value: int) -> NDArray[Any]:
    if -(2**63) <= value < 2**63:
        return np.array(value, dtype="<i8")
    if 0 <= value < 2**64:
        return np.array(value, dtype="<u8")
    raise ValueError(f"state entry {name!r}: integer {value} does not fit in 64 bits")


def _encode_entry(name: str, value: object) -> tuple[str, NDArray[Any] | None]:
    """Return (manifest type, stored little-endian array or None) for one state entry."""
    if value is None:
        return "none", None
    if isinstance(value, (bool, np.bool_)):
        return "bool", np.array(bool(value), dtype="|b1")
    if isinstance(value, (int, np.integer)):
        return "int", _encode_int(name, int(value))
    if isinstance(value, (float, np.floating)):
        return "float", np.array(float(value), dtype="<f8")
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"state entry {name!r}: strings must not contain NUL characters")
        return "str", np.array(value, dtype="<U")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise TypeError(
                f"state entry {name!r}: arrays must be bool, integer or float, got dtype {value.dtype}"
            )
        return "array", np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    raise TypeError(
        f"state entry {name!r}: expected a NumPy array, int, float, bool, str or None, "
        f"got {type(value).__name__}"
    )


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"state entry names must be non-empty strings, got {name!r}")
    if name.startswith("__") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"state entry name {name!r} is reserved or not a valid file name")
    return name


def _encode_state(state: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, NDArray[Any]]]:
    """Validate ``state`` and return (manifest, stored arrays)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of names to values, got {type(state).__name__}")
    manifest: dict[str, str] = {}
    arrays: dict[str, NDArray[Any]] = {}
    for raw_name, value in state.items():
        name = _check_name(raw_name)
        entry_type, stored = _encode_entry(name, value)
        manifest[name] = entry_type
        if stored is not None:
            arrays[name] = stored
    return manifest, arrays


# -- digest ------------------------------------------------------------------------------------------
def _little_endian_bytes(array: NDArray[Any]) -> NDArray[np.uint8]:
    """The C-order little-endian bytes of ``array`` (a view when it already is laid out so)."""
    stored = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    as_bytes: NDArray[np.uint8] = stored.reshape(-1).view(np.uint8)
    return as_bytes


def state_digest(
    version: int, kind: str, manifest: Mapping[str, str], arrays: Mapping[str, NDArray[Any]]
) -> str:
    """SHA-256 digest (hex) of a checkpoint's content, as specified in the module documentation.

    Parameters
    ----------
    version : int
        Format version stored in the file.
    kind : str
        Model class stored in the file.
    manifest : mapping of str to str
        Entry name → entry type.
    arrays : mapping of str to ndarray
        Entry name → stored array, for every entry whose type is not ``"none"``.

    Returns
    -------
    str
        64 hexadecimal digits.
    """
    digest = hashlib.sha256(_DIGEST_PREFIX)
    digest.update(f"{version}\0{kind}\0".encode())
    for name in sorted(manifest):
        entry_type = manifest[name]
        array = arrays.get(name)
        if array is None:
            digest.update(f"{name}\0{entry_type}\0\0\0".encode())
            continue
        little = array.dtype.newbyteorder("<")
        shape = ",".join(str(n) for n in array.shape)
        digest.update(f"{name}\0{entry_type}\0{little.str}\0{shape}\0".encode())
        digest.update(_little_endian_bytes(array).data)
    return digest.hexdigest()


# -- writing -----------------------------------------------------------------------------------------
def _write_member(archive: zipfile.ZipFile, name: str, array: NDArray[Any]) -> None:
    info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_STORED
    with archive.open(info, mode="w", force_zip64=True) as member:
        np.lib.format.write_array(member, array, allow_pickle=False)


def _write_archive(handle: IO[bytes], members: Mapping[str, NDArray[Any]]) -> None:
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in members.items():
            _write_member(archive, name, array)


def _temporary_name(base_name: str, token: str) -> str:
    return f".{base_name}.{token}.tmp"


def _is_temporary_of(name: str, base_name: str) -> bool:
    """Whether ``name`` is a temporary file that a save of ``base_name`` creates."""
    prefix, suffix = f".{base_name}.", ".tmp"
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return False
    token = name[len(prefix) : -len(suffix)]
    return len(token) == 2 * _TOKEN_BYTES and all(c in "0123456789abcdef" for c in token)


def _lock(fd: int, blocking: bool) -> bool:
    """Take an exclusive advisory lock on ``fd`` (released by the kernel when the process dies).
    Returns False when another process holds it (non-blocking), True otherwise (also without fcntl)."""
    if fcntl is None:  # pragma: no cover - Windows
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _remove_stale_temporaries(directory: str, base_name: str) -> None:
    """Delete temporary files of earlier saves of ``base_name`` whose writer died (``kill -9``, power loss).

    A live writer holds an exclusive ``flock`` on its temporary file for the whole save; a dead one's lock
    was released by the kernel. A file is removed only when its lock can be taken *and* it was last
    modified more than :data:`STALE_TEMPORARY_SECONDS` ago (covering the instant between a writer's
    creating the file and locking it). Without ``fcntl`` (Windows) nothing is removed.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return
    try:
        names = [name for name in os.listdir(directory) if _is_temporary_of(name, base_name)]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            try:
                info = os.fstat(fd)
                old = time.time() - info.st_mtime > STALE_TEMPORARY_SECONDS
                if stat.S_ISREG(info.st_mode) and old and _lock(fd, blocking=False):
                    os.unlink(path)
            finally:
                os.close(fd)


def _open_temporary(directory: str, base_name: str) -> tuple[str, IO[bytes]]:
    """Create a new file beside the destination (normal permissions, unique name), lock and open it."""
    for _ in range(100):
        temp_path = os.path.join(directory, _temporary_name(base_name, secrets.token_hex(_TOKEN_BYTES)))
        try:
            fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        _lock(fd, blocking=True)
        return temp_path, os.fdopen(fd, "wb")
    raise FileExistsError(f"could not create a temporary file in {directory!r}")  # pragma: no cover


def fsync_directory(directory: str) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _members(kind: str, state: Mapping[str, Any]) -> dict[str, NDArray[Any]]:
    """The archive's members for ``state`` of a ``kind`` model: the header (version, class, manifest,
    digest), then the entries."""
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"kind must be a non-empty string, got {kind!r}")
    manifest, arrays = _encode_state(state)
    members: dict[str, NDArray[Any]] = {
        _VERSION_KEY: np.array(FORMAT_VERSION, dtype="<i8"),
        _CLASS_KEY: np.array(kind, dtype="<U"),
        _MANIFEST_KEY: np.array(json.dumps(manifest, sort_keys=True), dtype="<U"),
        _DIGEST_KEY: np.array(state_digest(FORMAT_VERSION, kind, manifest, arrays), dtype="<U"),
    }
    members.update(arrays)
    return members


def state_to_bytes(kind: str, state: Mapping[str, Any]) -> bytes:
    """The bytes :func:`save_state` would write for ``state`` of a ``kind`` model (same format, same
    checks), for containers that hold bytes rather than files, such as a trainer's checkpoint.

    Raises
    ------
    TypeError, ValueError
        As :func:`save_state`.
    """
    members = _members(kind, state)
    buffer = io.BytesIO()
    _write_archive(buffer, members)
    return buffer.getvalue()


def state_from_bytes(data: bytes, kind: str, *, source: str) -> StateDict:
    """Read a state from bytes written by :func:`state_to_bytes`, with every check of :func:`load_state`.

    Parameters
    ----------
    data : bytes
    kind : str
        Expected model class name.
    source : str
        What the bytes are, named in every error message (e.g. the checkpoint file that held them).

    Raises
    ------
    ValueError
        As :func:`load_state`; the message names ``source``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    handle = io.BytesIO(bytes(data))
    try:
        archive = _Archive(handle, file_size=len(data))
    except Exception as err:
        raise ValueError(f"{source} is not a valid onlinefa checkpoint (truncated or corrupted?): {err}") from err
    try:
        with archive.zip:
            return _read_state(archive, kind, adopt=False)
    except _Invalid as err:
        raise ValueError(f"{source} is not a valid {kind} checkpoint: {err}") from err
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:
        raise ValueError(f"{source} is not a valid onlinefa checkpoint (truncated or corrupted?): {err}") from err


def save_state(path: str | os.PathLike[str], kind: str, state: Mapping[str, Any]) -> None:
    """Write ``state`` of a ``kind`` model to ``path`` atomically, in the format described above.

    Parameters
    ----------
    path : str or path-like
        Destination, used exactly as given (no extension is added). Its directory must exist.
    kind : str
        Model class name stored in the file and checked by :func:`load_state`.
    state : mapping of str to value
        Values are NumPy arrays (bool, integer or float), Python/NumPy ints, floats, bools, str or None.
        Names are non-empty, must not start with ``"__"`` and must not contain path separators.

    Raises
    ------
    TypeError
        An entry of an unsupported type, or a non-string name or kind.
    ValueError
        A reserved or invalid name, or an integer that does not fit in 64 bits.
    OSError
        Writing failed; the destination is then unchanged and the temporary file removed.
    """
    members = _members(kind, state)
    destination = os.path.abspath(os.fspath(path))
    directory, base_name = os.path.split(destination)
    _remove_stale_temporaries(directory, base_name)
    temp_path, handle = _open_temporary(directory, base_name)
    try:
        with handle:
            _write_archive(handle, members)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
    fsync_directory(directory)


# -- reading ----------------------------------------------------------------------------------------
class _Invalid(ValueError):
    """Internal: the file is not a valid checkpoint (reported with the file name by load_state)."""


#: Bytes read from a member at a time: the only memory a load needs beyond the state itself.
_CHUNK_BYTES = 1 << 22
#: Little-endian float dtypes that an engine can adopt without a copy (see ``adopt`` of load_state).
_ADOPTABLE = {"<f4": "float32", "<f8": "float64"}


def _read_npy_header(name: str, stream: IO[bytes], data_bytes: int) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """Parse a ``.npy`` member's header from ``stream`` (a member of ``data_bytes`` bytes in all) and check
    it against the member's size before anything is allocated; returns (shape, fortran, dtype, data size)."""
    major, _ = np.lib.format.read_magic(stream)
    if major == 1:
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif major in (2, 3):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise _Invalid(f"member {name!r} has an unknown .npy version {major}")
    if dtype.kind not in _ARRAY_KINDS + "U" or dtype.hasobject or dtype.fields is not None:
        raise _Invalid(f"member {name!r} has an unsupported dtype {dtype}")
    needed = math.prod(shape) * dtype.itemsize
    available = data_bytes - stream.tell()
    if needed != available:
        raise _Invalid(f"member {name!r} holds {available} data bytes but its header needs {needed}")
    return shape, fortran_order, dtype, needed


def _read_exactly(stream: IO[bytes], size: int, name: str) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise _Invalid(f"member {name!r} ended early")
    return data


def _parse_npy(name: str, stream: IO[bytes], data_bytes: int) -> NDArray[Any]:
    """Decode a whole (small or non-streamable) ``.npy`` member."""
    shape, fortran_order, dtype, size = _read_npy_header(name, stream, data_bytes)
    flat = np.frombuffer(_read_exactly(stream, size, name), dtype=dtype)
    array: NDArray[Any] = flat.reshape(shape, order="F" if fortran_order else "C")
    return array


class _Archive:
    """The members of an open checkpoint archive, by entry name; reading a member verifies its CRC-32."""

    def __init__(self, handle: IO[bytes], file_size: int | None = None) -> None:
        self.zip = zipfile.ZipFile(handle)
        if file_size is None:
            file_size = os.fstat(handle.fileno()).st_size
        self.infos: dict[str, zipfile.ZipInfo] = {}
        for info in self.zip.infolist():
            if not info.filename.endswith(".npy"):
                raise _Invalid(f"unexpected member {info.filename!r}")
            name = info.filename[: -len(".npy")]
            if name in self.infos:
                raise _Invalid(f"member {name!r} appears twice")
            if info.file_size > file_size:
                raise _Invalid(f"member {name!r} claims {info.file_size} bytes, more than the file holds")
            self.infos[name] = info

    def read(self, name: str) -> NDArray[Any]:
        """A whole member, decoded."""
        info = self.infos[name]
        with self.zip.open(info) as member:
            array = _parse_npy(name, member, info.file_size)
            _check_ended(member, name)
        return array

    def header(self) -> dict[str, NDArray[Any]]:
        """The reserved members (format version, class, manifest, digest) that are present."""
        return {key: self.read(key) for key in _RESERVED if key in self.infos}


def _check_ended(member: IO[bytes], name: str) -> None:
    """Read past the end of a member, so that zip checks its CRC-32, and refuse trailing bytes."""
    if member.read(1):
        raise _Invalid(f"member {name!r} is longer than its header says")


def _new_sink(dtype: np.dtype[Any], shape: tuple[int, ...], adopt: bool) -> tuple[Any, NDArray[np.uint8] | None]:
    """Where a streamed member goes: a ``_core.StateArray`` the engine adopts without a copy (``adopt``
    and a little-endian float array), else a NumPy array; returns (target, its byte view or None)."""
    if adopt and dtype.str in _ADOPTABLE:
        from . import _core

        return _core.StateArray(_ADOPTABLE[dtype.str], list(shape)), None
    array = np.empty(shape, dtype=dtype)
    return array, array.reshape(-1).view(np.uint8)


def _stream_entry(archive: _Archive, name: str, entry_type: str, digest: Any, adopt: bool) -> Any:
    """Read one entry's member in chunks into its final memory, feeding the digest on the way."""
    info = archive.infos[name]
    with archive.zip.open(info) as member:
        shape, fortran_order, dtype, size = _read_npy_header(name, member, info.file_size)
        little = dtype.newbyteorder("<")
        digest.update(f"{name}\0{entry_type}\0{little.str}\0{','.join(str(n) for n in shape)}\0".encode())
        if fortran_order or dtype.str != little.str:  # not written by save_state: decode whole
            flat = np.frombuffer(_read_exactly(member, size, name), dtype=dtype)
            stored = flat.reshape(shape, order="F" if fortran_order else "C")
            digest.update(_little_endian_bytes(stored).data)
            _check_ended(member, name)
            return stored
        target, view = _new_sink(dtype, shape, adopt and entry_type == "array")
        for offset in range(0, size, _CHUNK_BYTES):
            chunk = _read_exactly(member, min(_CHUNK_BYTES, size - offset), name)
            digest.update(chunk)
            if view is None:
                target.write(offset, chunk)
            else:
                view[offset : offset + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        _check_ended(member, name)
    return target


def _check_version_and_class(members: Mapping[str, NDArray[Any]], kind: str) -> None:
    version = _header_scalar(members, _VERSION_KEY, "iu")
    if version != FORMAT_VERSION:
        newer = " (written by a newer onlinefa; upgrade to read it)" if version > FORMAT_VERSION else ""
        raise _Invalid(
            f"unsupported checkpoint format version {version}{newer}; this onlinefa reads version "
            f"{FORMAT_VERSION}"
        )
    stored_kind = _header_scalar(members, _CLASS_KEY, "U")
    if stored_kind != kind:
        raise _Invalid(f"it holds a model of class {stored_kind!r}, not {kind!r}")


def _header_scalar(members: Mapping[str, NDArray[Any]], key: str, kinds: str) -> Any:
    value = members.get(key)
    if value is None or value.shape != () or value.dtype.kind not in kinds:
        raise _Invalid(f"header entry {key} is missing or malformed")
    return value.item()


def _read_manifest(header: Mapping[str, NDArray[Any]], names: set[str]) -> dict[str, str]:
    try:
        manifest = json.loads(_header_scalar(header, _MANIFEST_KEY, "U"))
    except json.JSONDecodeError as err:
        raise _Invalid(f"the manifest is not valid JSON ({err})") from err
    if not isinstance(manifest, dict) or not all(
        isinstance(name, str) and entry_type in _ENTRY_TYPES for name, entry_type in manifest.items()
    ):
        raise _Invalid("the manifest is malformed")
    expected = {name for name, entry_type in manifest.items() if entry_type != "none"}
    present = names - set(_RESERVED)
    if expected - present:
        raise _Invalid(f"entries listed in the manifest are missing: {sorted(expected - present)}")
    if present - expected:
        raise _Invalid(f"entries not listed in the manifest: {sorted(present - expected)}")
    return manifest


def _decode_entry(name: str, entry_type: str, stored: Any) -> Any:
    if stored is None:
        return None
    if not isinstance(stored, np.ndarray):  # a _core.StateArray: adopted by the engine as it is
        return stored
    if entry_type == "array":
        if stored.dtype.kind not in _ARRAY_KINDS:
            raise _Invalid(f"entry {name!r} should be a numeric array, has dtype {stored.dtype}")
        native = stored.dtype.newbyteorder("=")
        if stored.dtype == native and stored.flags.c_contiguous and stored.flags.writeable:
            return stored
        return np.array(stored, dtype=native, order="C")
    allowed_kinds = {"int": "iu", "float": "f", "bool": "b", "str": "U"}[entry_type]
    if stored.shape != () or stored.dtype.kind not in allowed_kinds:
        raise _Invalid(f"entry {name!r} should be a {entry_type} scalar")
    return stored.item()


def _read_state(archive: _Archive, kind: str, adopt: bool) -> StateDict:
    """Check header and manifest, stream every entry (in digest order) and check the digest."""
    header = archive.header()
    _check_version_and_class(header, kind)
    manifest = _read_manifest(header, set(archive.infos))
    expected_digest = _header_scalar(header, _DIGEST_KEY, "U")
    digest = hashlib.sha256(_DIGEST_PREFIX)
    digest.update(f"{FORMAT_VERSION}\0{kind}\0".encode())
    stored: dict[str, Any] = {}
    for name in sorted(manifest):
        if manifest[name] == "none":
            digest.update(f"{name}\0none\0\0\0".encode())
        else:
            stored[name] = _stream_entry(archive, name, manifest[name], digest, adopt)
    if expected_digest != digest.hexdigest():
        raise _Invalid("its SHA-256 checksum does not match its content (the file was modified)")
    return {name: _decode_entry(name, manifest[name], stored.get(name)) for name in sorted(manifest)}


def _open_regular(path: str | os.PathLike[str], shown: str) -> IO[bytes]:
    """Open a regular file for reading; ValueError at once for devices, FIFOs, sockets and directories
    (``/dev/zero`` would otherwise be read forever, a FIFO would block)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{shown!r} is not a valid onlinefa checkpoint: it is not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_state(path: str | os.PathLike[str], kind: str, *, adopt: bool = False) -> StateDict:
    """Read a state written by :func:`save_state`, verifying format version, class and checksum.

    Each member is streamed in chunks of :data:`_CHUNK_BYTES` straight into its final array, so reading
    needs the state's size plus one chunk (not two or three copies of the state).

    Parameters
    ----------
    path : str or path-like
        Checkpoint file.
    kind : str
        Expected model class name.
    adopt : bool, default=False
        Return every little-endian float32/float64 array entry as an ``onlinefa._core.StateArray``, memory
        that a model's ``from_state`` takes over without copying it (used by the models' ``load``; each
        such entry can build one model). False: NumPy arrays.

    Returns
    -------
    dict
        The state as saved: arrays (native byte order, writable, C-ordered) and Python scalars.

    Raises
    ------
    ValueError
        The file is not a checkpoint, is truncated or corrupted, has an unknown format version,
        fails its checksum, or holds another class than ``kind``. The message names the file.
    OSError
        The file cannot be opened (e.g. :class:`FileNotFoundError`).
    """
    shown = os.fspath(path)
    with _open_regular(path, shown) as handle:
        try:
            archive = _Archive(handle)
        except Exception as err:  # any failure to parse what was opened means a damaged file
            raise ValueError(
                f"{shown!r} is not a valid onlinefa checkpoint (truncated or corrupted?): {err}"
            ) from err
        try:
            with archive.zip:
                return _read_state(archive, kind, adopt)
        except _Invalid as err:
            raise ValueError(f"{shown!r} is not a valid {kind} checkpoint: {err}") from err
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as err:
            raise ValueError(
                f"{shown!r} is not a valid onlinefa checkpoint (truncated or corrupted?): {err}"
            ) from err


def stored_class(path: str | os.PathLike[str]) -> str:
    """Name of the model class a checkpoint holds (checked in full by that class's ``load``).

    Raises
    ------
    ValueError
        The file is not a readable checkpoint of a supported format version (the message names the file).
    OSError
        The file cannot be opened.
    """
    shown = os.fspath(path)
    with _open_regular(path, shown) as handle:
        try:
            archive = _Archive(handle)
            with archive.zip:
                header = archive.header()
            kind: str = _header_scalar(header, _CLASS_KEY, "U")
            _check_version_and_class(header, kind)
        except Exception as err:
            raise ValueError(f"{shown!r} is not a valid onlinefa checkpoint (truncated or corrupted?): {err}") from err
    return kind
