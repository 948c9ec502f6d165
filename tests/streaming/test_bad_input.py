"""Bad input never corrupts state; accepted layouts and dtypes give the same result.

"State unchanged" is checked twice: every observable array bit-for-bit before/after the failed call,
and (for the hidden running averages Ā, B̄, d̄² that are not exposed) by feeding the same good data
afterwards to the model and to an untouched twin and comparing the results.
"""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]
Snapshot = Callable[[Any], dict[str, Any]]
RelErr = Callable[[npt.ArrayLike, npt.ArrayLike], float]

N_FEATURES = 7  # distinctive number, so "names the expected shape" can be checked in messages
N_COMPONENTS = 2
MODEL_CLASSES = ["OnlineEM", "OnlineSGA"]
# Two models fed identical data must agree; allow last-bit differences only (e.g. a parallel sum).
TWIN_RTOL = 1e-12


def new_model(model_class: str, **kwargs: Any) -> Any:
    """A D = 7, K = 2 model of ``model_class`` with small warm-up and fixed seed; kwargs override."""
    defaults: dict[str, Any] = {"n_warmup": 3, "seed": 0}
    if model_class == "OnlineSGA":
        defaults["lr"] = 1e-2
    return getattr(onlinefa, model_class)(N_FEATURES, N_COMPONENTS, **(defaults | kwargs))


def warmed_up_pair(model_class: str, fa_stream: StreamFactory) -> tuple[Any, Any]:
    """Two identical models that have already seen 10 rows (past warm-up)."""
    stream = fa_stream(N_FEATURES, N_COMPONENTS, 10, 1)
    model, twin = new_model(model_class), new_model(model_class)
    model.update(stream)
    twin.update(stream)
    return model, twin


def assert_snapshot_equal(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Bit-for-bit equality (values and dtypes) of two :func:`state_snapshot` results."""
    assert before["n_seen"] == after["n_seen"]
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        assert after[name].dtype == before[name].dtype


def assert_hidden_state_intact(model: Any, twin: Any, fa_stream: StreamFactory, rel_err: RelErr) -> None:
    """After the failed call, ``model`` must evolve exactly like ``twin`` (which never saw it)."""
    more = fa_stream(N_FEATURES, N_COMPONENTS, 15, 2)
    model.update(more)
    twin.update(more)
    assert model.n_seen == twin.n_seen
    for name in ("mean", "loadings", "noise_variance"):
        assert rel_err(getattr(model, name), getattr(twin, name)) <= TWIN_RTOL, name


@pytest.fixture(scope="session")
def snapshot() -> Snapshot:
    """Copies of every observable state array plus ``n_seen``, also during warm-up.

    Overrides the shared fixture: before warm-up ends ``loadings``/``noise_variance`` raise
    ``NotFittedError``, so the (F, ψ) the next E-step will use come from ``initial_parameters()``.
    """

    def take(model: Any) -> dict[str, Any]:
        if model.is_fitted:
            loadings, noise_variance = model.loadings, model.noise_variance
        else:
            loadings, noise_variance = model.initial_parameters()
        return {
            "mean": np.array(model.mean, copy=True),
            "loadings": np.array(loadings, copy=True),
            "noise_variance": np.array(noise_variance, copy=True),
            "n_seen": int(model.n_seen),
        }

    return take


def mentions_number(message: str, number: int) -> bool:
    """Whether ``number`` appears in ``message`` as a whole number (not inside a longer one)."""
    return re.search(rf"(?<![\d.]){number}(?![\d.])", message) is not None


# ---------------------------------------------------------------------------------------------
# update(): wrong shapes
# ---------------------------------------------------------------------------------------------

WRONG_SHAPES = [(N_FEATURES + 1,), (N_FEATURES - 1,), (4, N_FEATURES + 2), (2, 3, N_FEATURES), (N_FEATURES, 1)]


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("shape", WRONG_SHAPES, ids=str)
def test_wrong_shape_raises_and_leaves_state(
    model_class: str, shape: tuple[int, ...], fa_stream: StreamFactory, snapshot: Snapshot,
    rel_err: RelErr,
) -> None:
    model, twin = warmed_up_pair(model_class, fa_stream)
    before = snapshot(model)
    bad = np.ones(shape)
    with pytest.raises(ValueError) as excinfo:
        model.update(bad)
    assert mentions_number(str(excinfo.value), N_FEATURES), str(excinfo.value)
    assert_snapshot_equal(before, snapshot(model))
    assert_hidden_state_intact(model, twin, fa_stream, rel_err)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_scalar_input_raises(model_class: str, snapshot: Snapshot) -> None:
    model = new_model(model_class)
    before = snapshot(model)
    with pytest.raises(ValueError):
        model.update(np.float64(1.0))
    assert_snapshot_equal(before, snapshot(model))


# ---------------------------------------------------------------------------------------------
# update(): NaN / ±Inf anywhere in a batch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_non_finite_batch_raises_naming_first_bad_row(
    model_class: str, bad_value: float, dtype: Any, fa_stream: StreamFactory, snapshot: Snapshot,
    rel_err: RelErr,
) -> None:
    model, twin = warmed_up_pair(model_class, fa_stream)
    before = snapshot(model)
    batch = fa_stream(N_FEATURES, N_COMPONENTS, 9, 3).astype(dtype)
    first_bad_row = 4
    batch[first_bad_row, 5] = bad_value
    batch[8, 0] = bad_value  # a later bad row must not be the one reported
    with pytest.raises(ValueError) as excinfo:
        model.update(batch)
    message = str(excinfo.value)
    assert mentions_number(message, first_bad_row), message
    assert not mentions_number(message, 8), message
    assert_snapshot_equal(before, snapshot(model))
    assert_hidden_state_intact(model, twin, fa_stream, rel_err)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_single_row_raises(
    model_class: str, bad_value: float, fa_stream: StreamFactory, snapshot: Snapshot,
    rel_err: RelErr,
) -> None:
    model, twin = warmed_up_pair(model_class, fa_stream)
    before = snapshot(model)
    row = np.ones(N_FEATURES)
    row[-1] = bad_value
    with pytest.raises(ValueError):
        model.update(row)
    assert_snapshot_equal(before, snapshot(model))
    assert_hidden_state_intact(model, twin, fa_stream, rel_err)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_non_finite_in_last_row_of_large_batch_applies_nothing(
    model_class: str, fa_stream: StreamFactory, snapshot: Snapshot, rel_err: RelErr
) -> None:
    """A bad value at the very end of a long batch: none of the good rows before it is applied."""
    model, twin = warmed_up_pair(model_class, fa_stream)
    before = snapshot(model)
    batch = fa_stream(N_FEATURES, N_COMPONENTS, 500, 4)
    batch[-1, -1] = np.nan
    with pytest.raises(ValueError) as excinfo:
        model.update(batch)
    assert mentions_number(str(excinfo.value), 499), str(excinfo.value)
    assert_snapshot_equal(before, snapshot(model))
    assert_hidden_state_intact(model, twin, fa_stream, rel_err)


# ---------------------------------------------------------------------------------------------
# update(): non-numeric input
# ---------------------------------------------------------------------------------------------

NON_NUMERIC = {
    "object": np.array([object()] * N_FEATURES, dtype=object),
    "object-2d": np.full((3, N_FEATURES), None, dtype=object),
    "str-array": np.array(["a"] * N_FEATURES),
    "str": "not an array",
    "bytes": b"1234567",
    "none": None,
    "dict": {"x": 1.0},
}


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("bad", list(NON_NUMERIC.values()), ids=list(NON_NUMERIC))
def test_non_numeric_input_raises_type_error(
    model_class: str, bad: Any, fa_stream: StreamFactory, snapshot: Snapshot, rel_err: RelErr
) -> None:
    model, twin = warmed_up_pair(model_class, fa_stream)
    before = snapshot(model)
    with pytest.raises(TypeError):
        model.update(bad)
    assert_snapshot_equal(before, snapshot(model))
    assert_hidden_state_intact(model, twin, fa_stream, rel_err)


# ---------------------------------------------------------------------------------------------
# Construction: invalid hyper-parameters
# ---------------------------------------------------------------------------------------------

COMMON_BAD_KWARGS: list[tuple[int, int, dict[str, Any]]] = [
    (5, 5, {}),  # K == D
    (5, 6, {}),  # K > D
    (5, 0, {}),  # K < 1
    (5, -1, {}),
    (0, 0, {}),
    (5, 2, {"n_warmup": -1}),
    (5, 2, {"init": np.ones((5, 3))}),  # wrong K
    (5, 2, {"init": np.ones((4, 2))}),  # wrong D
    (5, 2, {"init": np.ones((2, 5))}),  # transposed
    (5, 2, {"init": np.ones(10)}),  # flat
    (5, 2, {"init": np.where(np.eye(5, 2) > 0, np.nan, 1.0)}),
    (5, 2, {"init": np.where(np.eye(5, 2) > 0, np.inf, 1.0)}),
    (5, 2, {"init": np.where(np.eye(5, 2) > 0, -np.inf, 1.0)}),
    (5, 2, {"noise_floor": 0.0}),
    (5, 2, {"noise_floor": -1e-3}),
    (5, 2, {"noise_floor": np.nan}),
]
SGA_BAD_KWARGS: list[tuple[int, int, dict[str, Any]]] = [
    (5, 2, {"lr": 0.0}),
    (5, 2, {"lr": -1e-3}),
    (5, 2, {"lr": np.nan}),
    (5, 2, {"lr": np.inf}),
]
BAD_CONSTRUCTIONS = [("OnlineEM", *case) for case in COMMON_BAD_KWARGS] + [
    ("OnlineSGA", *case) for case in COMMON_BAD_KWARGS + SGA_BAD_KWARGS
]


@pytest.mark.parametrize(
    ("model_class", "n_features", "n_components", "kwargs"),
    BAD_CONSTRUCTIONS,
    ids=[f"{c}-D{d}-K{k}-{sorted(kw)}-{i}" for i, (c, d, k, kw) in enumerate(BAD_CONSTRUCTIONS)],
)
def test_invalid_hyper_parameters_raise_value_error(
    model_class: str, n_features: int, n_components: int, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        getattr(onlinefa, model_class)(n_features, n_components, **kwargs)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_unknown_dtype_is_rejected(model_class: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        getattr(onlinefa, model_class)(5, 2, dtype="float16")


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_valid_edge_hyper_parameters_are_accepted(model_class: str) -> None:
    """The boundaries just inside the valid region: K = D − 1, K = 1, no warm-up."""
    cls = getattr(onlinefa, model_class)
    for n_features, n_components in ((5, 4), (2, 1)):
        model = cls(n_features, n_components, n_warmup=0, seed=0)
        assert np.asarray(model.initial_parameters()[0]).shape == (n_features, n_components)
        model.update(np.arange(1.0, n_features + 1.0))
        assert model.is_fitted
        assert np.asarray(model.loadings).shape == (n_features, n_components)


# ---------------------------------------------------------------------------------------------
# Accepted layouts and dtypes: same result as a C-contiguous float64 copy
# ---------------------------------------------------------------------------------------------


def layout_variants(batch32: npt.NDArray[np.float32]) -> dict[str, npt.NDArray[Any]]:
    """Equal-valued views/copies of a batch whose values are exactly representable in float32."""
    batch64 = batch32.astype(np.float64)
    wide64 = np.zeros((batch64.shape[0] * 2, batch64.shape[1] * 3))
    wide64[::2, ::3] = batch64
    wide32 = wide64.astype(np.float32)
    return {
        "f64-C": batch64,
        "f64-F": np.asfortranarray(batch64),
        "f64-strided": wide64[::2, ::3],
        "f64-negative-stride": np.ascontiguousarray(batch64[::-1])[::-1],
        "f32-C": batch32,
        "f32-F": np.asfortranarray(batch32),
        "f32-strided": wide32[::2, ::3],
        "f64-big-endian": batch64.astype(">f8"),
    }


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("state_dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "variant",
    ["f64-F", "f64-strided", "f64-negative-stride", "f64-big-endian", "f32-C", "f32-F", "f32-strided"],
)
def test_layouts_and_dtypes_match_c_contiguous_float64(
    model_class: str, state_dtype: str, variant: str, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    batch32 = fa_stream(N_FEATURES, N_COMPONENTS, 40, 6).astype(np.float32)
    variants = layout_variants(batch32)
    reference_input = np.ascontiguousarray(batch32, dtype=np.float64)
    candidate_input = variants[variant]
    np.testing.assert_array_equal(candidate_input, reference_input)
    reference_model = new_model(model_class, dtype=state_dtype)
    candidate_model = new_model(model_class, dtype=state_dtype)
    reference_model.update(reference_input)
    candidate_model.update(candidate_input)
    for name in ("mean", "loadings", "noise_variance"):
        assert rel_err(getattr(candidate_model, name), getattr(reference_model, name)) <= TWIN_RTOL
    # The caller's array is never modified.
    np.testing.assert_array_equal(candidate_input, reference_input)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("input_dtype", [np.float64, np.float32])
def test_contiguous_float_batch_is_not_copied_in_python(model_class: str, input_dtype: Any) -> None:
    """Contiguous float32/float64 batches are read in place: no batch-sized NumPy allocation.

    tracemalloc sees every NumPy data buffer (NumPy reports them to it), so a conversion or copy of
    the batch would show up as a peak ≥ its size; the bound (half the batch) still allows a boolean
    temporary (1/8 or 1/4 of it, e.g. from an ``isfinite`` check), and the state here is tiny.
    """
    batch = np.random.default_rng(9).standard_normal((20000, N_FEATURES))
    batch = batch.astype(input_dtype)
    model = new_model(model_class)
    model.update(batch[:2])  # first call outside the measurement (lazy imports, caches)
    tracemalloc.start()
    try:
        model.update(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < batch.nbytes // 2, (peak, batch.nbytes)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_single_strided_row_matches_contiguous(
    model_class: str, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    stream = fa_stream(N_FEATURES, N_COMPONENTS, 12, 7)
    as_columns = np.asfortranarray(stream)  # each row is a non-contiguous 1-D view
    contiguous, strided = new_model(model_class), new_model(model_class)
    for row_index in range(stream.shape[0]):
        contiguous.update(np.ascontiguousarray(stream[row_index]))
        strided.update(as_columns[row_index])
    for name in ("mean", "loadings", "noise_variance"):
        assert rel_err(getattr(strided, name), getattr(contiguous, name)) <= TWIN_RTOL


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_integer_input_is_converted(model_class: str, rel_err: RelErr) -> None:
    """Numeric non-float input (int64) is converted once, like NumPy would."""
    batch_int = np.random.default_rng(8).integers(-5, 6, size=(20, N_FEATURES))
    from_int, from_float = new_model(model_class), new_model(model_class)
    from_int.update(batch_int)
    from_float.update(batch_int.astype(np.float64))
    for name in ("mean", "loadings", "noise_variance"):
        assert rel_err(getattr(from_int, name), getattr(from_float, name)) <= TWIN_RTOL


# ---------------------------------------------------------------------------------------------
# Query methods validate their input too
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
@pytest.mark.parametrize("method", ["log_prob", "transform"])
def test_queries_reject_wrong_width_and_non_numeric(
    model_class: str, method: str, fa_stream: StreamFactory
) -> None:
    model, _ = warmed_up_pair(model_class, fa_stream)
    with pytest.raises(ValueError) as excinfo:
        getattr(model, method)(np.ones((3, N_FEATURES + 1)))
    assert mentions_number(str(excinfo.value), N_FEATURES), str(excinfo.value)
    with pytest.raises(TypeError):
        getattr(model, method)(np.array([["x"] * N_FEATURES]))


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
def test_sample_rejects_negative_count(model_class: str, fa_stream: StreamFactory) -> None:
    model, _ = warmed_up_pair(model_class, fa_stream)
    with pytest.raises(ValueError):
        model.sample(-1, seed=0)
