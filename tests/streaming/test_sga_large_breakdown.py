"""A numerical breakdown of a large OnlineSGA (D·K above the 2**18 elements below which a failed batch is
restored from a full copy) leaves the model exactly as it was before the failing sample: same mean,
loadings and noise variances, and the same future, bit for bit, as a twin that never saw the bad sample."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import onlinefa

D, K = 70_000, 4  # D·K = 280,000 > 2**18
BAD = 1e90  # accepted by validation (float64 inputs up to 1e100), but its latent second moment overflows


def assert_same_model(a: onlinefa.OnlineSGA, b: onlinefa.OnlineSGA) -> None:
    assert a.n_seen == b.n_seen
    for got, want in zip(a.snapshot(), b.snapshot()):
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    "n_before, n_good", [(30, 2), (6, 0)], ids=["fitted", "fails-on-the-first-sample-after-warm-up"]
)
def test_a_failed_sample_leaves_a_large_model_as_before_it(n_before: int, n_good: int) -> None:
    x = np.random.default_rng(0).standard_normal((40, D))
    model = onlinefa.OnlineSGA(D, K, seed=1).update(x[:n_before])
    assert model.n_warmup == 6 and D * K > onlinefa._core.snapshot_max_elements()
    twin = pickle.loads(pickle.dumps(model))
    good = x[n_before: n_before + n_good]
    with pytest.raises(onlinefa.NumericalBreakdownError):
        model.update(np.vstack([good, np.full((1, D), BAD)]))
    twin.update(good)  # the rows before the failing one stay applied
    if n_before + n_good > model.n_warmup:
        assert_same_model(model, twin)
    else:  # still in warm-up: no fitted model to compare yet, the state must be the same
        assert model.n_seen == twin.n_seen and np.array_equal(model.mean, twin.mean)
    model.update(x[n_before + n_good:])
    twin.update(x[n_before + n_good:])
    assert_same_model(model, twin)
