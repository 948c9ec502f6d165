"""Errors by kind: a numerical breakdown is a NumericalBreakdownError (an ArithmeticError, not a
ValueError), an allocation failure a MemoryError, invalid input a ValueError."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import _core


def test_breakdown_class_is_one_exported_arithmetic_error() -> None:
    assert onlinefa.NumericalBreakdownError is _core.NumericalBreakdownError
    assert issubclass(onlinefa.NumericalBreakdownError, ArithmeticError)
    assert not issubclass(onlinefa.NumericalBreakdownError, ValueError)


@pytest.mark.parametrize("model", ["VBFA", "OnlineVBFA"])
def test_breakdown_raises_the_breakdown_class(model: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 6))
    estimator = onlinefa.VBFA(2, max_iter=30, random_state=0) if model == "VBFA" else onlinefa.OnlineVBFA(2, random_state=0)
    x[3, 2] = 1e90 if model == "VBFA" else 1e18
    if model == "OnlineVBFA":
        estimator.fit(rng.standard_normal((80, 6)))
    with pytest.raises(onlinefa.NumericalBreakdownError, match="numerical breakdown"):
        estimator.partial_fit(x) if model == "OnlineVBFA" else estimator.fit(x)


def test_invalid_input_stays_a_value_error() -> None:
    with pytest.raises(ValueError, match="n_components"):
        onlinefa.OnlineEM(5, 0)


def test_allocation_failure_is_a_memory_error() -> None:
    # In a subprocess, as a precaution: 2**40 × 1 float64 values (8 TiB) cannot be reserved.
    code = (
        "import onlinefa\n"
        "try:\n    onlinefa.OnlineEM(2**40, 1, seed=0)\n"
        "except MemoryError as err:\n    print('memory:', err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("memory: cannot allocate"), result.stderr[-500:]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: onlinefa.OnlineEM(5, 2, scaling="raw"), "scaling must be 'data' or 'unit', got 'raw'"),
    (lambda: onlinefa.OnlineSGA(5, 2, schedule="cosine"),
     "schedule must be 'harmonic', 'power' or 'constant', got 'cosine'"),
    (lambda: onlinefa.OnlineEM(5, 5), "n_components must be < n_features = 5, got 5"),
    (lambda: onlinefa.MiniBatchEM(5, 7), "n_components must be < n_features = 5, got 7"),
    (lambda: onlinefa.GFA(2, groups=[3, 2], noise="row").fit(np.ones((6, 5))),
     "noise must be 'group' or 'feature', got 'row'"),
])
def test_named_choices_and_ranks_are_refused_with_the_allowed_values(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
