"""Inputs that look numeric but are not what they seem are refused with a clear error, never read wrongly:
masked arrays with masked entries, object arrays of strings, tensors that require grad, and noise floors
so small that every later update would break down. DLPack-only producers are read by every model family.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa

D, K = 5, 2
ROWS = np.random.default_rng(3).standard_normal((30, D))


class DLPackOnly:
    """A producer that speaks DLPack and nothing else (no NumPy protocol, no buffer protocol)."""

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


def _vifa() -> onlinefa.VIFA:
    return onlinefa.VIFA(D, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=0)


FEEDERS: dict[str, Callable[[Any], object]] = {
    "OnlineEM.update": lambda x: onlinefa.OnlineEM(D, K, seed=0).update(x),
    "OnlineSGA.update": lambda x: onlinefa.OnlineSGA(D, K, seed=0).update(x),
    "OnlineFactorAnalysis.partial_fit": lambda x: onlinefa.OnlineFactorAnalysis(n_components=K).partial_fit(x),
    "VBFA.fit": lambda x: onlinefa.VBFA(n_components=K).fit(x),
    "OnlineVBFA.partial_fit": lambda x: onlinefa.OnlineVBFA(n_components=K).partial_fit(x),
}


@pytest.mark.parametrize("feeder", sorted(FEEDERS))
def test_masked_arrays_with_masked_values_are_refused(feeder: str) -> None:
    masked = np.ma.masked_array(ROWS.copy(), mask=np.zeros(ROWS.shape, dtype=bool))
    masked.mask[4, 1] = True
    with pytest.raises(ValueError, match="masked"):
        FEEDERS[feeder](masked)


def test_masked_array_without_masked_values_is_its_data() -> None:
    masked = np.ma.masked_array(ROWS.copy(), mask=False)
    plain = onlinefa.OnlineEM(D, K, seed=0).update(ROWS)
    from_masked = onlinefa.OnlineEM(D, K, seed=0).update(masked)
    np.testing.assert_array_equal(from_masked.loadings, plain.loadings)


@pytest.mark.parametrize("feeder", sorted(FEEDERS))
def test_object_arrays_of_numeric_strings_are_refused(feeder: str) -> None:
    text = ROWS.astype(str).astype(object)
    with pytest.raises(TypeError):
        FEEDERS[feeder](text)


def test_estimator_still_reads_object_arrays_of_numbers() -> None:
    objects = ROWS.astype(object)
    fa = onlinefa.OnlineFactorAnalysis(n_components=K, random_state=0).fit(objects)
    ref = onlinefa.OnlineFactorAnalysis(n_components=K, random_state=0).fit(ROWS)
    np.testing.assert_array_equal(fa.components_, ref.components_)


def test_requires_grad_tensors_give_a_clear_type_error() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(ROWS.copy()).requires_grad_(True)
    for feed in [*FEEDERS.values(), lambda x: _vifa().log_prob(x)]:
        with pytest.raises(TypeError, match=r"requires grad.*detach"):
            feed(tensor)
    vi = _vifa()
    vi.sample()
    with pytest.raises(TypeError, match="detach"):
        vi.step(torch.zeros(D, dtype=torch.float64, requires_grad=True))


def test_vifa_step_reads_dlpack_only_producers() -> None:
    grad = np.random.default_rng(0).standard_normal(D)
    via_dlpack, via_numpy = _vifa(), _vifa()
    via_dlpack.sample(), via_numpy.sample()
    via_dlpack.step(DLPackOnly(grad))
    via_numpy.step(grad)
    np.testing.assert_array_equal(via_dlpack.loadings, via_numpy.loadings)
    np.testing.assert_array_equal(via_dlpack.mean, via_numpy.mean)


@pytest.mark.parametrize("model", ["VBFA", "OnlineVBFA"])
def test_vbfa_reads_dlpack_only_producers(model: str) -> None:
    def fitted(data: object) -> Any:
        estimator = getattr(onlinefa, model)(n_components=K, random_state=0)
        return estimator.fit(data)

    from_dlpack, from_numpy = fitted(DLPackOnly(ROWS)), fitted(ROWS)
    np.testing.assert_array_equal(from_dlpack.components_, from_numpy.components_)
    np.testing.assert_array_equal(from_dlpack.transform(DLPackOnly(ROWS)), from_numpy.transform(ROWS))


@pytest.mark.parametrize("noise_floor", [5e-324, 1e-310, 1e-250])
@pytest.mark.parametrize("model", ["OnlineEM", "OnlineSGA"])
def test_noise_floor_below_the_storable_minimum_is_refused(model: str, noise_floor: float) -> None:
    # A subnormal floor was accepted, then 1/ψ overflowed and every update of a constant feature failed.
    with pytest.raises(ValueError, match="noise_floor"):
        getattr(onlinefa, model)(D, K, noise_floor=noise_floor)
    with pytest.raises(ValueError, match="noise_floor"):
        getattr(onlinefa, model)(D, K, noise_floor=1e-35, dtype="float32")


def test_smallest_accepted_noise_floor_keeps_updates_working() -> None:
    rows = ROWS.copy()
    rows[:, 0] = 3.0  # a constant feature sits on the floor
    for dtype, floor in (("float64", 1e-200), ("float32", 1e-30)):
        model = onlinefa.OnlineEM.algorithm2(D, K, n_warmup=3, seed=0, noise_floor=floor, dtype=dtype).update(rows)
        assert np.isfinite(model.log_prob(rows)).all()
