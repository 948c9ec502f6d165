"""The same answer on every row store: a stream of edge rows fed to the Rust model and to the torch model of the
same family and dtype is accepted or refused alike (with the same exception class, each leaving its model as it
was), and what is accepted gives the same Gaussian. The K×K step is the same Rust code in both, so only the
D-sized passes differ, by rounding."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from device_parity import assert_same_state, stream  # noqa: E402

MAX_INPUT = {"float64": 1e100, "float32": 1e18}
D, K = 24, 3


def edge_batches(dtype: str) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Edge rows, each a function of a typical batch (8 rows of the stream)."""
    limit = MAX_INPUT[dtype]

    def with_value(value: float) -> Callable[[np.ndarray], np.ndarray]:
        def batch(x: np.ndarray) -> np.ndarray:
            x = x.copy()
            x[3, 5] = value
            return x
        return batch

    return {
        "the largest accepted value": with_value(limit),
        "just beyond it": with_value(np.nextafter(limit, np.inf)),
        "a subnormal": with_value(5e-324),
        "a constant row": lambda x: np.vstack([x[:3], np.full((1, D), 7.0), x[4:]]),
        "a far spike": with_value(limit / 10),
        "a typical batch": lambda x: x,
    }


def state_of(model: Any) -> dict[str, Any]:
    """A copy of the state map of a torch model or of a NumPy-facing one."""
    state = model.get_state() if hasattr(model, "get_state") else model.__getstate__()["state"]
    return state_map_of(state)


def state_map_of(state: dict[str, Any]) -> dict[str, Any]:
    return {key: value.copy() if isinstance(value, np.ndarray) else value for key, value in state.items()}


def outcome(model: Any, batch: Any) -> type[BaseException] | None:
    try:
        model.update(batch)
    except (ValueError, TypeError, ArithmeticError) as err:
        return type(err)
    return None


def covariance(model: Any) -> np.ndarray:
    _, f, psi = (np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64) for v in model.snapshot())
    return f @ f.T + np.diag(psi)


#: A known divergence: after a row at float32's largest accepted value (1e18) in data of scale 1e-2, ψ = d̄² − |z|² of
#: that feature is below what float32 rows resolve; the Rust core's float32 kernels (float32 arithmetic) then
#: break down on the rows after it (H̄ not positive definite), while the torch rows (float64 arithmetic on float32
#: storage) go on. Strict: the test fails once the two agree, so the mark goes with the fix.
FLOAT32_SPIKE = pytest.mark.xfail(strict=True, reason="float32 Rust kernels break down after a 1e18 row")
#: The same in float64, seen on one CPU path: after the row at a tenth of float64's largest accepted value, Σ's
#: smallest eigenvalue is ~1e-14 of its largest, so whether the next batch breaks down is decided by rounding; with
#: seed 0 the AVX-512 float64 kernel does where the portable and AVX2 kernels and the torch rows do not. Not strict:
#: on a CPU without AVX-512 the two agree. What every path must do after such a row is tested below.
FLOAT64_SPIKE = pytest.mark.xfail(strict=False, reason="AVX-512 float64 kernel breaks down after a 1e153 row")
SPIKE_MARKS = {"float32": FLOAT32_SPIKE, "float64": FLOAT64_SPIKE}


@pytest.mark.parametrize("store", ["rust", "torch"])
@pytest.mark.parametrize("family, dtype", [(family, dtype) for family in ("OnlineEM", "OnlineSGA")
                                           for dtype in ("float64", "float32")])
def test_rows_after_a_far_spike_go_on_or_leave_the_model_as_it_was(family: str, dtype: str, store: str) -> None:
    """Whether a path breaks down on a row at a tenth of the largest accepted value, or on the rows after it, is
    decided by rounding (see the marks above); what every store must do is either go on or raise
    NumericalBreakdownError and keep its state exactly."""
    X = stream(200, D, 3)
    convert = (lambda a: a) if store == "rust" else torch.as_tensor
    model = getattr(onlinefa, family)(D, K, seed=0, dtype=dtype, n_warmup=20,
                                      **({} if store == "rust" else {"device": "cpu"})).update(convert(X[:40]))
    batches = [edge_batches(dtype)["a far spike"](X[40:48])] + [X[start:start + 8] for start in range(48, 80, 8)]
    for batch in batches:
        before = state_of(model)
        answer = outcome(model, convert(batch))
        assert answer in (None, onlinefa.errors.NumericalBreakdownError), answer
        if answer is not None:
            assert_same_state(state_of(model), before)


@pytest.mark.parametrize("family, dtype, scale", [
    pytest.param(family, dtype, scale, marks=SPIKE_MARKS[dtype]) if (family, scale) == ("OnlineEM", 1.0)
    else (family, dtype, scale)
    for family in ("OnlineEM", "OnlineSGA") for dtype in ("float64", "float32") for scale in (1.0, 1e-30)
])
def test_edge_rows_get_the_same_answer_on_both_row_stores(family: str, dtype: str, scale: float) -> None:
    X = stream(200, D, 3) * scale
    rust = getattr(onlinefa, family)(D, K, seed=0, dtype=dtype, n_warmup=20).update(X[:40])
    torch_model = getattr(onlinefa, family)(D, K, seed=0, dtype=dtype, n_warmup=20, device="cpu").update(torch.as_tensor(X[:40]))
    start = 40
    for name, make in edge_batches(dtype).items():
        batch = make(X[start:start + 8])
        start += 8
        rust_before, torch_before = state_of(rust), state_of(torch_model)
        answers = outcome(rust, batch), outcome(torch_model, torch.as_tensor(batch))
        assert answers[0] == answers[1], f"{name}: Rust {answers[0]}, torch {answers[1]}"
        if answers[0] is not None:
            assert_same_state(state_of(rust), rust_before)
            assert_same_state(state_of(torch_model), torch_before)
    if dtype == "float64":
        expected = covariance(rust)
        assert np.abs(covariance(torch_model) - expected).max() <= 1e-8 * np.abs(expected).max()
