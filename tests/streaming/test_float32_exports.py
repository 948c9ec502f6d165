"""A float32 estimator exports float32 arrays, built without a float64 copy of the loadings.

``components_``, ``noise_variance_`` and ``mean_`` of ``OnlineFactorAnalysis(dtype="float32")`` are the
float64 fitted values rounded once to float32 (``components_`` through a float32 product with the K×K
canonical rotation). Memory is measured in a fresh process (Linux's resettable peak-RSS counter): with F
the float32 D×K loadings (B bytes), ``components_`` needs the float32 snapshot (B) and its result (B) plus
D-sized vectors and an O(block·K) float64 block: the bound 2.5·B is below the 6·B of a float64 snapshot
(2·B), its canonical rotation (2·B) and the transposed copy (2·B) that ``components_`` used to build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa import OnlineFactorAnalysis

from peak_rss import PRELUDE

D, K = 40, 3


def fitted(dtype: str, algorithm: str) -> OnlineFactorAnalysis:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, K)) @ rng.standard_normal((K, D)) + rng.standard_normal((300, D))
    return OnlineFactorAnalysis(K, algorithm=algorithm, dtype=dtype, random_state=0).fit(x.astype(dtype))


@pytest.mark.parametrize("algorithm", ["em", "sga"])
def test_float32_exports_are_float32_roundings_of_the_float64_values(algorithm: str) -> None:
    fa = fitted("float32", algorithm)
    mean, loadings, noise_variance = fa._model.snapshot()  # float64
    assert fa.mean_.dtype == fa.noise_variance_.dtype == fa.components_.dtype == np.float32
    np.testing.assert_array_equal(fa.mean_, mean.astype(np.float32))
    np.testing.assert_array_equal(fa.noise_variance_, noise_variance.astype(np.float32))
    expected = onlinefa.canonical_loadings(loadings).T
    assert fa.components_.shape == (K, D) and fa.components_.flags.c_contiguous
    np.testing.assert_allclose(fa.components_, expected, rtol=0, atol=1e-6 * K * np.abs(expected).max())
    # Same canonical form: F_c F_cᵀ = F Fᵀ, rows of F_c orthogonal, largest entry of each row positive.
    comp = fa.components_.astype(np.float64)
    np.testing.assert_allclose(comp.T @ comp, loadings @ loadings.T, rtol=1e-5, atol=1e-5 * np.abs(loadings).max() ** 2)
    assert np.all(comp[np.arange(K), np.argmax(np.abs(comp), axis=1)] > 0)


def test_float64_exports_stay_float64() -> None:
    fa = fitted("float64", "em")
    assert fa.mean_.dtype == fa.noise_variance_.dtype == fa.components_.dtype == np.float64
    np.testing.assert_array_equal(fa.components_, onlinefa.canonical_loadings(fa._model.loadings).T)


CHILD = PRELUDE + r"""
import json, sys
import numpy as np
from onlinefa import OnlineFactorAnalysis


d, k = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
fa = OnlineFactorAnalysis(k, dtype="float32", n_warmup=2, random_state=0)
fa.partial_fit(rng.standard_normal((k + 4, d), dtype=np.float32))
reset_peak()
before = rss("VmRSS:")
components = fa.components_
print(json.dumps({"extra": rss("VmHWM:") - before, "dtype": str(components.dtype)}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak-RSS counter")
@pytest.mark.slow
def test_float32_components_need_no_float64_copy_of_the_loadings() -> None:
    d, k = 400_000, 10
    out = subprocess.run([sys.executable, "-c", CHILD, str(d), str(k)], check=True, capture_output=True,
                         text=True).stdout
    result = json.loads(out)
    loadings_bytes = d * k * 4
    assert result["dtype"] == "float32"
    assert result["extra"] <= 2.5 * loadings_bytes, f"components_ grew the peak by {result['extra'] / loadings_bytes:.2f}x F"
