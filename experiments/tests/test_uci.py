"""The packaged UCI datasets and their loader (``onlinefa.datasets.load_uci``)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from onlinefa._uci import UCI_DATASETS, load_uci

# Shapes published with the datasets (UCI repository pages; thesis Table 6.3).
EXPECTED_SHAPES = {"energy": (768, 8), "boston": (506, 13), "concrete": (1030, 8), "yacht": (308, 6)}


@pytest.mark.parametrize(("name", "shape"), sorted(EXPECTED_SHAPES.items()))
def test_shapes_and_dtype(name: str, shape: tuple[int, int]) -> None:
    X, y = load_uci(name)
    assert X.shape == shape
    assert y.shape == (shape[0],)
    assert X.dtype == np.float64 and y.dtype == np.float64
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(y))


@pytest.mark.parametrize("name", sorted(EXPECTED_SHAPES))
def test_target_is_not_among_the_inputs(name: str) -> None:
    X, y = load_uci(name)
    assert not any(np.array_equal(X[:, j], y) for j in range(X.shape[1]))


def test_known_first_records() -> None:
    # First instance of each original file: Energy Efficiency Y1 = 15.55 (relative compactness 0.98),
    # Boston MEDV = 24.0 (CRIM 0.00632), Concrete strength 79.99 (cement 540), Yacht resistance 0.11.
    first = {name: load_uci(name) for name in EXPECTED_SHAPES}
    assert first["energy"][1][0] == pytest.approx(15.55) and first["energy"][0][0, 0] == pytest.approx(0.98)
    assert first["boston"][1][0] == pytest.approx(24.0) and first["boston"][0][0, 0] == pytest.approx(0.00632)
    assert first["concrete"][1][0] == pytest.approx(79.99) and first["concrete"][0][0, 0] == pytest.approx(540.0)
    assert first["yacht"][1][0] == pytest.approx(0.11)


def test_aliases_and_case() -> None:
    X_boston, y_boston = load_uci("boston")
    for alias in ("bostonHousing", "BostonHousing", "BOSTON"):
        X_alias, y_alias = load_uci(alias)
        np.testing.assert_array_equal(X_alias, X_boston)
        np.testing.assert_array_equal(y_alias, y_boston)


def test_returns_fresh_arrays() -> None:
    X_first, y_first = load_uci("yacht")
    X_first[0, 0] = -1e9
    y_first[0] = -1e9
    X_second, y_second = load_uci("yacht")
    assert X_second[0, 0] != -1e9 and y_second[0] != -1e9


def test_unknown_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown UCI dataset 'wine'"):
        load_uci("wine")


def test_non_string_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        load_uci(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("folder", sorted(UCI_DATASETS.values()))
def test_files_are_package_resources(folder: str) -> None:
    root = resources.files("onlinefa") / "data" / "uci" / folder
    for filename in ("data.txt", "index_features.txt", "index_target.txt"):
        assert (root / filename).is_file(), f"{folder}/{filename} is not shipped with the package"


def test_reexported_from_datasets() -> None:
    from onlinefa import datasets

    assert datasets.load_uci is load_uci
