"""The check every query runs on its input rows: the first row holding NaN, ±Inf or |x| > 1e100 is named."""

from __future__ import annotations

import numpy as np
import pytest

import onlinefa
from onlinefa._validation import MAX_ABS_VALUE, check_finite_samples, first_bad_row

BAD_VALUES = [np.nan, np.inf, -np.inf, np.nextafter(MAX_ABS_VALUE, np.inf), -1e101, 1e300]


def first_bad_row_by_definition(x: np.ndarray) -> int | None:
    """The first row with an entry that is not a finite number of magnitude at most MAX_ABS_VALUE."""
    for i, row in enumerate(x):
        if any(not (np.isfinite(v) and abs(float(v)) <= MAX_ABS_VALUE) for v in row):
            return i
    return None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", BAD_VALUES)
def test_the_first_bad_row_is_named(dtype: type, bad: float) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal((6, 33)).astype(dtype)
        rows = rng.choice(6, size=rng.integers(1, 4), replace=False)
        for r in rows:
            with np.errstate(over="ignore"):  # float32 holds 1e101 and 1e300 as inf: still bad
                x[r, rng.integers(33)] = bad
        expected = first_bad_row_by_definition(x)
        assert expected == min(rows)
        with pytest.raises(ValueError, match=f"^row {expected} contains NaN, infinity"):
            check_finite_samples(x)
        # Strided views of the same rows give the same answer.
        with pytest.raises(ValueError, match=f"^row {expected} contains"):
            check_finite_samples(np.asfortranarray(x))


def test_values_at_the_bound_and_empty_inputs_pass() -> None:
    x = np.array([[MAX_ABS_VALUE, -MAX_ABS_VALUE, 0.0], [-0.0, 5e-324, -1e-300]])
    assert check_finite_samples(x) is x
    empty = np.zeros((0, 4))
    assert check_finite_samples(empty) is empty
    with pytest.raises(ValueError, match="^row 0 contains"):
        check_finite_samples(np.array([1.0, np.nan]))


def test_first_bad_row_is_none_for_clean_rows_and_the_index_otherwise() -> None:
    x = np.random.default_rng(1).standard_normal((5, 9))
    assert first_bad_row(x) is None
    x[3, 4], x[4, 0] = -np.inf, np.nan
    assert first_bad_row(x) == 3


def test_online_vbfa_names_the_first_incomplete_row() -> None:
    x = np.random.default_rng(2).standard_normal((40, 6))
    x[17, 2] = 1e101
    x[30, 0] = np.nan
    with pytest.raises(ValueError, match=r"^row 17 of X contains NaN, infinity or \|x\| > 1e\+100 \(OnlineVBFA"):
        onlinefa.OnlineVBFA(2, random_state=0).partial_fit(x)
