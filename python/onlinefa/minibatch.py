"""Mini-batch online EM for factor analysis, and whole-data-set fitting with several passes.

:class:`MiniBatchEM` shares one F and Ψ across the E-step of B samples, so its statistics are matrix
products computed by the Rust core with the GIL released, instead of B separate passes over the D×K state
(:class:`onlinefa.OnlineEM`, the thesis's Algorithm 2, which changes F and Ψ after every sample).
:func:`fit_minibatch` streams a data set (in memory or memory-mapped) through it several times, shuffled,
until the average log-likelihood stops improving.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core as _engine
from ._forklock import ModelLock
from ._gaussian import CachedSnapshot, FactorGaussianMixin, refreshed_snapshot
from ._persist import CheckpointMixin
from ._gaussian import log_prob as _log_prob
from .errors import NotFittedError
from .streaming import DEFAULT_NOISE_FLOOR, schedule_args
from ._validation import (
    as_sample_matrix,
    check_choice,
    check_dims,
    check_init,
    check_int,
    check_positive_float,
    check_seed,
    SeedLike,
)

FloatArray = NDArray[np.float64]

#: Rows read at a time when the data set's moments are computed (bounded memory on memory maps).
MOMENT_CHUNK_ROWS = 4096
#: Rows of the sample on which :func:`fit_minibatch` measures the average log-likelihood after each pass.
MAX_SCORE_ROWS = 5000
#: Rows handed to a per-sample model at a time by :func:`fit_passes` (it applies them one by one).
PASS_CHUNK_ROWS = 4096
#: Step sizes over batches that :class:`onlinefa.OnlineFactorAnalysis` uses for mini-batch EM by default:
#: ρ_t = max((t + 1)^(−0.6), 1/t), the setting measured best (docs/results/minibatch.md).
MINIBATCH_KAPPA = 0.6
MINIBATCH_TAU0 = 1.0
#: Consecutive passes without an improvement of ``tol`` after which :func:`fit_minibatch` stops.
PATIENCE = 2


class MiniBatchEM(CheckpointMixin, FactorGaussianMixin):
    """Mini-batch online EM for factor analysis: N(mean, F Fᵀ + diag ψ) from mini-batches of samples.

    For the t-th mini-batch X_b (B×D) with deviations D_b = X_b − θ̄: the E-step (Brownlie 2021, eq. 4.23)
    of every row with the current F and Ψ, M = D_b Ψ⁻¹ F Σ with Σ = (I + Fᵀ Ψ⁻¹ F)⁻¹; stepwise statistics
    Ā ← (1 − ρ_t) Ā + ρ_t D_bᵀ M / B, B̄ ← (1 − ρ_t) B̄ + ρ_t Mᵀ M / B, d̄² likewise; then the M-step
    F = Ā (Σ + B̄)⁻¹, ψ = d̄² − rowsum(F ⊙ Ā) (eqs. 4.33, 4.35) and, with ``whiten``, the parameter-expanded
    (whitening) step that makes Σ + B̄ = I. ρ_t follows ``schedule`` over *batches*. This is a different
    algorithm from the thesis's Algorithm 2 (which updates F and Ψ after every sample): with
    ``batch_size=1`` use :class:`onlinefa.OnlineEM`.

    Parameters
    ----------
    n_features : int
        D (>= 2).
    n_components : int
        K, 1 <= K < D.
    batch_size : int, default=1000
        Rows per mini-batch: :meth:`update` splits its input into consecutive batches of this size.
    whiten : bool, default=True
        Apply the whitening (parameter-expanded EM) step after every M-step.
    schedule : {"power", "harmonic", "constant"}, default="power"
        Step sizes over batches: ρ_t = max((t + ``tau0``)^(−``kappa``), 1/t), 1/t, or max(``rho``, 1/t).
    tau0, kappa, rho : float, default=1.0, 0.6, 0.01
        Parameters of the schedule.
    noise_floor : float, default=1e-10
        Lower bound on every ψ_d relative to σ̂² (the mean over features of d̄²).
    init : array-like of shape (n_features, n_components), optional
        Starting loadings before scaling (default: orthonormal columns drawn with ``seed``); the model starts
        at F₀ σ̂ and ψ = d̄² once the first batch (or the given moments) fixes the data's scale.
    seed : int, numpy.random.Generator, numpy.random.SeedSequence or None, default=None
        Seed of the initial loadings (a ``Generator`` gives one draw ``int(seed.integers(0, 2**63 - 1))``).
    mean, variance : array-like of shape (n_features,), optional
        The data set's exact mean and per-feature variance, when known (:func:`fit_minibatch` computes
        them): θ̄ then stays fixed instead of being a running mean, and the start (F₀ σ̂, ψ₀) is taken
        from the variance before the first batch. d̄² is always averaged with the same ρ_t as Ā and B̄,
        which keeps ψ non-negative.

    Attributes
    ----------
    mean, loadings, noise_variance : ndarray
        θ̄ (D), F (D×K) and ψ (D), read from one consistent state.
    n_seen, n_batches : int
        Rows and mini-batches applied so far.

    Notes
    -----
    Calls on one model from several threads happen in a serial order: each :meth:`update`,
    :meth:`exact_step`, averaging call, :meth:`snapshot` (and so every query), ``save`` and pickling
    holds the model's lock for the whole call, so two concurrent updates end in the state of one of the
    two serial orders and a query sees the state before or after a whole update. In a child made by
    ``fork()`` while another thread held that lock, the model raises ``RuntimeError`` instead of hanging.
    """

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        batch_size: int = 1000,
        whiten: bool = True,
        schedule: Literal["power", "harmonic", "constant"] = "power",
        tau0: float = 1.0,
        kappa: float = 0.6,
        rho: float = 0.01,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        init: ArrayLike | None = None,
        seed: SeedLike = None,
        mean: ArrayLike | None = None,
        variance: ArrayLike | None = None,
    ) -> None:
        d, k = check_dims(n_features, n_components)
        self._n_features, self._n_components = d, k
        self._batch_size = check_int(batch_size, "batch_size", 1)
        moments = _moment_args(mean, variance, d)
        floor, steps = check_positive_float(noise_floor, "noise_floor"), schedule_args(schedule, tau0, kappa, rho)
        self._core = _engine.MiniBatchEMCore(
            d, k, init=check_init(init, d, k), seed=check_seed(seed), noise_floor=floor, whiten=bool(whiten),
            **steps, **moments,
        )
        self._settings = _settings(self._batch_size, {**steps, "noise_floor": floor, "whiten": bool(whiten)},
                                   bool(moments))
        self._cache: CachedSnapshot | None = None
        self._lock = ModelLock()

    def _engine_state(self) -> dict[str, Any]:
        with self._lock:
            return {**self._core.get_state(), "batch_size": self._batch_size}

    def _restore(self, state: dict[str, Any]) -> None:
        if "_lock" not in self.__dict__:  # a new object made by unpickling or load()
            self._lock = ModelLock()
        self._core = _engine.MiniBatchEMCore.from_state(state)
        self._n_features = int(state["n_features"])
        self._n_components = int(state["n_components"])
        self._batch_size = check_int(int(state["batch_size"]), "batch_size", 1)
        self._settings = _settings(self._batch_size, state, bool(state["fixed"]))
        self._cache = None

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in self._settings.items())
        return (
            f"MiniBatchEM(n_features={self._n_features}, n_components={self._n_components}, {settings}, "
            f"n_batches={self.n_batches}, n_seen={self.n_seen})"
        )

    def update(self, X: ArrayLike, rows: ArrayLike | None = None) -> MiniBatchEM:
        """Apply the rows of ``X`` (or the rows ``X[rows]``, in that order) as consecutive mini-batches of
        ``batch_size`` rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_features,)
            float32/float64 arrays are read in place; other real dtypes are converted once.
        rows : array-like of int, optional
            Indices of the rows to apply (negative ones count from the end, as in NumPy). The rows are read
            where they lie: a shuffled pass over an array needs no shuffled copy.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, or NaN/±Inf/too large values (the message names the row of ``X``): every row is
            checked before the first mini-batch is applied, so nothing is applied.
        TypeError
            ``rows`` is not an array of integers.
        IndexError
            An index in ``rows`` is out of bounds (checked before any batch is applied).
        NumericalBreakdownError
            A mini-batch broke down numerically. The state from before the call is restored when the
            model's D·K is at most ``onlinefa._core.snapshot_max_elements()`` (as the per-sample models do);
            for larger models the mini-batches before the failing one stay applied.
        """
        arr = as_sample_matrix(X, self._n_features)
        index = None if rows is None else _row_index(rows, arr.shape[0])
        n = arr.shape[0] if index is None else index.shape[0]
        if n > self._batch_size:  # one mini-batch is atomic in the core; several need these two guards
            _check_rows(arr, index)
        with self._lock:  # the whole call is one step of the model's serial order
            backup = None
            if n > self._batch_size and self._n_features * self._n_components <= _engine.snapshot_max_elements():
                backup = self._core.get_state()
            self._cache = None
            try:
                for start in range(0, n, self._batch_size):
                    if index is None:
                        self._core.update(arr[start:start + self._batch_size])
                    else:
                        self._core.update(arr, index[start:start + self._batch_size])
            except BaseException:
                if backup is not None:
                    self._core = _engine.MiniBatchEMCore.from_state(backup)
                raise
        return self

    def start_average(self) -> MiniBatchEM:
        """Start averaging the statistics over the batches that follow (Polyak–Ruppert averaging).

        Every later batch adds its stepwise statistics (Ā, B̄, d̄²) to running means, until
        :meth:`apply_average`; the model itself keeps moving as without averaging. Calling it again
        restarts the window. The iterate of stepwise EM keeps the noise of the last ~1/ρ_t batches only;
        the average over many batches removes it. :func:`fit_minibatch` averages over the last half of its
        passes and returns the averaged model.

        Returns
        -------
        self
        """
        with self._lock:
            self._core.start_average()
        return self

    def apply_average(self) -> MiniBatchEM:
        """Replace the statistics by their averages since :meth:`start_average`, set F and ψ to the M-step
        of the averages (with the whitening step when ``whiten=True``) and stop averaging. With no batch
        averaged yet it only stops averaging.

        Returns
        -------
        self

        Raises
        ------
        RuntimeError
            :meth:`start_average` was not called.
        """
        with self._lock:
            self._core.apply_average()
            self._cache = None
        return self

    def exact_step(self, X: ArrayLike) -> MiniBatchEM:
        """One exact (batch) EM step over all rows of ``X``: the E-step of every row with the current F
        and Ψ (read in batches of ``batch_size`` rows), then one M-step from the totals (Rubin & Thayer's EM
        for factor analysis, with the whitening step when ``whiten=True``). It cannot lower the likelihood
        of ``X`` and has no step-size noise; :func:`fit_minibatch` switches to it once its passes stall. The
        step counters do not change and any averaging stops.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        self

        Raises
        ------
        RuntimeError
            No batch has been applied yet (the step starts from a fitted model).
        ValueError
            Wrong shape, NaN/±Inf/too large values; the model is unchanged.
        """
        arr = as_sample_matrix(X, self._n_features)
        step = self._batch_size
        with self._lock:  # every batch's E-step sees the same F, Ψ
            _exact_em_step(self, (arr[start:start + step] for start in range(0, arr.shape[0], step)))
        return self

    def discard_average(self) -> MiniBatchEM:
        """Stop averaging and forget the averages; the model itself does not change.

        Returns
        -------
        self
        """
        with self._lock:
            self._core.discard_average()
        return self

    @property
    def n_averaged(self) -> int | None:
        """Batches averaged since :meth:`start_average`, or None when not averaging."""
        return self._core.n_averaged

    @property
    def n_features(self) -> int:
        """D."""
        return self._n_features

    @property
    def n_components(self) -> int:
        """K."""
        return self._n_components

    @property
    def batch_size(self) -> int:
        """Rows per mini-batch."""
        return self._batch_size

    @property
    def n_seen(self) -> int:
        """Rows applied so far."""
        return self._core.n_seen

    @property
    def n_batches(self) -> int:
        """Mini-batches applied so far."""
        return self._core.n_batches

    @property
    def n_warmup(self) -> int:
        """Always 0: the first mini-batch both fixes the data's scale and is fitted."""
        return 0

    @property
    def is_fitted(self) -> bool:
        """Whether at least one mini-batch was applied."""
        return self._core.is_fitted

    def snapshot(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(mean, loadings, noise_variance) from one consistent state, cached read-only until the next update.

        Raises
        ------
        NotFittedError
            Before the first mini-batch.
        """
        with self._lock:  # a state between two calls, never one in the middle of an update
            if not self._core.is_fitted:
                raise NotFittedError(f"{type(self).__name__} has not seen a mini-batch yet.")
            cached = refreshed_snapshot(self._core, self._cache)
            self._cache = cached
        return cached[1], cached[2], cached[3]

    def _params(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        return self.snapshot()

    @property
    def mean(self) -> FloatArray:
        """θ̄ (D)."""
        return self.snapshot()[0]

    @property
    def loadings(self) -> FloatArray:
        """F (D×K)."""
        return self.snapshot()[1]

    @property
    def noise_variance(self) -> FloatArray:
        """ψ (D)."""
        return self.snapshot()[2]


def _settings(batch_size: int, state: dict[str, Any], fixed_mean: bool) -> dict[str, Any]:
    """The configuration ``repr`` shows, from the validated arguments or the engine's state (same keys, same
    values, so a checkpoint or a pickle shows the same): the schedule with only the parameters it uses."""
    settings: dict[str, Any] = {"batch_size": batch_size, "whiten": bool(state["whiten"]),
                                "schedule": str(state["schedule"])}
    if settings["schedule"] == "power":
        settings.update(tau0=float(state["tau0"]), kappa=float(state["kappa"]))
    elif settings["schedule"] == "constant":
        settings["rho"] = float(state["rho"])
    settings.update(noise_floor=float(state["noise_floor"]), fixed_mean=fixed_mean)
    return settings


def _moment_args(mean: ArrayLike | None, variance: ArrayLike | None, n_features: int) -> dict[str, Any]:
    if (mean is None) != (variance is None):
        raise ValueError("mean and variance must be given together")
    if mean is None or variance is None:
        return {}
    out = {}
    for name, values in (("mean", mean), ("variance", variance)):
        arr = np.array(values, dtype=np.float64)
        if arr.shape != (n_features,) or not np.isfinite(arr).all():
            raise ValueError(f"{name} must be a finite array of shape ({n_features},), got shape {arr.shape}")
        out[name] = arr
    if (out["variance"] < 0).any():
        raise ValueError("variance must be >= 0")
    return out


@dataclass
class FitHistory:
    """What :func:`fit_minibatch` did: the average log-likelihood after each pass and whether it converged."""

    scores: list[float] = field(default_factory=list)
    converged: bool = False
    #: How many of the passes were exact EM steps (mini-batch EM switches to them once its passes stall).
    n_exact_steps: int = 0

    @property
    def n_passes(self) -> int:
        """Passes made."""
        return len(self.scores)


def _check_rows(arr: NDArray[Any], index: NDArray[np.int64] | None) -> None:
    """Raise ValueError naming the first row of ``arr`` (in the order of ``index``) holding NaN, ±Inf or a
    magnitude above the input limit of its dtype (1e18 for float32 input, 1e100 for float64), as the core
    would for that row's mini-batch; read in chunks of about 2²² values (bounded temporary memory)."""
    limit = _INPUT_LIMITS[arr.dtype.itemsize]
    n = arr.shape[0] if index is None else index.shape[0]
    step = max(1, (1 << 22) // max(1, arr.shape[1]))
    for start in range(0, n, step):
        chunk = arr[start:start + step] if index is None else arr[index[start:start + step]]
        bad = ~np.all(np.abs(chunk) <= limit, axis=1)
        if np.any(bad):
            row = start + int(np.argmax(bad))
            values = chunk[row - start]
            value = values[~(np.abs(values) <= limit)][0]
            kind = "NaN or infinity" if not np.isfinite(value) else f"a value with |x| > {limit:.0e}"
            at = f"row {row} of X" if index is None else f"row {int(index[row])} of X (position {row} of rows)"
            raise ValueError(f"{at} contains {kind}; no row of this batch was applied")


#: Largest accepted |x| by the itemsize of the input's float type (the core's limits).
_INPUT_LIMITS = {4: 1e18, 8: 1e100}


def _row_index(rows: ArrayLike, n_rows: int) -> NDArray[np.int64]:
    """``rows`` as a 1-D int64 index into ``n_rows`` rows (negative indices count from the end)."""
    index = np.asarray(rows)
    if index.ndim != 1 or not (index.dtype.kind in "iu" or index.size == 0):
        raise TypeError(f"rows must be a 1-D array of integers, got dtype {index.dtype} and shape {index.shape}")
    index = index.astype(np.int64)
    bad = (index < -n_rows) | (index >= n_rows)
    if bad.any():
        raise IndexError(f"rows: index {int(index[bad][0])} is out of bounds for X with {n_rows} rows")
    return np.where(index < 0, index + n_rows, index)


def data_moments(X: Any, chunk_rows: int = MOMENT_CHUNK_ROWS) -> tuple[FloatArray, FloatArray]:
    """Exact mean and per-feature variance (divided by N) of an (N, D) array.

    An in-memory float array is read once, in place, by the core; memory maps and files are read in chunks
    of ``chunk_rows`` rows (memory O(chunk·D)). Chunks are combined with the pairwise formula of Chan,
    Golub & LeVeque, so a data set's offset costs no precision.

    Raises
    ------
    ValueError
        NaN, ±Inf or a value above 1e100 in magnitude (the message names the first bad row).
    """
    if _rows_readable_in_place(X):
        chunk_rows = max(1, X.shape[0])
    n_total = 0
    mean = np.zeros(X.shape[1])
    m2 = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], chunk_rows):
        chunk = as_sample_matrix(X[start:start + chunk_rows], X.shape[1])
        chunk_mean, chunk_m2 = _engine.column_moments(chunk, start)
        n = chunk.shape[0]
        delta = chunk_mean - mean
        total = n_total + n
        mean = mean + delta * (n / total)
        m2 = m2 + chunk_m2 + delta**2 * (n_total * n / total)
        n_total = total
    return mean, m2 / n_total


def fit_minibatch(
    X: ArrayLike | str | os.PathLike[str],
    n_components: int,
    *,
    batch_size: int = 1000,
    max_iter: int = 10,
    tol: float = 1e-5,
    shuffle: Literal["auto", "rows", "blocks", "none"] = "auto",
    random_state: int | None = None,
    on_rows: Callable[[int], None] | None = None,
    **options: Any,
) -> tuple[MiniBatchEM, FitHistory]:
    """Fit a :class:`MiniBatchEM` to a whole data set: exact moments in one pass, then up to ``max_iter``
    shuffled passes of mini-batch EM, stopping when two consecutive passes fail to improve the best average
    log-likelihood L (on a fixed sample of at most 5,000 rows) by ``tol`` · max(1, ``|L|``) nats per row.

    The statistics are averaged (:meth:`MiniBatchEM.start_average`) over the last half of the passes (the
    window restarts at passes 1, 2, 3, 5, 9, ...); each pass is scored, and the model returned, as the
    M-step of that average (Polyak–Ruppert averaging), which removes the step-size noise of the iterate.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features), or the path of a ``.npy`` file
        In memory, memory-mapped (``np.load(path, mmap_mode="r")``), or a path: a path is read in
        mini-batches with positioned reads (:class:`NpyRows`), so a file larger than RAM is fitted with the
        model plus one batch (and one chunk for the moments) resident.
    n_components : int
        K.
    batch_size : int, default=1000
        Rows per mini-batch.
    max_iter : int, default=10
        Largest number of passes over the data.
    tol : float, default=1e-5
        Stop when two consecutive passes gain less than ``tol`` · max(1, ``|L|``) nats per row over the best
        earlier pass's average log-likelihood L (0 runs all ``max_iter`` passes).
    shuffle : {"auto", "rows", "blocks", "none"}, default="auto"
        "rows" visits the rows in a new random order each pass; "blocks" shuffles the order of the
        consecutive ``batch_size``-row blocks (sequential reads, for files larger than RAM); "auto" is
        "blocks" for paths and ``numpy.memmap`` inputs and "rows" otherwise.
    random_state : int or None, default=None
        Seed of the initial loadings and of the shuffling.
    on_rows : callable, optional
        Called with the number of rows of each batch once it has been applied (progress reporting).
    **options
        Further keyword arguments of :class:`MiniBatchEM` (``whiten``, ``schedule``, ``kappa``, ...).

    Returns
    -------
    model : MiniBatchEM
    history : FitHistory

    Raises
    ------
    ValueError
        Bad data or arguments; or, for a path: the path is not a regular file (a FIFO, device or directory
        is refused at once instead of blocking), or the file changed while it was being fitted (replaced,
        renamed, removed, or rewritten in place with a new size or modification time: checked before every
        pass and at the end, the message names the file). The fit is then abandoned and no model is
        returned; the file is never written. (A rewrite in place that keeps the size and falls within the
        file system's timestamp granularity cannot be detected.)
    """
    arr = _as_data_matrix(X)
    max_iter = check_int(max_iter, "max_iter", 1)
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    try:
        mode = _shuffle_mode(shuffle, arr)
        seed = check_seed(random_state)
        rng = np.random.default_rng(seed)
        mean, variance = data_moments(arr)
        model = MiniBatchEM(arr.shape[1], n_components, batch_size=batch_size, seed=seed, mean=mean,
                            variance=variance, **options)
        return model, fit_passes(model, arr, max_iter=max_iter, tol=tol, shuffle=mode, rng=rng, on_rows=on_rows)
    finally:
        if isinstance(arr, NpyRows):
            arr.close()


def fit_passes(model: Any, arr: Any, *, max_iter: int, tol: float, shuffle: str, rng: np.random.Generator,
               on_rows: Callable[[int], None] | None = None) -> FitHistory:
    """Feed ``arr`` to ``model.update`` (any streaming model) for up to ``max_iter`` passes in the order
    ``shuffle`` gives, scoring each pass on a fixed sample of rows and stopping by :func:`_stalled`.

    A file-backed ``arr`` (:class:`NpyRows`) is checked to be unchanged before every pass and at the end
    (ValueError otherwise; ``model`` is then left with the passes made so far, possibly mixing two files).
    """
    score_rows = np.sort(rng.choice(arr.shape[0], min(arr.shape[0], MAX_SCORE_ROWS), replace=False))
    held = np.asarray(arr[score_rows], dtype=np.float64)
    chunk = model.batch_size if isinstance(model, MiniBatchEM) else PASS_CHUNK_ROWS
    history = FitHistory()
    averaged = isinstance(model, MiniBatchEM)
    in_place = averaged and shuffle == "rows" and _rows_readable_in_place(arr)
    exact = False
    for p in range(max_iter):
        _check_source(arr)
        if exact:
            _exact_em_step(model, _batches(arr, chunk, "none", rng), on_rows)
            history.n_exact_steps += 1
        else:
            if averaged and p & (p - 1) == 0:  # p = 0, 1, 2, 4, ...: the window is the last half of the passes
                model.start_average()
            _one_pass(model, arr, chunk, shuffle, in_place, rng, on_rows)
        # Mini-batch EM is judged by its tail average; the iterate runs on freely (feeding the average back
        # after each pass slowed convergence on ill-conditioned data).
        if averaged:  # the core scores with its E-step kernel, without forming the averaged model's arrays
            history.scores.append(model._core.mean_log_prob(held, not exact))
        else:
            history.scores.append(float(np.mean(_log_prob(held, *model.snapshot()))))
        # An exact step or an averaged pass is not noisy: one pass without gain is evidence enough.
        if tol > 0 and _stalled(history.scores, tol, 1 if averaged else PATIENCE):
            if averaged and not exact:
                model.apply_average()
                exact = True  # finish with exact EM steps, which cannot lower the likelihood
                continue
            history.converged = True
            break
    _check_source(arr)
    if averaged and not exact:
        model.apply_average()
    return history


def _exact_em_step(model: MiniBatchEM, batches: Any, on_rows: Callable[[int], None] | None = None) -> None:
    """One exact EM step: the E-step sums of every batch with the current F, Ψ, added in order, then one
    M-step from the totals."""
    total: list[Any] | None = None
    for batch in batches:
        sums = model._core.exact_sums(batch)
        total = list(sums) if total is None else [t + s for t, s in zip(total, sums)]
        if on_rows is not None:
            on_rows(batch.shape[0])
    if total is None:
        raise ValueError("an exact EM step needs at least one row")
    model._core.apply_exact(*total)
    model._cache = None


def _one_pass(model: Any, arr: Any, chunk: int, shuffle: str, in_place: bool, rng: np.random.Generator,
              on_rows: Callable[[int], None] | None) -> None:
    """One pass of ``arr`` through ``model.update`` in chunks of ``chunk`` rows, in the order ``shuffle``
    gives; with ``in_place`` the shuffled rows are read where they lie (``update(arr, rows=...)``)."""
    if not in_place:
        for batch in _batches(arr, chunk, shuffle, rng):
            model.update(batch)
            if on_rows is not None:
                on_rows(batch.shape[0])
        return
    order = rng.permutation(arr.shape[0])
    for start in range(0, arr.shape[0], chunk):
        index = np.sort(order[start:start + chunk])
        model.update(arr, rows=index)
        if on_rows is not None:
            on_rows(index.shape[0])


def _stalled(scores: list[float], tol: float, patience: int) -> bool:
    """Whether the last ``patience`` passes all failed to beat the best earlier score by
    ``tol`` · max(1, |best|) (relative for scores far from 0: the average log-likelihood grows with D).

    For the plain streaming models a single pass is not enough evidence (``PATIENCE`` = 2): their statistics
    are noisy, and one pass can score a little below the previous one while the fit is still improving.
    """
    if len(scores) <= patience:
        return False
    best_before = max(scores[:-patience])
    return max(scores[-patience:]) < best_before + tol * max(1.0, abs(best_before))


class NpyRows:
    """Rows of a ``.npy`` file read on demand with positioned reads, never mapped into memory.

    A memory map would count every page it touched towards the process's resident memory, so a pass over
    a file larger than RAM would push out everything else; positioned reads go through the page cache,
    which the kernel reclaims, and keep the process at the model plus one batch. Supports ``len``,
    ``shape``, ``dtype`` and indexing by a slice or by sorted row indices (C-order files only).

    The file is opened once and held open (:meth:`close`); its device, inode, size and modification time
    (ns) are recorded then, and :meth:`check_unchanged` compares both the open file and the file now at
    ``path`` with them, so a multi-pass reader can refuse a data set that was replaced or rewritten between
    passes. Only a regular file is accepted: a FIFO, device or directory raises instead of blocking.

    Raises
    ------
    ValueError
        ``path`` is not a regular file, is not a C-order 2-D numeric ``.npy`` file, or is shorter than its
        header says (the message names the file).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{self.path!r} is not a regular file (a FIFO, device or directory cannot be "
                                 "read in several passes); save the data to a .npy file first")
            with open(fd, "rb", closefd=False) as handle:
                version = np.lib.format.read_magic(handle)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
                else:
                    raise ValueError(f"{self.path}: .npy format version {version} is not supported")
                self._offset = handle.tell()
            if fortran or len(shape) != 2 or dtype.hasobject:
                raise ValueError(f"{self.path}: expected a C-order 2-D numeric .npy file, got shape {shape}, "
                                 f"fortran_order={fortran}, dtype {dtype}")
            self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
            self.dtype = np.dtype(dtype)
            self._row_bytes = self.shape[1] * self.dtype.itemsize
            if info.st_size < self._offset + self.shape[0] * self._row_bytes:
                raise ValueError(f"{self.path}: file is shorter than its header says")
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._identity = _file_identity(info)
        self.ndim = 2

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self.close()

    def check_unchanged(self) -> None:
        """Raise ValueError naming the file when it changed since it was opened.

        Both the open file (rewritten in place: size or modification time differ) and the file now at the
        path (replaced, renamed or removed: device or inode differ) are compared with what was recorded at
        opening. A rewrite in place that keeps the size and lands within the file system's timestamp
        granularity of the opening cannot be seen by these checks.
        """
        if self._fd is None:
            raise ValueError(f"{self.path!r} was closed")
        was = self._identity
        now_open = _file_identity(os.fstat(self._fd))
        try:
            now_path: tuple[int, int, int, int] | None = _file_identity(os.stat(self.path))
        except OSError:
            now_path = None
        for now, where in ((now_open, "the open file"), (now_path, "the file now at that path")):
            if now is None:
                raise ValueError(f"{self.path!r} was removed or renamed while it was being read")
            if now != was:
                what = [name for name, a, b in zip(("device", "inode", "size", "modification time"), was, now)
                        if a != b]
                raise ValueError(f"{self.path!r} changed while it was being read ({where}: {', '.join(what)} "
                                 "differ from when it was opened); its passes would mix two data sets")

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice | NDArray[np.integer[Any]]) -> NDArray[Any]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step != 1:
                raise ValueError("NpyRows supports contiguous slices only")
            return self._read(start, max(stop - start, 0))
        rows = np.asarray(index)
        return np.concatenate([self._read(int(r), 1) for r in rows]) if rows.size else self._read(0, 0)

    def _read(self, start: int, count: int) -> NDArray[Any]:
        if self._fd is None:
            raise ValueError(f"{self.path!r} was closed")
        out = np.empty((count, self.shape[1]), dtype=self.dtype)
        view = out.data.cast("B")
        done, total, offset = 0, count * self._row_bytes, self._offset + start * self._row_bytes
        while done < total:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise ValueError(f"{self.path}: file is shorter than its header says")
            done += got
        return out


def _file_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _check_source(arr: Any) -> None:
    """Refuse (ValueError) a file-backed data set that changed since it was opened (see :class:`NpyRows`)."""
    if isinstance(arr, NpyRows):
        arr.check_unchanged()


def _as_data_matrix(X: ArrayLike | str | os.PathLike[str]) -> Any:
    if isinstance(X, (str, os.PathLike)):
        return NpyRows(X)
    if isinstance(X, np.memmap):
        arr: NDArray[Any] = X
    else:
        arr = np.asarray(X)
    if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] < 2:
        raise ValueError(f"expected a data matrix of shape (n_samples >= 2, n_features >= 2), got {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"expected real numeric data, got dtype {arr.dtype}")
    return arr


def _rows_readable_in_place(arr: Any) -> bool:
    """Whether the core can read rows of ``arr`` where they lie (an in-memory float array with contiguous,
    aligned, native rows), so a shuffled pass needs no gathered copies."""
    return (type(arr) is np.ndarray and arr.dtype in (np.float32, np.float64) and arr.dtype.isnative
            and arr.flags.aligned and arr.strides[1] == arr.dtype.itemsize)


def _shuffle_mode(shuffle: str, arr: Any) -> str:
    check_choice(shuffle, "shuffle", ("auto", "rows", "blocks", "none"))
    if shuffle == "auto":
        return "blocks" if isinstance(arr, (np.memmap, NpyRows)) else "rows"
    return shuffle


def _batches(arr: Any, batch_size: int, mode: str, rng: np.random.Generator) -> Any:
    """Yield the mini-batches of one pass as core-readable float arrays (one batch in memory at a time)."""
    n = arr.shape[0]
    starts = np.arange(0, n, batch_size)
    if mode == "blocks":
        starts = rng.permutation(starts)
    order = rng.permutation(n) if mode == "rows" else None
    for start in starts:
        if order is None:
            rows = arr[start:start + batch_size]
        else:
            rows = arr[np.sort(order[start:start + batch_size])]
        yield as_sample_matrix(rows, arr.shape[1])
