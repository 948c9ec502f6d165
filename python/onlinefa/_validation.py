"""Input checks shared by the public classes: dtypes, shapes and hyper-parameters (a leaf module: it
imports nothing of the package)."""

from __future__ import annotations

import numbers
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

#: dtypes read in place (no copy) by the Rust core.
NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: Largest integer accepted for sizes, counts and seeds (beyond it nothing could be allocated anyway).
MAX_INT = 2**63 - 1

#: Largest magnitude accepted by the Gaussian helpers (squares must stay finite in float64).
MAX_ABS_VALUE = 1e100


_ARRAY_PROTOCOLS = ("__array_interface__", "__array_struct__", "__array__")


def as_numpy(data: object) -> NDArray[Any]:
    """View ``data`` as a NumPy array, without copying whenever NumPy can share its memory.

    Parameters
    ----------
    data : array-like, buffer or DLPack producer
        An ``ndarray`` is returned as is. Objects implementing a NumPy array protocol or the buffer
        protocol go through :func:`numpy.asarray`; objects that only implement DLPack
        (``__dlpack__``) through :func:`numpy.from_dlpack`. Anything else (lists, scalars) is
        converted by :func:`numpy.asarray`. A PyTorch ``bfloat16`` tensor (mixed-precision training;
        NumPy has no such dtype) is converted to float32, which holds each of its values exactly (a copy).

    Returns
    -------
    ndarray
        Shares memory with ``data`` whenever the source allows it (a read-only source gives a
        read-only array).

    Raises
    ------
    TypeError
        A DLPack producer that cannot be imported on the CPU (e.g. a GPU tensor, or an unsupported
        dtype); move it to host memory first. A tensor that requires grad (detach it first).
    ValueError
        A masked array with masked entries (masks are never ignored silently; one without masked
        entries is read as its data).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(6.0).reshape(2, 3)
    >>> np.shares_memory(as_numpy(memoryview(x)), x)
    True
    """
    if isinstance(data, np.ma.MaskedArray):
        return _unmasked(data)
    if isinstance(data, np.ndarray):
        return data
    if getattr(data, "requires_grad", False) is True:
        raise TypeError(
            f"the {type(data).__name__} requires grad; pass tensor.detach() (onlinefa never differentiates "
            "through its input)"
        )
    if _is_torch_bfloat16(data):
        # NumPy has no bfloat16; float32 holds every bfloat16 value exactly (same exponent range, 8 of its
        # 24 significand bits), so this copy changes no value.
        data = getattr(data, "float")()
    if hasattr(data, "__dlpack__") and not any(hasattr(data, name) for name in _ARRAY_PROTOCOLS):
        try:
            return np.from_dlpack(data)
        except (BufferError, TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"could not read the {type(data).__name__} through DLPack ({err}); "
                "pass an array in CPU memory with a bool, integer or float dtype"
            ) from err
    return np.asarray(data)


def _is_torch_bfloat16(data: object) -> bool:
    """Whether ``data`` is a PyTorch tensor of dtype bfloat16 (recognised without importing torch)."""
    return type(data).__module__.startswith("torch") and str(getattr(data, "dtype", "")) == "torch.bfloat16"


def _unmasked(data: np.ma.MaskedArray[Any, Any]) -> NDArray[Any]:
    """The data of a masked array without masked entries; ValueError when any entry is masked."""
    if np.ma.is_masked(data):
        raise ValueError(
            f"the masked array has {int(np.count_nonzero(np.ma.getmaskarray(data)))} masked value(s); onlinefa "
            "does not ignore them silently: drop or fill them first (e.g. X.filled(value) or X[~X.mask.any(axis=1)])"
        )
    plain: NDArray[Any] = np.ma.getdata(data)
    return plain


def core_readable(arr: NDArray[Any]) -> NDArray[Any]:
    """Return ``arr`` itself when the Rust core can read it in place, else a C-contiguous aligned copy.

    The core addresses an array element by element: it needs native byte order, a data pointer aligned
    to the item and every byte stride (of an axis longer than 1) a multiple of the item size. NumPy can
    express other layouts — a float field of a packed record array (row stride 8·D + 4 bytes),
    ``np.frombuffer`` at an odd offset, byte-swapped dtypes — and those are copied here, once, so every
    layout is read as its values. C/F order, steps and negative strides are read without a copy.
    """
    itemsize = arr.dtype.itemsize
    addressable = all(stride % itemsize == 0 for stride, length in zip(arr.strides, arr.shape) if length > 1)
    if arr.dtype.isnative and arr.flags.aligned and addressable:
        return arr
    return np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C")


def as_sample_matrix(X: ArrayLike, n_features: int, dtype: DTypeLike | None = None) -> NDArray[Any]:
    """Return ``X`` as an (n, D) float array the core reads in place, without copying when it can.

    float32/float64 arrays are kept as they are unless their layout needs a copy (see
    :func:`core_readable`); booleans, integers and float16 are converted once to float64; complex,
    object, string and other non-real inputs raise TypeError. A 1-D input of length D is one sample.
    ``dtype`` forces a dtype and a C-contiguous result: it is used by the NumPy query helpers, whose
    rounding would otherwise depend on the memory order of the input.

    Raises
    ------
    TypeError
        Non-numeric or complex input.
    ValueError
        Wrong number of dimensions or features.
    """
    arr = as_numpy(X)
    kind = arr.dtype.kind
    if kind not in "biuf":
        raise TypeError(
            f"expected real numeric samples (float32/float64, or ints/bools converted to float64), "
            f"got an array of dtype {arr.dtype}"
        )
    if dtype is not None:
        arr = np.ascontiguousarray(arr, dtype=dtype)
    elif arr.dtype.newbyteorder("=") not in NATIVE_FLOATS:
        arr = arr.astype(np.float64)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != n_features:
        raise ValueError(
            f"expected samples of shape (n_samples, {n_features}) or ({n_features},), got shape {np.shape(X)}"
        )
    return core_readable(arr)


def objects_to_float(arr: NDArray[Any]) -> NDArray[np.float64]:
    """Convert an object array whose elements are all real numbers to float64.

    Strings (even numeric ones such as ``"1.5"``), bytes, complex numbers, None and other objects raise
    TypeError: converting text to numbers silently hides a parsing problem of the caller.
    """
    flat = arr.reshape(-1)
    for index, item in enumerate(flat):
        if not isinstance(item, (numbers.Real, np.bool_)):
            raise TypeError(
                f"every element of an object array must be a real number (argument must be a real "
                f"number, not a string, number-like text or other object): element {index} (flat index) is "
                f"{type(item).__name__} {item!r:.40}; parse text into numbers explicitly"
            )
    return np.asarray(arr, dtype=np.float64)


def check_int(value: object, name: str, minimum: int, maximum: int = MAX_INT) -> int:
    """Return ``value`` as int: TypeError for non-integers, ValueError outside [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_bool(value: object, name: str) -> bool:
    """Return ``value`` if it is a bool (TypeError otherwise)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return bool(value)


def first_bad_row(x: NDArray[Any], limit: float = MAX_ABS_VALUE) -> int | None:
    """Index of the first row of ``x`` holding NaN, ±Inf or a magnitude above ``limit``, or None.

    Two reductions over the rows (their maxima and minima; a NaN propagates into both and compares false), so
    no temporary of the input's size is allocated. A 1-D ``x`` is one row.
    """
    if x.size == 0:
        return None
    highest = np.atleast_1d(x.max(axis=-1)).astype(np.float64)  # float64: float32 cannot hold the bound
    lowest = np.atleast_1d(x.min(axis=-1)).astype(np.float64)
    bad_rows = np.flatnonzero(~((highest <= limit) & (lowest >= -limit)))
    return int(bad_rows[0]) if bad_rows.size else None


def check_finite_samples(x: NDArray[Any]) -> NDArray[Any]:
    """Reject NaN, ±Inf and magnitudes above ``MAX_ABS_VALUE`` (ValueError naming the first bad row)."""
    row = first_bad_row(x)
    if row is not None:
        raise ValueError(
            f"row {row} contains NaN, infinity or a value with magnitude above {MAX_ABS_VALUE:g}"
        )
    return x


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of the strings ``choices`` (ValueError naming them otherwise)."""
    if not (isinstance(value, str) and value in choices):
        named = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}" if len(choices) > 1 else repr(choices[0])
        raise ValueError(f"{name} must be {named}, got {value!r}")
    return value


def check_dims(n_features: object, n_components: object) -> tuple[int, int]:
    """(D, K) as ints with D >= 2 and 1 <= K < D, the rank rule of online EM, SGA and mini-batch EM."""
    d = check_int(n_features, "n_features", 2)
    k = check_int(n_components, "n_components", 1)
    if k >= d:
        raise ValueError(f"n_components must be < n_features = {d}, got {k}")
    return d, k


def check_positive_float(value: object, name: str) -> float:
    """Return ``value`` as a finite float > 0 (ValueError otherwise, TypeError if not a number)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (np.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return out


#: The ``lr`` recorded with online SGA's whitened rule (which does not use it), so that every SGA checkpoint has
#: one.
SGA_UNUSED_LR = 1e-3


def sga_step_args(lr: object, scaling: object) -> tuple[dict[str, Any], float | str]:
    """Online SGA's engine arguments ``lr`` and ``rule`` for a user's ``lr``, and the value to report.

    ``"auto"`` is the whitened rule (steps of 1/t; needs ``scaling="data"``), a float > 0 the constant-step
    gradient rule. ValueError for any other string, for ``"auto"`` with another scaling, or a float <= 0.
    """
    value = check_sga_lr(lr)
    if value == "auto":
        if scaling != "data":
            raise ValueError("lr='auto' (the whitened steps) needs scaling='data'; give a float lr for "
                             f"scaling={scaling!r}")
        return {"lr": SGA_UNUSED_LR, "rule": "whitened"}, "auto"
    return {"lr": value, "rule": "gradient"}, value


def check_sga_lr(lr: object) -> float | str:
    """Online SGA's ``lr``: ``"auto"``, or a finite float > 0 (ValueError otherwise, TypeError if not a number)."""
    if isinstance(lr, str):
        if lr != "auto":
            raise ValueError(f"lr must be 'auto' or a float > 0, got {lr!r}")
        return lr
    return check_positive_float(lr, "lr")


#: What a ``seed`` parameter accepts (see :func:`check_seed`).
SeedLike = int | np.integer[Any] | np.random.Generator | np.random.SeedSequence | None


def check_seed(seed: object) -> int | None:
    """Return ``seed`` as a non-negative int below 2**64, or None.

    Parameters
    ----------
    seed : None, int, numpy.random.Generator or numpy.random.SeedSequence
        An int in [0, 2**64) is returned as is. A ``Generator`` gives ``int(seed.integers(0, 2**63 - 1))``:
        one draw, which advances the generator, as scikit-learn's ``check_random_state`` consumers do (the
        same fresh ``np.random.default_rng(0)`` always gives the same seed; passing one generator twice gives
        two different seeds). A ``SeedSequence`` gives the first 64-bit word of its ``generate_state``
        (deterministic; the sequence is not changed).

    Raises
    ------
    TypeError
        Anything else: floats, bools, strings, and a legacy ``numpy.random.RandomState`` (whose stream
        cannot be advanced the same way; pass ``int(rs.randint(2**31))`` or a ``Generator``).
    ValueError
        A negative int or one of 2**64 or more.
    """
    if seed is None:
        return None
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**63 - 1))
    if isinstance(seed, np.random.SeedSequence):
        return int(seed.generate_state(1, dtype=np.uint64)[0])
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        hint = (
            " (a legacy RandomState is not accepted as a seed: pass int(rs.randint(2**31)) or a "
            "numpy.random.Generator)" if isinstance(seed, np.random.RandomState) else ""
        )
        raise TypeError(
            "seed must be None, an int in [0, 2**64), a numpy.random.Generator or a numpy.random.SeedSequence, "
            f"got {type(seed).__name__}{hint}"
        )
    return check_int(seed, "seed", 0, 2**64 - 1)


class TorchDTypeLike(Protocol):
    """A ``torch.dtype`` as the type checker sees it (this module never imports torch)."""

    @property
    def is_floating_point(self) -> bool: ...

    @property
    def is_complex(self) -> bool: ...

    def to_real(self) -> Any: ...


#: What a ``dtype`` parameter of a state accepts (see :func:`check_dtype`).
StateDTypeLike = DTypeLike | TorchDTypeLike

#: The torch dtypes of a state, by their ``str``.
_TORCH_STATE_DTYPES = {"torch.float32": "float32", "torch.float64": "float64"}


def check_dtype(dtype: object) -> str:
    """Return the state dtype name, "float32" or "float64".

    Accepted: the names ``"float32"``/``"float64"`` (and NumPy's aliases such as ``"f4"``, ``"double"``),
    the type objects ``np.float32``/``np.float64`` (and Python's ``float``), ``np.dtype`` objects, and
    ``torch.float32``/``torch.float64`` (``torch.float``/``torch.double``), recognised without importing
    torch. Anything else, lower precisions included, raises ValueError.
    """
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = _TORCH_STATE_DTYPES.get(str(dtype))
        if name is None:
            raise ValueError(f"dtype must be float32 or float64 (torch.float32/torch.float64), got {dtype!r}")
        return name
    try:
        name = str(np.dtype(dtype).name)  # type: ignore[call-overload]
    except Exception as err:  # numpy raises TypeError, ValueError or even SyntaxError for odd strings
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}") from err
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    return name


def check_init(init: ArrayLike | None, n_features: int, n_components: int) -> NDArray[np.float64] | None:
    """Validate an explicit initial loading matrix (D×K, finite) and return it as float64."""
    if init is None:
        return None
    arr = np.asarray(init)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"init must be a real (D, K) array, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.shape != (n_features, n_components):
        raise ValueError(f"init has shape {arr.shape}, expected ({n_features}, {n_components})")
    if not np.all(np.isfinite(arr)):
        raise ValueError("init must contain only finite values")
    return arr
