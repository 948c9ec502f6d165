"""Data of the ``calibration`` experiment: digits with shifted and out-of-distribution sets, or a user's ``.npz``.

Digits (scikit-learn's 8×8 images, pixels scaled to [0, 1]) are split once (seed 0, 20 % test, stratified).
The shifted test sets are the clean test images with Gaussian pixel noise of s.d. 0.1, 0.2 and 0.4
(clipped to [0, 1]), a rotation by ±15° (sign per image), and a translation by one pixel (direction per
image); the out-of-distribution sets are uniform-noise images and, for the network trained on digits 0–4
only (``digits04``), the test digits 5–9. Inputs are standardised with the training rows' mean and s.d.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Fraction of digits held out for testing, and the seed of the split and of the shifts.
TEST_FRACTION, SPLIT_SEED = 0.2, 0
#: Pixel-noise s.d. of the shifted sets (pixels in [0, 1]).
NOISE_LEVELS = (0.1, 0.2, 0.4)
#: Rotation of the rotated set, in degrees.
ROTATION_DEGREES = 15.0


class ClassificationSet(NamedTuple):
    """A standardised classification task with its shifted and OOD test inputs."""

    name: str
    x_train: FloatArray
    y_train: IntArray
    x_test: FloatArray
    y_test: IntArray
    shifts: dict[str, tuple[FloatArray, IntArray]]  #: name → (inputs, labels)
    ood: dict[str, FloatArray]  #: name → inputs
    n_classes: int


def _standardised(task: ClassificationSet, *, per_feature: bool = True) -> ClassificationSet:
    """Inputs centred and scaled by the training rows' mean and s.d., per feature or (images) over all pixels,
    so that pixel noise is not blown up in the nearly constant border pixels."""
    axis = 0 if per_feature else None
    centre = task.x_train.mean(axis=axis)
    spread = task.x_train.std(axis=axis)
    spread = np.where(spread > 0.0, spread, 1.0)

    def scale(x: FloatArray) -> FloatArray:
        scaled: FloatArray = (x - centre) / spread
        return scaled

    return task._replace(x_train=scale(task.x_train), x_test=scale(task.x_test),
                         shifts={k: (scale(x), y) for k, (x, y) in task.shifts.items()},
                         ood={k: scale(x) for k, x in task.ood.items()})


def _rotated(images: FloatArray, rng: np.random.Generator) -> FloatArray:
    from scipy import ndimage

    signs = rng.choice([-1.0, 1.0], size=images.shape[0])
    rotated: FloatArray = np.stack([np.clip(ndimage.rotate(image, sign * ROTATION_DEGREES, reshape=False, order=1), 0.0, 1.0)
                     for image, sign in zip(images, signs)])
    return rotated


def _translated(images: FloatArray, rng: np.random.Generator) -> FloatArray:
    moves = [(0, 1), (0, -1), (1, 1), (1, -1)]  # (axis, step) in the 8×8 image
    out = np.zeros_like(images)
    choices = np.asarray(rng.integers(0, len(moves), size=images.shape[0]))
    for index in range(images.shape[0]):
        axis, step = moves[int(choices[index])]
        moved = np.roll(images[index], step, axis=axis)
        edge = 0 if step > 0 else -1
        if axis == 0:
            moved[edge, :] = 0.0
        else:
            moved[:, edge] = 0.0
        out[index] = moved
    return out


def _shifted_sets(x_test: FloatArray, y_test: IntArray, rng: np.random.Generator) -> dict[str, tuple[FloatArray, IntArray]]:
    images = x_test.reshape(-1, 8, 8)
    shifts = {f"noise{level}": (np.clip(x_test + level * rng.standard_normal(x_test.shape), 0.0, 1.0), y_test)
              for level in NOISE_LEVELS}
    shifts["rotate15"] = (_rotated(images, rng).reshape(x_test.shape), y_test)
    shifts["translate1"] = (_translated(images, rng).reshape(x_test.shape), y_test)
    return shifts


def digits_sets() -> list[ClassificationSet]:
    """The two built-in tasks: ``digits`` (10 classes, shifted sets, uniform-noise OOD) and ``digits04``
    (digits 0–4; OOD: the test digits 5–9 and uniform noise)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                                                        stratify=y)
    rng = np.random.default_rng(SPLIT_SEED)
    noise_images = rng.uniform(0.0, 1.0, size=x_test.shape)
    digits = ClassificationSet("digits", x_train, y_train, x_test, y_test, _shifted_sets(x_test, y_test, rng),
                               {"noise": noise_images}, 10)
    low_train, low_test = y_train < 5, y_test < 5
    held_out = ClassificationSet("digits04", x_train[low_train], y_train[low_train], x_test[low_test],
                                 y_test[low_test], {}, {"digits59": x_test[~low_test], "noise": noise_images}, 5)
    return [_standardised(digits, per_feature=False), _standardised(held_out, per_feature=False)]


#: Feature-noise s.d. of the breast-cancer shifted sets, in units of each feature's training s.d.
FEATURE_NOISE_LEVELS = (0.5, 1.0, 2.0)


def breast_cancer_set() -> ClassificationSet:
    """scikit-learn's breast-cancer set (569 rows, 30 features, 2 classes), split as digits; shifted sets:
    Gaussian noise of 0.5, 1 and 2 training s.d. per feature; OOD: rows uniform over each feature's
    training range."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                                                        stratify=y)
    rng = np.random.default_rng(SPLIT_SEED)
    spread = x_train.std(axis=0)
    shifts = {f"noise{level}": (x_test + level * spread * rng.standard_normal(x_test.shape), y_test)
              for level in FEATURE_NOISE_LEVELS}
    uniform = rng.uniform(x_train.min(axis=0), x_train.max(axis=0), size=x_test.shape)
    task = ClassificationSet("breast_cancer", x_train, y_train, x_test, y_test, shifts, {"uniform": uniform}, 2)
    return _standardised(task)


class DataFileError(ValueError):
    """A ``--data`` file that is not a valid classification set (the message says what is wrong)."""


def _features(values: object, key: str, n_features: int | None) -> FloatArray:
    array = np.asarray(values)
    if array.ndim != 2 or array.shape[0] == 0 or not np.issubdtype(array.dtype, np.number):
        raise DataFileError(f"{key} must be a non-empty numeric 2-D array, got shape {array.shape} of {array.dtype}")
    if n_features is not None and array.shape[1] != n_features:
        raise DataFileError(f"{key} has {array.shape[1]} columns, x_train has {n_features}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise DataFileError(f"{key} holds NaN or infinite values")
    return array


def _labels(values: object, key: str, n_rows: int, n_classes: int | None) -> IntArray:
    array = np.asarray(values)
    if array.shape != (n_rows,):
        raise DataFileError(f"{key} must have shape ({n_rows},) to match its inputs, got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        if not (np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array))
                and np.all(array == np.round(array))):
            raise DataFileError(f"{key} must hold integer class labels")
    labels = array.astype(np.int64)
    if labels.min() < 0 or (n_classes is not None and labels.max() >= n_classes):
        bound = "" if n_classes is None else f" (y_train has classes 0…{n_classes - 1})"
        raise DataFileError(f"{key} has labels out of range{bound}")
    return labels


def load_npz(path: Path) -> ClassificationSet:
    """A classification set from ``path``: ``x_train, y_train, x_test, y_test``, any ``x_shift_<name>,
    y_shift_<name>`` pairs and any ``x_ood_<name>`` inputs (labels 0 … C − 1, C = max(y_train) + 1).

    Raises
    ------
    DataFileError
        Unreadable file, missing keys, mismatched lengths or widths, non-finite values, labels out of range.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as err:
        raise DataFileError(f"cannot read {path} as an .npz file: {err}") from err
    missing = [key for key in ("x_train", "y_train", "x_test", "y_test") if key not in arrays]
    if missing:
        raise DataFileError(f"{path} lacks {', '.join(missing)}")
    x_train = _features(arrays["x_train"], "x_train", None)
    y_train = _labels(arrays["y_train"], "y_train", x_train.shape[0], None)
    n_classes, width = int(y_train.max()) + 1, x_train.shape[1]
    if n_classes < 2:
        raise DataFileError("y_train must hold at least two classes")
    x_test = _features(arrays["x_test"], "x_test", width)
    y_test = _labels(arrays["y_test"], "y_test", x_test.shape[0], n_classes)
    shifts: dict[str, tuple[FloatArray, IntArray]] = {}
    for key in sorted(k for k in arrays if k.startswith("x_shift_")):
        name = key.removeprefix("x_shift_")
        if f"y_shift_{name}" not in arrays:
            raise DataFileError(f"{key} has no y_shift_{name}")
        x_shift = _features(arrays[key], key, width)
        shifts[name] = (x_shift, _labels(arrays[f"y_shift_{name}"], f"y_shift_{name}", x_shift.shape[0], n_classes))
    orphans = [k for k in arrays if k.startswith("y_shift_") and "x_shift_" + k.removeprefix("y_shift_") not in arrays]
    if orphans:
        raise DataFileError(f"{orphans[0]} has no matching x_shift_ inputs")
    ood = {key.removeprefix("x_ood_"): _features(arrays[key], key, width)
           for key in sorted(k for k in arrays if k.startswith("x_ood_"))}
    return _standardised(ClassificationSet(path.stem, x_train, y_train, x_test, y_test, shifts, ood, n_classes))
