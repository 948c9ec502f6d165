"""Every memory layout NumPy can express is read correctly: the result equals, bit for bit, the result on a
C-contiguous native-byte-order copy of the same values.

The Rust core addresses arrays element by element (strides counted in items); NumPy allows byte strides
that are not a multiple of the item size (a float field of a packed record array), data pointers that
are not aligned to the item (``np.frombuffer`` with an offset), negative strides and non-native byte
order. Any of them misread would give a different state or query result (or a spurious error), which
the comparisons below catch. The layouts are drawn by Hypothesis: named ones (C, Fortran, stepped and
reversed slices, record-array fields, misaligned buffers, byte-swapped dtypes) and arbitrary byte
strides and offsets over a raw byte buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onlinefa
from onlinefa import OnlineFactorAnalysis
from engine_state import engine_state

D, K = 6, 2
LAYOUT_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LayoutFactory = Callable[[npt.NDArray[Any]], npt.NDArray[Any]]


def _strided_bytes(values: npt.NDArray[Any], row_stride: int, col_stride: int, offset: int, swap: bool) -> npt.NDArray[Any]:
    """A view with the given byte strides (any sign) and extra byte offset over a fresh byte buffer,
    holding ``values`` (optionally in the opposite byte order)."""
    dtype = values.dtype.newbyteorder(">" if np.little_endian else "<") if swap else values.dtype
    n_rows, n_cols = values.shape
    low = min(0, row_stride * (n_rows - 1)) + min(0, col_stride * (n_cols - 1))
    high = max(0, row_stride * (n_rows - 1)) + max(0, col_stride * (n_cols - 1)) + dtype.itemsize
    buffer = np.zeros(offset - low + high, dtype=np.uint8)
    view = np.ndarray(values.shape, dtype=dtype, buffer=buffer, offset=offset - low, strides=(row_stride, col_stride))
    view[...] = values
    return view


def _record_field(values: npt.NDArray[Any], head: int, pad: int, reverse: bool) -> npt.NDArray[Any]:
    """The float field of a packed record array (``head`` bytes before it, ``pad`` after), optionally
    read with a negative row stride."""
    record = np.dtype([("head", "u1", (head,)), ("x", values.dtype, (values.shape[1],)), ("flag", "<i4"), ("pad", "u1", (pad,))])
    rows = np.zeros(values.shape[0], dtype=record)
    rows["flag"] = np.arange(values.shape[0])
    field = rows["x"][::-1] if reverse else rows["x"]
    field[...] = values
    return field


def _misaligned(values: npt.NDArray[Any], offset: int) -> npt.NDArray[Any]:
    """``values`` C-contiguous in a buffer read by ``np.frombuffer`` at a byte offset."""
    raw = bytearray(offset + values.nbytes)
    raw[offset:] = values.tobytes()
    return np.frombuffer(raw, dtype=values.dtype, offset=offset).reshape(values.shape)


def _stepped(values: npt.NDArray[Any], row_step: int, col_step: int) -> npt.NDArray[Any]:
    """A slice with steps (negative steps reverse the axis) of a larger C-contiguous array."""
    n_rows, n_cols = values.shape
    big = np.zeros((n_rows * abs(row_step), n_cols * abs(col_step)), dtype=values.dtype)
    view = big[:: row_step, :: col_step][:n_rows, :n_cols]
    view[...] = values
    return view


@st.composite
def layouts(draw: st.DrawFn) -> LayoutFactory:
    """A function putting a C-contiguous (n, D) array into some other memory layout (same values)."""
    kind = draw(st.sampled_from(["C", "F", "stepped", "record", "misaligned", "swapped", "raw"]))
    if kind == "C":
        return lambda v: np.array(v, order="C")
    if kind == "F":
        return lambda v: np.array(v, order="F")
    if kind == "stepped":
        steps = st.integers(1, 3).flatmap(lambda s: st.sampled_from([s, -s]))
        row_step, col_step = draw(steps), draw(steps)
        return lambda v: _stepped(v, row_step, col_step)
    if kind == "record":
        head, pad, reverse = draw(st.integers(0, 7)), draw(st.integers(0, 7)), draw(st.booleans())
        return lambda v: _record_field(v, head, pad, reverse)
    if kind == "misaligned":
        offset = draw(st.integers(1, 7))
        return lambda v: _misaligned(v, offset)
    if kind == "swapped":
        order = draw(st.sampled_from(["C", "F"]))
        return lambda v: np.array(v, dtype=v.dtype.newbyteorder(), order=order)
    column_major, row_sign, col_sign = draw(st.booleans()), draw(st.sampled_from([1, -1])), draw(st.sampled_from([1, -1]))
    gap, inner_gap, offset, swap = draw(st.integers(0, 9)), draw(st.integers(0, 5)), draw(st.integers(0, 9)), draw(st.booleans())

    def raw(v: npt.NDArray[Any]) -> npt.NDArray[Any]:
        n_rows, n_cols = v.shape
        inner = v.itemsize + inner_gap
        outer = inner * ((n_rows if column_major else n_cols) - 1) + v.itemsize + gap
        row_stride, col_stride = (inner, outer) if column_major else (outer, inner)
        return _strided_bytes(v, row_sign * row_stride, col_sign * col_stride, offset, swap)

    return raw


def _canonical(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The C-contiguous, native-byte-order copy every layout is compared with."""
    return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))


def _data(n_rows: int, dtype: str, seed: int) -> npt.NDArray[Any]:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((D, K))
    return (rng.standard_normal((n_rows, K)) @ loadings.T + 0.5 * rng.standard_normal((n_rows, D)) + 1.0).astype(dtype)


def _state(model: Any) -> dict[str, Any]:
    """An engine's full state with arrays as bytes (compared bit for bit with ==)."""
    return {k: (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v
            for k, v in engine_state(model).items()}


def _assert_same_bits(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("state_dtype", ["float64", "float32"])
@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
@LAYOUT_SETTINGS
@given(layout=layouts(), input_dtype=st.sampled_from(["float64", "float32"]), n_rows=st.integers(1, 30))
def test_streaming_update_reads_any_layout(
    model_class: str, state_dtype: str, layout: LayoutFactory, input_dtype: str, n_rows: int
) -> None:
    extra = {"lr": 1e-2} if model_class == "OnlineSGA" else {}
    values = _data(n_rows, input_dtype, n_rows)
    strided = layout(values)
    models = [getattr(onlinefa, model_class)(D, K, n_warmup=3, seed=1, dtype=state_dtype, **extra) for _ in range(2)]
    models[0].update(strided)
    models[1].update(_canonical(strided))
    assert _state(models[0]) == _state(models[1])
    queries = _data(4, input_dtype, 99)
    for name in ("log_prob", "transform"):
        try:
            want = getattr(models[1], name)(queries)
        except onlinefa.NotFittedError:  # warm-up without a first fit: both refuse the query alike
            with pytest.raises(onlinefa.NotFittedError):
                getattr(models[0], name)(layout(queries))
            continue
        _assert_same_bits(getattr(models[0], name)(layout(queries)), want)


@pytest.mark.parametrize("state_dtype", ["float64", "float32"])
@LAYOUT_SETTINGS
@given(layout=layouts(), grad_dtype=st.sampled_from(["float64", "float32"]), n_grad_samples=st.integers(1, 3))
def test_vifa_step_reads_any_layout(state_dtype: str, layout: LayoutFactory, grad_dtype: str, n_grad_samples: int) -> None:
    models = [
        onlinefa.VIFA(D, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, optimizer="adam",
                      seed=3, n_grad_samples=n_grad_samples, dtype=state_dtype)
        for _ in range(2)
    ]
    thetas = [np.stack([m.sample() for _ in range(n_grad_samples)]) for m in models]
    _assert_same_bits(thetas[0], thetas[1])
    grads = (2.0 * thetas[0] - 1.0).astype(grad_dtype)  # the gradient of a quadratic NLL at the draws
    strided = layout(grads)
    models[0].step(strided)
    models[1].step(_canonical(strided))
    assert _state(models[0]) == _state(models[1])
    queries = _data(4, grad_dtype, 98)
    for name in ("log_prob", "transform"):
        _assert_same_bits(getattr(models[0], name)(layout(queries)), getattr(models[1], name)(queries))


INPUT_DTYPES = ["float64", "float32", "float16", "int32", ">f8", "<f4", "int64"]


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
@LAYOUT_SETTINGS
@given(layout=layouts(), input_dtype=st.sampled_from(INPUT_DTYPES), column=st.integers(0, 3), n_rows=st.integers(2, 12))
def test_one_sample_vectors_and_converted_dtypes_read_any_layout(
    model_class: str, layout: LayoutFactory, input_dtype: str, column: int, n_rows: int
) -> None:
    """1-D samples (one column of a strided (D, n) view, so a 1-D array with any byte stride) and dtypes the
    wrappers convert (float16, integers, byte-swapped) give the bits of a C-contiguous copy."""
    values = (10 * _data(n_rows, "float64", column + n_rows)).astype(input_dtype)
    by_column = layout(np.ascontiguousarray(values.T))  # (D, n): each column is one sample
    models = [getattr(onlinefa, model_class)(D, K, n_warmup=2, seed=1) for _ in range(2)]
    for j in range(n_rows):
        models[0].update(by_column[:, j])
        models[1].update(_canonical(by_column[:, j]))
    assert _state(models[0]) == _state(models[1])
    if models[1].is_fitted:
        query = layout(np.ascontiguousarray(values[:3]))
        _assert_same_bits(models[0].log_prob(query), models[1].log_prob(_canonical(query)))


@LAYOUT_SETTINGS
@given(layout=layouts(), input_dtype=st.sampled_from(["float64", "float32"]), n_rows=st.integers(2, 30))
def test_estimator_reads_any_layout(layout: LayoutFactory, input_dtype: str, n_rows: int) -> None:
    values = _data(n_rows, input_dtype, n_rows + 7)
    strided = layout(values)
    estimators = [OnlineFactorAnalysis(K, random_state=2) for _ in range(4)]
    queries_for_warm_up = _data(5, input_dtype, 11)
    estimators[0].partial_fit(strided)
    estimators[1].partial_fit(_canonical(strided))
    if n_rows <= estimators[0]._model.n_warmup:  # a fit that would end in warm-up is refused alike
        for estimator, data in ((estimators[2], strided), (estimators[3], _canonical(strided))):
            with pytest.raises(ValueError, match="n_warmup"):
                estimator.fit(data)
        estimators = estimators[:2]
    else:
        estimators[2].fit(strided)
        estimators[3].fit(_canonical(strided))
    for got, want in zip(estimators[::2], estimators[1::2]):
        if not want._model.is_fitted:  # warm-up: the fitted attributes are refused alike
            for estimator in (got, want):
                with pytest.raises(onlinefa.NotFittedError):
                    estimator.transform(queries_for_warm_up)
            continue
        for name in ("mean_", "components_", "noise_variance_"):
            _assert_same_bits(getattr(got, name), getattr(want, name))
        queries = _data(5, input_dtype, 11)
        for name in ("transform", "score_samples"):
            _assert_same_bits(getattr(got, name)(layout(queries)), getattr(want, name)(queries))


@LAYOUT_SETTINGS
@given(layout=layouts(), input_dtype=st.sampled_from(["float64", "float32"]), n_rows=st.integers(4, 30))
def test_vbfa_reads_any_layout(layout: LayoutFactory, input_dtype: str, n_rows: int) -> None:
    values = _data(n_rows, input_dtype, n_rows + 13)
    strided = layout(values)
    batch = [onlinefa.VBFA(K, max_iter=5, random_state=4) for _ in range(2)]
    batch[0].fit(strided)
    batch[1].fit(_canonical(strided))
    online = [onlinefa.OnlineVBFA(K, batch_size=7, random_state=5) for _ in range(2)]
    online[0].partial_fit(strided)
    online[1].partial_fit(_canonical(strided))
    queries = _data(5, input_dtype, 17)
    for got, want in (batch, online):
        for name in ("mean_", "components_", "noise_variance_"):
            _assert_same_bits(getattr(got, name), getattr(want, name))
        for name in ("transform", "score_samples"):
            _assert_same_bits(getattr(got, name)(layout(queries)), getattr(want, name)(queries))


def test_record_field_layout_is_the_reported_one() -> None:
    """The motivating case: a float64 field of a packed record array has a row stride of 8·D + 4 bytes."""
    field = _record_field(_data(3, "float64", 0), head=0, pad=0, reverse=False)
    assert field.strides == (8 * D + 4, 8)
    assert not field.flags.aligned


def _unaddressable(kind: str, dtype: str) -> npt.NDArray[Any]:
    """An (n, D) array the core cannot describe with element strides: a record-array field (byte stride
    not a multiple of the item size, also reversed) or a misaligned buffer."""
    values = _data(5, dtype, 1)
    if kind == "record":
        return _record_field(values, head=1, pad=0, reverse=False)
    if kind == "reversed record":
        return _record_field(values, head=0, pad=3, reverse=True)
    return _misaligned(values, 3)


ENGINE_CALLS: dict[str, Callable[[npt.NDArray[Any]], object]] = {
    "OnlineEM.update": lambda x: onlinefa.OnlineEM(D, K, seed=0)._core.update(x),
    "OnlineSGA.update": lambda x: onlinefa.OnlineSGA(D, K, seed=0)._core.update(x),
    "VBFACore": lambda x: onlinefa._core.VBFACore(
        x.astype(np.float64, copy=False), K, prior="ard", transform=True, transform_start=1, translation="mean",
        init_noise_ratio=1e-2, seed=0),
    "vbfa_log_likelihood": lambda x: onlinefa._core.vbfa_log_likelihood(
        x.astype(np.float64, copy=False), np.zeros(D), np.ones((D, K)), np.ones(D)),
}


@pytest.mark.parametrize("kind", ["record", "reversed record", "misaligned"])
@pytest.mark.parametrize("call", sorted(ENGINE_CALLS))
def test_engines_refuse_layouts_they_cannot_address(call: str, kind: str) -> None:
    """The engines' own guard: an unaddressable view reaching the Rust core directly is refused with a
    ValueError naming the problem, never read at the wrong addresses."""
    x = _unaddressable(kind, "float64")
    assert not x.flags.aligned  # so astype(copy=False) above keeps the layout
    with pytest.raises(ValueError, match="cannot be read in place"):
        ENGINE_CALLS[call](x)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_vifa_engine_refuses_unaddressable_gradients(dtype: str) -> None:
    vifa = onlinefa.VIFA(D, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2,
                         n_grad_samples=2, seed=0)
    vifa.sample()
    vifa.sample()
    grad = _record_field(_data(2, dtype, 2), head=1, pad=0, reverse=False)
    with pytest.raises(ValueError, match="cannot be read in place"):
        vifa._core.step(grad)
    assert vifa.n_pending == 2  # refused before anything was applied
    vifa.step(grad)  # the public method copies it and goes through
    assert vifa.n_steps == 1


def _odd_layout(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``array``'s values (1-D or 2-D) at an odd address with odd byte strides (rows reversed)."""
    rows = array.reshape(-1, array.shape[-1])
    col_stride = array.itemsize + 3
    odd = _strided_bytes(rows, -(col_stride * rows.shape[1] + 5), col_stride, offset=1, swap=False)
    return odd.reshape(array.shape)


def test_initial_values_of_any_layout_are_copied_correctly() -> None:
    """Initial loadings, means and noise variances are copied by the engines; unaddressable layouts are
    copied through NumPy first, so they give the same model as C-contiguous ones."""
    rng = np.random.default_rng(5)
    init, mean, noise = rng.standard_normal((D, K)), rng.standard_normal(D), rng.uniform(0.5, 1.5, D)
    common = dict(prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=0)
    strided = onlinefa.VIFA(D, K, init=_record_field(init, 3, 1, True), init_mean=_odd_layout(mean),
                            init_noise_variance=_odd_layout(noise), **common)
    contiguous = onlinefa.VIFA(D, K, init=init, init_mean=mean, init_noise_variance=noise, **common)
    assert _state(strided) == _state(contiguous)
    direct = onlinefa._core.VIFACore(
        D, K, init=_record_field(init, 1, 0, False), init_mean=_odd_layout(mean),
        init_noise_variance=_odd_layout(noise), seed=0, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2,
        lr_log_noise=1e-2, optimizer="sgd", n_grad_samples=1, clip_grad_norm=None, dtype="float64")
    _assert_same_bits(direct.loadings(), init)
    _assert_same_bits(direct.mean(), mean)


@pytest.mark.parametrize("state_dtype", ["float64", "float32"])
def test_states_of_any_layout_are_restored_exactly(state_dtype: str) -> None:
    model = onlinefa.OnlineEM(D, K, n_warmup=3, seed=1, dtype=state_dtype).update(_data(20, "float64", 4))
    state = engine_state(model)
    moved = {key: _odd_layout(value) if isinstance(value, np.ndarray) and value.size > 1 else value
             for key, value in state.items()}
    assert any(isinstance(v, np.ndarray) and not v.flags.aligned for v in moved.values())
    restored = type(model._core).from_state(moved)
    assert {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in restored.get_state().items()} == {
        k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in state.items()}


@LAYOUT_SETTINGS
@given(layout=layouts(), input_dtype=st.sampled_from(["float64", "float32"]), n_rows=st.integers(2, 30),
       pick=st.booleans())
def test_minibatch_reads_any_layout(layout: LayoutFactory, input_dtype: str, n_rows: int, pick: bool) -> None:
    # update (whole array or picked rows, read in place), the exact step and the data moments must read every
    # layout as the canonical copy's values, bit for bit.
    values = _data(n_rows, input_dtype, n_rows + 7)
    strided = layout(values)
    canonical = _canonical(strided)
    rows = np.random.default_rng(n_rows).permutation(n_rows)[: max(1, n_rows // 2)] if pick else None
    moments = [onlinefa.minibatch.data_moments(x) for x in (strided, canonical)]
    for got, want in zip(*moments):
        _assert_same_bits(got, want)
    models = [onlinefa.MiniBatchEM(D, K, batch_size=4, seed=1) for _ in range(2)]
    for model, x in zip(models, (strided, canonical)):
        model.update(x, rows=rows)
        model.exact_step(x)
    assert _state(models[0]) == _state(models[1])
