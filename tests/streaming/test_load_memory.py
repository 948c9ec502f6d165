"""Loading a checkpoint needs about the model's own memory, not two or three copies of it; so does saving one.

Each measurement runs in a fresh Python process (Linux: the kernel's peak-RSS counter is reset through
``/proc/self/clear_refs``), so nothing else the test suite allocated counts. The loaded model itself is
1.0× the checkpoint file (the file is the state's arrays plus a few hundred bytes of headers); the reader
streams each member in chunks of ``onlinefa.checkpoint._CHUNK_BYTES`` (4 MiB, read into a bytes object
and copied once), so the bound is 1.0× the file + 0.3× for allocator slack and the interpreter's own
growth, + 2 chunks. Reading the whole state into Python and copying it into the engine (what ``load``
did before) peaks at 3.0×; ``from_state`` of a dict of arrays at 2.0× on top of the dict.

Saving (and ``get_state``) makes one copy of the state (the arrays handed to Python) and writes it in
chunks, so it has the same bound. Building the copy through a per-row temporary and copying it once more
(what ``OnlineEM.get_state`` did) peaked at 2.0× for float32 state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa.checkpoint import _CHUNK_BYTES

from peak_rss import PRELUDE

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak-RSS counter"
)

# ~22 MB of state: large enough that arrays dominate, small enough to build and load in well under a second.
SIZES = {"float64": (200_000, 10), "float32": (400_000, 10)}


CHILD = PRELUDE + r"""
import json, sys
import onlinefa
from onlinefa.checkpoint import load_state


cls_name, call, path = sys.argv[1], sys.argv[2], sys.argv[3]
cls = getattr(onlinefa, cls_name)
state = load_state(path, cls_name) if call == "from_state" else None
model = cls.load(path) if call in ("save", "get_state") else None  # built before the counter is reset
reset_peak()
before = rss("VmRSS:")
if call == "load":
    result = cls.load(path)
elif call == "load_state":
    result = load_state(path, cls_name)
elif call == "save":
    model.save(path + ".out")
elif call == "get_state":
    result = model._core.get_state()
else:
    result = cls.__new__(cls)
    result.__setstate__({"class": cls_name, "state": state})
print(json.dumps({"extra": rss("VmHWM:") - before}))
"""


def peak_growth(cls_name: str, call: str, path: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, cls_name, call, str(path)], check=True, capture_output=True, text=True
    ).stdout
    extra: int = json.loads(out)["extra"]
    return extra


def saved_model(cls_name: str, dtype: str, path: Path) -> Path:
    d, k = SIZES[dtype]
    rng = np.random.default_rng(0)
    model = getattr(onlinefa, cls_name)(d, k, seed=0, dtype=dtype)
    model.update(rng.standard_normal((k + 4, d)).astype(dtype))
    model.save(path)
    return path


def bound(file_bytes: int, copies: float) -> float:
    return (copies + 0.3) * file_bytes + 2 * _CHUNK_BYTES


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls_name", ["OnlineEM", "OnlineSGA"])
@pytest.mark.slow
def test_load_peaks_at_about_one_state(cls_name: str, dtype: str, tmp_path: Path) -> None:
    path = saved_model(cls_name, dtype, tmp_path / "model.ckpt")
    size = path.stat().st_size
    growth = peak_growth(cls_name, "load", path)
    assert size <= growth <= bound(size, 1.0), f"load grew the peak by {growth / size:.2f}x the file"


@pytest.mark.parametrize("call", ["save", "get_state"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls_name", ["OnlineEM", "OnlineSGA"])
@pytest.mark.slow
def test_save_and_get_state_peak_at_about_one_state(cls_name: str, dtype: str, call: str, tmp_path: Path) -> None:
    path = saved_model(cls_name, dtype, tmp_path / "model.ckpt")
    size = path.stat().st_size
    growth = peak_growth(cls_name, call, path)
    assert growth <= bound(size, 1.0), f"{call} grew the peak by {growth / size:.2f}x the file"
    if call == "save":
        assert Path(f"{path}.out").read_bytes() == path.read_bytes()  # same state, same bytes


def test_load_state_and_from_state_make_one_copy(tmp_path: Path) -> None:
    path = saved_model("OnlineEM", "float32", tmp_path / "model.ckpt")
    size = path.stat().st_size
    growth = peak_growth("OnlineEM", "load_state", path)
    assert growth <= bound(size, 1.0), f"load_state grew the peak by {growth / size:.2f}x the file"
    # from_state of a dict of NumPy arrays (unpickling) copies each array once, into the engine.
    growth = peak_growth("OnlineEM", "from_state", path)
    assert growth <= bound(size, 1.0), f"from_state grew the peak by {growth / size:.2f}x the file"


def test_loaded_state_arrays_are_adopted_once(tmp_path: Path) -> None:
    # The arrays a model's load hands to the engine are moved into it: a second model cannot reuse them.
    from onlinefa.checkpoint import load_state

    path = saved_model("OnlineEM", "float64", tmp_path / "model.ckpt")
    state = load_state(path, "OnlineEM", adopt=True)
    assert isinstance(state["a_bar"], onlinefa._core.StateArray)
    first = onlinefa.OnlineEM.__new__(onlinefa.OnlineEM)
    first.__setstate__({"class": "OnlineEM", "state": state})
    np.testing.assert_array_equal(first._core.get_state()["a_bar"], load_state(path, "OnlineEM")["a_bar"])
    second = onlinefa.OnlineEM.__new__(onlinefa.OnlineEM)
    with pytest.raises(ValueError, match="already used"):
        second.__setstate__({"class": "OnlineEM", "state": state})


@pytest.mark.parametrize("chunk", [20, 24, 1 << 22])
@pytest.mark.parametrize("adopt", [False, True])
def test_streamed_read_is_bit_identical_at_any_chunk_size(
    chunk: int, adopt: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks that split items (20 bytes) and chunks larger than the members: the bytes land where they were.
    from onlinefa import checkpoint

    rng = np.random.default_rng(3)
    model = onlinefa.OnlineEM(37, 3, seed=1, dtype="float32")
    model.update(rng.standard_normal((9, 37)).astype(np.float32))
    model.save(tmp_path / "m.ckpt")
    expected = model._core.get_state()
    monkeypatch.setattr(checkpoint, "_CHUNK_BYTES", chunk)
    loaded = onlinefa.OnlineEM.load(tmp_path / "m.ckpt") if adopt else None
    state = loaded._core.get_state() if loaded is not None else checkpoint.load_state(tmp_path / "m.ckpt", "OnlineEM")
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            assert state[key].dtype == value.dtype and state[key].tobytes() == value.tobytes(), key
        else:
            assert state[key] == value, key


def test_foreign_byte_order_and_fortran_members_load(tmp_path: Path) -> None:
    # A valid file not written by save_state (big-endian and Fortran-ordered members, digest over the
    # documented little-endian C-order bytes) loads with the same values, adopted or not.
    import io
    import zipfile

    from onlinefa import checkpoint

    state = {"a": np.arange(6.0).reshape(2, 3), "b": np.arange(4, dtype=np.float32), "n": 3}
    stored = {"a": np.asfortranarray(state["a"]), "b": state["b"].astype(">f4"), "n": np.array(3, dtype="<i8")}
    manifest = {"a": "array", "b": "array", "n": "int"}
    members = {
        "__format__": np.array(1, dtype="<i8"), "__class__": np.array("Thing"),
        "__manifest__": np.array(json.dumps(manifest)),
        "__sha256__": np.array(checkpoint.state_digest(1, "Thing", manifest, stored)),
        **stored,
    }
    with zipfile.ZipFile(tmp_path / "foreign.npz", "w") as archive:
        for name, array in members.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array, allow_pickle=False)
            archive.writestr(f"{name}.npy", buffer.getvalue())
    for adopt in (False, True):
        loaded = checkpoint.load_state(tmp_path / "foreign.npz", "Thing", adopt=adopt)
        np.testing.assert_array_equal(loaded["a"], state["a"])
        np.testing.assert_array_equal(loaded["b"], state["b"])
        assert loaded["a"].dtype.isnative and loaded["b"].dtype.isnative and loaded["n"] == 3
