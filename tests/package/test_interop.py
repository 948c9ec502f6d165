"""Interop: zero-copy input from NumPy-compatible producers, and export to SciPy / PyTorch's layout.

Zero-copy is checked where it is observable: a spy stands in for the Rust engine and records the array
it receives, which must share memory with the producer's buffer, and the resulting state must equal,
bit for bit, the state reached from a plain C-contiguous ndarray.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy.stats import multivariate_normal

import onlinefa
from onlinefa import OnlineFactorAnalysis
from onlinefa.interop import LowRankParameters, as_numpy, to_scipy, to_torch_low_rank
from engine_state import engine_state

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]
D, K, N = 8, 2, 120


class CoreSpy:
    """Wraps a model's Rust engine and records every array handed to ``update``."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.received: list[np.ndarray] = []

    def update(self, x: np.ndarray) -> None:
        self.received.append(x)
        self.core.update(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


def spied(model: Any) -> CoreSpy:
    spy = CoreSpy(model._core)
    model._core = spy
    return spy


class InterfaceOnly:
    """Exposes a buffer only through ``__array_interface__`` (like many C extensions)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.__array_interface__ = array.__array_interface__


class ArrayMethodOnly:
    """Exposes ``__array__`` only (like pandas, xarray, PyTorch and JAX CPU arrays)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array


class DLPackOnly:
    """Exposes only the DLPack protocol (as a framework tensor without NumPy support would)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self._array.__dlpack_device__()
        return device


class GPUTensor(DLPackOnly):
    """A DLPack producer living on a CUDA device."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("the tensor is on cuda:0")


def producers(base: np.ndarray, tmp_path: Path) -> dict[str, tuple[Any, np.ndarray]]:
    """name → (object handed to the library, the NumPy buffer it must be read from)."""
    memmap = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=base.dtype, shape=base.shape)
    memmap[...] = base
    memmap.flush()
    loaded = np.load(tmp_path / "x.npy", mmap_mode="r")
    fortran = np.asfortranarray(base)
    reversed_rows = np.ascontiguousarray(base[::-1])[::-1]  # negative row stride, same values
    strided = np.repeat(base, 2, axis=1)[:, ::2]  # non-contiguous columns
    readonly = base.copy()
    readonly.flags.writeable = False
    return {
        "ndarray": (base, base),
        "fortran": (fortran, fortran),
        "negative-stride": (reversed_rows, reversed_rows),
        "strided": (strided, strided),
        "readonly": (readonly, readonly),
        "from_dlpack": (np.from_dlpack(base), base),
        "memoryview": (memoryview(base), base),
        "array_interface": (InterfaceOnly(base), base),
        "array_method": (ArrayMethodOnly(base), base),
        "np.memmap": (memmap, memmap),
        "np.load(mmap_mode='r')": (loaded, loaded),
    }


PRODUCERS = ["ndarray", "fortran", "negative-stride", "strided", "readonly", "from_dlpack", "memoryview",
             "array_interface", "array_method", "np.memmap", "np.load(mmap_mode='r')"]


def states_equal(a: Any, b: Any) -> bool:
    left, right = engine_state(a), engine_state(b)
    return left.keys() == right.keys() and all(
        left[k].tobytes() == right[k].tobytes() if isinstance(left[k], np.ndarray) else left[k] == right[k]
        for k in left
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("producer", PRODUCERS)
def test_models_read_producers_in_place(producer: str, dtype: Any, fa_stream: StreamFactory, tmp_path: Path) -> None:
    base = np.ascontiguousarray(fa_stream(D, K, N, 0).astype(dtype))
    source, buffer = producers(base, tmp_path)[producer]
    plain = onlinefa.OnlineEM(D, K, n_warmup=10, seed=0)
    plain.update(base.copy())
    model = onlinefa.OnlineEM(D, K, n_warmup=10, seed=0)
    spy = spied(model)
    model.update(source)
    assert np.shares_memory(spy.received[0], buffer), "the engine received a copy"
    model._core = spy.core
    assert states_equal(model, plain)


@pytest.mark.parametrize("producer", PRODUCERS + ["dlpack-only"])
def test_estimator_reads_producers_in_place(producer: str, fa_stream: StreamFactory, tmp_path: Path) -> None:
    base = np.ascontiguousarray(fa_stream(D, K, N, 1))
    source, buffer = (producers(base, tmp_path) | {"dlpack-only": (DLPackOnly(base), base)})[producer]
    reference = OnlineFactorAnalysis(K, n_warmup=10, random_state=0).partial_fit(base[:1]).partial_fit(base.copy())
    fa = OnlineFactorAnalysis(K, n_warmup=10, random_state=0).partial_fit(base[:1])  # builds the engine
    spy = spied(fa._model)
    fa.partial_fit(source)
    assert np.shares_memory(spy.received[-1], buffer), "the engine received a copy"
    fa._model._core = spy.core
    assert states_equal(fa._model, reference._model)
    np.testing.assert_array_equal(fa.transform(source), reference.transform(base))


def test_models_read_dlpack_only_producers(fa_stream: StreamFactory) -> None:
    base = np.ascontiguousarray(fa_stream(D, K, N, 2))
    model = onlinefa.OnlineEM(D, K, n_warmup=10, seed=0)
    spy = spied(model)
    model.update(DLPackOnly(base))
    assert np.shares_memory(spy.received[0], base)


def test_as_numpy_shares_memory_with_every_producer(tmp_path: Path) -> None:
    base = np.arange(24.0).reshape(4, 6)
    for name, (source, buffer) in (producers(base, tmp_path) | {"dlpack-only": (DLPackOnly(base), base)}).items():
        view = as_numpy(source)
        assert np.shares_memory(view, buffer), name
        np.testing.assert_array_equal(view, base, err_msg=name)
    assert as_numpy(base) is base
    np.testing.assert_array_equal(as_numpy([[1, 2], [3, 4]]), [[1, 2], [3, 4]])


def test_as_numpy_reports_device_producers_clearly() -> None:
    with pytest.raises(TypeError, match="DLPack.*CPU memory"):
        as_numpy(GPUTensor(np.zeros(3)))


# ---------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["OnlineEM", "OnlineSGA", "OnlineFactorAnalysis"])
def fitted(request: pytest.FixtureRequest) -> Any:
    rng = np.random.default_rng(3)
    X = 1.0 + rng.standard_normal((500, K)) @ rng.standard_normal((K, D)) + 0.5 * rng.standard_normal((500, D))
    if request.param == "OnlineFactorAnalysis":
        return OnlineFactorAnalysis(K, n_warmup=20, random_state=0).fit(X)
    extra = {"lr": 5e-3} if request.param == "OnlineSGA" else {}
    return getattr(onlinefa, request.param)(D, K, n_warmup=20, seed=0, **extra).update(X)


def parameters(model: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(model, OnlineFactorAnalysis):
        return model.mean_, model.components_.T, model.noise_variance_
    return model.mean, model.loadings, model.noise_variance


def log_density(model: Any, x: np.ndarray) -> np.ndarray:
    if isinstance(model, OnlineFactorAnalysis):
        return model.score_samples(x)
    return model.log_prob(x)


def test_to_scipy_is_the_same_gaussian(fitted: Any) -> None:
    mean, loadings, noise = parameters(fitted)
    dist = to_scipy(fitted)
    np.testing.assert_array_equal(dist.mean, mean)
    np.testing.assert_allclose(dist.cov, loadings @ loadings.T + np.diag(noise), rtol=1e-14)
    queries = np.random.default_rng(4).standard_normal((25, D)) * 2.0
    # SciPy factorises the dense covariance, we use Woodbury: equal up to float64 rounding.
    np.testing.assert_allclose(dist.logpdf(queries), log_density(fitted, queries), rtol=1e-10)


def test_to_scipy_refuses_large_dimensions(fitted: Any) -> None:
    with pytest.raises(ValueError, match="max_features=5"):
        to_scipy(fitted, max_features=5)


def test_to_torch_low_rank_layout(fitted: Any) -> None:
    mean, loadings, noise = parameters(fitted)
    params = to_torch_low_rank(fitted)
    assert isinstance(params, LowRankParameters) and isinstance(params, tuple)
    loc, cov_factor, cov_diag = params
    assert (loc.shape, cov_factor.shape, cov_diag.shape) == ((D,), (D, K), (D,))
    assert all(a.dtype == np.float64 for a in params)
    np.testing.assert_array_equal(loc, mean)
    np.testing.assert_array_equal(cov_factor, loadings)
    np.testing.assert_array_equal(cov_diag, noise)
    assert set(params._asdict()) == {"loc", "cov_factor", "cov_diag"}
    # The triple describes N(loc, cov_factor cov_factorᵀ + diag cov_diag), as LowRankMultivariateNormal.
    queries = np.random.default_rng(5).standard_normal((10, D))
    dense = multivariate_normal(loc, cov_factor @ cov_factor.T + np.diag(cov_diag))
    np.testing.assert_allclose(dense.logpdf(queries), log_density(fitted, queries), rtol=1e-10)


def test_exports_are_independent_copies(fitted: Any) -> None:
    before = to_torch_low_rank(fitted)
    exported = to_torch_low_rank(fitted)
    for array in exported:
        if array.flags.writeable:
            array += 1.0
        else:  # a read-only view of the model's cached state: mutation must be refused
            with pytest.raises(ValueError):
                array += 1.0
    for old, new in zip(before, to_torch_low_rank(fitted)):
        np.testing.assert_array_equal(old, new)


def test_export_rejects_non_models() -> None:
    with pytest.raises(TypeError, match="expected a fitted onlinefa model"):
        to_torch_low_rank(object())
    with pytest.raises(onlinefa.estimator.NotFittedError):
        to_torch_low_rank(OnlineFactorAnalysis(2))
