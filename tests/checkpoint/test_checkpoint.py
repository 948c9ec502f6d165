"""Checkpoints: exact resumption, the documented file format, damage detection and atomic writes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from onlinefa import OnlineFactorAnalysis, checkpoint
from onlinefa.checkpoint import FORMAT_VERSION, load_state, save_state
from engine_state import engine_state

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]

D, K, WARMUP = 9, 3, 10
MODEL_CLASSES = [onlinefa.OnlineEM, onlinefa.OnlineSGA]


def new_model(model_class: Any, dtype: str) -> Any:
    extra = {"lr": 1e-2} if model_class is onlinefa.OnlineSGA else {}
    return model_class(D, K, n_warmup=WARMUP, seed=0, dtype=dtype, **extra)


def assert_same_state(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Bit-for-bit equality: same keys; arrays with equal dtype, shape and bytes; scalars of equal type
    and value (floats compared by their bytes, so -0.0 != 0.0 and NaN == NaN)."""
    assert sorted(left) == sorted(right)
    for key, value in left.items():
        other = right[key]
        if isinstance(value, np.ndarray):
            assert isinstance(other, np.ndarray), key
            assert (value.dtype, value.shape) == (other.dtype, other.shape), key
            assert value.tobytes() == other.tobytes(), key
        elif isinstance(value, float):
            assert type(other) is float and np.float64(value).tobytes() == np.float64(other).tobytes(), key
        else:
            assert type(value) is type(other) and value == other, key


# ---------------------------------------------------------------------------------------------------
# Exact resumption
# ---------------------------------------------------------------------------------------------------


def round_trip(model: Any, how: str, tmp_path: Path) -> Any:
    if how == "pickle":
        return pickle.loads(pickle.dumps(model))
    model.save(tmp_path / "model.ckpt")
    return type(model).load(tmp_path / "model.ckpt")


@pytest.mark.parametrize("how", ["save/load", "pickle"])
@pytest.mark.parametrize("split", [4, 120], ids=["in-warm-up", "after-warm-up"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("model_class", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_resume_is_bit_identical_to_never_stopping(
    model_class: Any, dtype: str, split: int, how: str, fa_stream: StreamFactory, tmp_path: Path
) -> None:
    X = fa_stream(D, K, 240, 0)
    uninterrupted = new_model(model_class, dtype)
    stopped = new_model(model_class, dtype)
    uninterrupted.update(X[:split])
    stopped.update(X[:split])
    resumed = round_trip(stopped, how, tmp_path)
    assert_same_state(engine_state(resumed), engine_state(stopped))
    for batch in np.array_split(X[split:], 3):
        uninterrupted.update(batch)
        resumed.update(batch)
    assert_same_state(engine_state(resumed), engine_state(uninterrupted))
    assert resumed.n_seen == 240 and resumed.dtype == dtype


@pytest.mark.parametrize("how", ["save/load", "pickle"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algorithm", ["em", "sga"])
def test_estimator_resume_is_bit_identical(
    algorithm: str, dtype: str, how: str, fa_stream: StreamFactory, tmp_path: Path
) -> None:
    X = fa_stream(D, K, 240, 1)
    params: dict[str, Any] = {"algorithm": algorithm, "n_warmup": WARMUP, "dtype": dtype, "random_state": 5, "lr": 2e-3}
    uninterrupted = OnlineFactorAnalysis(K, **params).partial_fit(X[:100])
    stopped = OnlineFactorAnalysis(K, **params).partial_fit(X[:100])
    resumed = round_trip(stopped, how, tmp_path)
    assert resumed.get_params() == stopped.get_params()
    for batch in np.array_split(X[100:], 4):
        uninterrupted.partial_fit(batch)
        resumed.partial_fit(batch)
    assert_same_state(engine_state(resumed._model), engine_state(uninterrupted._model))


def test_unfitted_estimator_round_trips_its_parameters(tmp_path: Path) -> None:
    fa = OnlineFactorAnalysis(4, algorithm="sga", n_warmup=7, lr=0.5, noise_floor=1e-6, dtype="float32")
    fa.save(tmp_path / "fa.npz")
    restored = OnlineFactorAnalysis.load(tmp_path / "fa.npz")
    assert restored.get_params() == fa.get_params()
    assert not hasattr(restored, "n_features_in_")


def test_estimator_with_a_random_state_object_cannot_be_saved_portably(tmp_path: Path) -> None:
    fa = OnlineFactorAnalysis(2, random_state=np.random.RandomState(0))
    with pytest.raises(TypeError, match="random_state"):
        fa.save(tmp_path / "fa.npz")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# The documented format
# ---------------------------------------------------------------------------------------------------


def documented_digest(version: int, kind: str, manifest: dict[str, str], members: dict[str, np.ndarray]) -> str:
    """Transcription of the digest specified in onlinefa.checkpoint's documentation."""
    digest = hashlib.sha256(b"onlinefa-checkpoint\0" + f"{version}\0{kind}\0".encode())
    for name in sorted(manifest):
        if manifest[name] == "none":
            digest.update(f"{name}\0none\0\0\0".encode())
            continue
        array = members[name]
        shape = ",".join(map(str, array.shape))
        digest.update(f"{name}\0{manifest[name]}\0{array.dtype.newbyteorder('<').str}\0{shape}\0".encode())
        digest.update(array.astype(array.dtype.newbyteorder("<")).tobytes(order="C"))
    return digest.hexdigest()


def test_file_is_a_plain_npz_with_the_documented_layout(fa_stream: StreamFactory, tmp_path: Path) -> None:
    model = new_model(onlinefa.OnlineEM, "float32")
    model.update(fa_stream(D, K, 50, 2))
    model.save(tmp_path / "em.npz")
    state = engine_state(model)
    with np.load(tmp_path / "em.npz", allow_pickle=False) as data:
        members = {name: data[name] for name in data.files}
    assert int(members.pop("__format__")) == FORMAT_VERSION == 1
    assert str(members.pop("__class__")) == "OnlineEM"
    manifest = json.loads(str(members.pop("__manifest__")))
    stored_digest = str(members.pop("__sha256__"))
    expected_types = {key: "array" if isinstance(v, np.ndarray) else {bool: "bool", int: "int", float: "float", str: "str"}[type(v)]
                      for key, v in state.items()}
    assert manifest == expected_types
    assert sorted(members) == sorted(state)
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            assert members[key].dtype == value.dtype.newbyteorder("<") and members[key].tobytes() == value.tobytes()
        else:
            assert members[key].shape == () and members[key].item() == value
    assert stored_digest == documented_digest(1, "OnlineEM", manifest, members)


def test_same_state_gives_identical_bytes(fa_stream: StreamFactory, tmp_path: Path) -> None:
    model = new_model(onlinefa.OnlineSGA, "float64")
    model.update(fa_stream(D, K, 30, 3))
    model.save(tmp_path / "a")
    model.save(tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # the name is used as given


EVERY_KIND_OF_ENTRY: dict[str, Any] = {
    "f64": np.array([[1.5, -0.0], [np.nan, 5e-324]]),
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "big_endian": np.arange(4, dtype=">f8"),
    "ints": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "bools": np.array([True, False]),
    "zero_d": np.array(2.5),
    "empty": np.zeros((0, 3)),
    "int": 7,
    "u64_max": 2**64 - 1,
    "negative": -(2**63),
    "float": -0.0,
    "tiny": 5e-324,
    "flag": True,
    "text": "héllo wörld",
    "empty_text": "",
    "nothing": None,
}


def test_every_entry_type_round_trips_exactly(tmp_path: Path) -> None:
    save_state(tmp_path / "s.npz", "Thing", EVERY_KIND_OF_ENTRY)
    loaded = load_state(tmp_path / "s.npz", "Thing")
    expected = {k: (np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("=")) if isinstance(v, np.ndarray) else v)
                for k, v in EVERY_KIND_OF_ENTRY.items()}
    assert_same_state(loaded, expected)
    assert loaded["nothing"] is None
    assert all(v.flags.writeable and v.flags.c_contiguous and v.dtype.isnative
               for v in loaded.values() if isinstance(v, np.ndarray))


@pytest.mark.parametrize(("state", "error", "needle"), [
    ({"x": np.array([object()])}, TypeError, "dtype object"),
    ({"x": np.array([1j])}, TypeError, "complex"),
    ({"x": [1.0, 2.0]}, TypeError, "list"),
    ({"x": 2**64}, ValueError, "64 bits"),
    ({"__format__": 1}, ValueError, "reserved"),
    ({"a/b": 1}, ValueError, "reserved or not a valid"),
    ({"": 1}, TypeError, "non-empty"),
    ({3: 1}, TypeError, "non-empty strings"),
    ({"s": "a\0b"}, ValueError, "NUL"),
])
def test_unsupported_state_is_rejected_before_touching_disk(
    state: dict[Any, Any], error: type, needle: str, tmp_path: Path
) -> None:
    with pytest.raises(error, match=needle):
        save_state(tmp_path / "s.npz", "Thing", state)
    assert list(tmp_path.iterdir()) == []


def test_new_files_get_ordinary_permissions(tmp_path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    save_state(tmp_path / "s.npz", "Thing", {"x": 1})
    assert (tmp_path / "s.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        onlinefa.OnlineEM.load(tmp_path / "absent.npz")


# ---------------------------------------------------------------------------------------------------
# Damaged, foreign and mismatched files
# ---------------------------------------------------------------------------------------------------


@pytest.fixture()
def em_file(fa_stream: StreamFactory, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    model = new_model(onlinefa.OnlineEM, "float64")
    model.update(fa_stream(D, K, 60, 4))
    path = tmp_path / "em.npz"
    model.save(path)
    return path, engine_state(model)


def rewrite_members(source: Path, target: Path, edit: Callable[[dict[str, bytes]], None]) -> None:
    """Copy a checkpoint's zip members through ``edit`` into a new, valid zip (fresh CRCs)."""
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    edit(members)
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("keep", [0, 1, 30, 0.5, -1, -22, -100], ids=str)
def test_truncated_file_is_a_value_error(keep: float, em_file: tuple[Path, dict[str, Any]]) -> None:
    path, _ = em_file
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data) if keep < 0 else keep
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="not a valid onlinefa checkpoint"):
        onlinefa.OnlineEM.load(path)


SMALL_STATE: dict[str, Any] = {"weights": np.array([1.0, -2.0, 3.5]), "count": 11, "name": "w", "scale": 0.25}


def member_payloads(path: Path) -> list[range]:
    """Byte ranges of the members' contents (the .npy files) inside a zip archive."""
    payloads = []
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_length + extra_length
            payloads.append(range(start, start + info.compress_size))
    return payloads


@pytest.mark.slow
def test_every_single_byte_flip_is_detected_or_harmless(tmp_path: Path) -> None:
    """Flip each byte of a small checkpoint in turn: loading must raise ValueError or give back exactly
    the saved state. Never another exception, never a different state. Harmless flips may only hit
    zip metadata that readers ignore (e.g. the local headers' timestamps, which duplicate the central
    directory); every flip inside a member's content must be detected."""
    path = tmp_path / "small.npz"
    save_state(path, "Thing", SMALL_STATE)
    original = path.read_bytes()
    payloads = member_payloads(path)
    damaged = tmp_path / "damaged.npz"
    for position in range(len(original)):
        flipped = bytearray(original)
        flipped[position] ^= 0xFF
        damaged.write_bytes(bytes(flipped))
        try:
            loaded = load_state(damaged, "Thing")
        except ValueError:
            continue
        assert_same_state(loaded, SMALL_STATE)
        assert not any(position in payload for payload in payloads), f"flip at {position} went unnoticed"


def test_byte_flips_in_a_model_checkpoint(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, state = em_file
    original = path.read_bytes()
    damaged = tmp_path / "damaged.npz"
    for position in np.random.default_rng(0).choice(len(original), size=150, replace=False):
        flipped = bytearray(original)
        flipped[position] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        try:
            model = onlinefa.OnlineEM.load(damaged)
        except ValueError:
            continue
        assert_same_state(engine_state(model), state)


def test_modified_content_with_valid_zip_fails_the_checksum(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, state = em_file
    changed = state["mean"].copy()
    changed[0] += 1.0
    rewrite_members(path, tmp_path / "edited.npz", lambda m: m.__setitem__("mean.npy", npy_bytes(changed)))
    with pytest.raises(ValueError, match="checksum"):
        onlinefa.OnlineEM.load(tmp_path / "edited.npz")


def test_unknown_format_version(em_file: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, state = em_file
    for version in (2, 0):
        with monkeypatch.context() as patch:
            patch.setattr(checkpoint, "FORMAT_VERSION", version)
            save_state(tmp_path / f"v{version}.npz", "OnlineEM", state)
        with pytest.raises(ValueError, match=f"unsupported checkpoint format version {version}"):
            onlinefa.OnlineEM.load(tmp_path / f"v{version}.npz")
    with pytest.raises(ValueError, match="newer onlinefa"):
        onlinefa.OnlineEM.load(tmp_path / "v2.npz")


def test_wrong_class_is_a_value_error(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = em_file
    with pytest.raises(ValueError, match="'OnlineEM', not 'OnlineSGA'"):
        onlinefa.OnlineSGA.load(path)
    with pytest.raises(ValueError, match="'OnlineEM', not 'OnlineFactorAnalysis'"):
        OnlineFactorAnalysis.load(path)
    OnlineFactorAnalysis(2).save(tmp_path / "fa.npz")
    with pytest.raises(ValueError, match="'OnlineFactorAnalysis', not 'OnlineEM'"):
        onlinefa.OnlineEM.load(tmp_path / "fa.npz")


def test_missing_member_is_a_value_error(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = em_file
    rewrite_members(path, tmp_path / "cut.npz", lambda m: m.pop("a_bar.npy"))
    with pytest.raises(ValueError, match="missing: \\['a_bar'\\]"):
        onlinefa.OnlineEM.load(tmp_path / "cut.npz")


def test_extra_member_is_a_value_error(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = em_file
    rewrite_members(path, tmp_path / "extra.npz", lambda m: m.__setitem__("intruder.npy", npy_bytes(np.zeros(2))))
    with pytest.raises(ValueError, match="not listed in the manifest: \\['intruder'\\]"):
        onlinefa.OnlineEM.load(tmp_path / "extra.npz")


def test_consistent_file_missing_a_model_entry_is_a_value_error(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    # Well-formed file (valid checksum) whose state lacks an entry: the model's own validation speaks.
    _, state = em_file
    state.pop("a_bar")
    save_state(tmp_path / "incomplete.npz", "OnlineEM", state)
    with pytest.raises(ValueError, match="a_bar"):
        onlinefa.OnlineEM.load(tmp_path / "incomplete.npz")


def test_inconsistent_model_state_is_a_value_error(em_file: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, state = em_file
    state["a_bar"] = state["a_bar"][:-1]  # one row short
    save_state(tmp_path / "short.npz", "OnlineEM", state)
    with pytest.raises(ValueError, match="a_bar"):
        onlinefa.OnlineEM.load(tmp_path / "short.npz")


def test_non_checkpoint_files_are_value_errors(tmp_path: Path) -> None:
    (tmp_path / "text.npz").write_text("hello")
    np.save(tmp_path / "plain.npy", np.zeros(3))
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    np.savez(tmp_path / "pickled.npz", x=np.array([{"a": 1}], dtype=object))
    for name in ("text.npz", "plain.npy", "other.npz", "pickled.npz"):
        with pytest.raises(ValueError, match="not a valid"):
            onlinefa.OnlineEM.load(tmp_path / name)


# ---------------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------------


class SimulatedCrash(Exception):
    """Stands for the process dying mid-save."""


def crash_while_writing(real_write_array: Callable[..., None]) -> Callable[..., None]:
    """A write_array that writes half of the first member, then dies."""

    def half_write(stream: Any, array: np.ndarray, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        real_write_array(buffer, array, **kwargs)
        stream.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise SimulatedCrash("power cut")

    return half_write


def crash_in(name: str) -> Callable[..., None]:
    def crash(*args: Any, **kwargs: Any) -> None:
        raise SimulatedCrash(f"died in {name}")

    return crash


@pytest.mark.parametrize("where", ["write_array", "fsync", "replace", "keyboard-interrupt"])
def test_crash_mid_save_keeps_the_previous_checkpoint(
    where: str, em_file: tuple[Path, dict[str, Any]], fa_stream: StreamFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, state = em_file
    before = path.read_bytes()
    model = onlinefa.OnlineEM.load(path)
    model.update(fa_stream(D, K, 10, 9))  # newer state, whose save will "crash"
    error: type[BaseException] = SimulatedCrash
    if where == "write_array":
        monkeypatch.setattr(np.lib.format, "write_array", crash_while_writing(np.lib.format.write_array))
    elif where == "fsync":
        monkeypatch.setattr(checkpoint.os, "fsync", crash_in("fsync"))
    elif where == "replace":
        monkeypatch.setattr(checkpoint.os, "replace", crash_in("replace"))
    else:
        monkeypatch.setattr(np.lib.format, "write_array", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        error = KeyboardInterrupt
    with pytest.raises(error):
        model.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert_same_state(engine_state(onlinefa.OnlineEM.load(path)), state)


def test_crash_on_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(np.lib.format, "write_array", crash_while_writing(np.lib.format.write_array))
    with pytest.raises(SimulatedCrash):
        save_state(tmp_path / "new.npz", "Thing", SMALL_STATE)
    assert list(tmp_path.iterdir()) == []
