"""onlinefa.GFA under scikit-learn's estimator checks."""

from __future__ import annotations

from typing import Any

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from onlinefa.gfa import GFA
from onlinefa.online_gfa import OnlineGFA

# groups=1 because the checks fit data sets of 1 to 20 features; n_components=1 because several have
# a single sample or feature (K may not exceed min(N, D)).
CHECKED = [
    GFA(1, 1, random_state=0),
    GFA(1, 1, noise="feature", rotate=False, random_state=0),
    OnlineGFA(1, 1, random_state=0),
]


@parametrize_with_checks(CHECKED)
def test_scikit_learn_estimator_checks(estimator: Any, check: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)
