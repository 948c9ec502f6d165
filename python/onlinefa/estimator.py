"""scikit-learn style estimator: :class:`OnlineFactorAnalysis`, a streaming ``FactorAnalysis``.

With scikit-learn installed the class is a real ``BaseEstimator`` + ``TransformerMixin`` (it passes
``sklearn.utils.estimator_checks``, works in pipelines, ``clone``, grid search, ``set_output``); without
it, it is a plain class with the same methods (``get_params``/``set_params`` included). scikit-learn is
imported when this module is first imported, never by ``import onlinefa`` itself.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._forklock import ForkSafeLock
from ._gaussian import check_dense_size, precision_factor
from .streaming import DEFAULT_NOISE_FLOOR, OnlineEM, OnlineSGA, resolve_warmup
from ._gaussian import latent_mean
from .minibatch import MINIBATCH_KAPPA, MINIBATCH_TAU0, MiniBatchEM, data_moments, fit_passes
from ._validation import check_dtype, check_finite_samples, check_int, check_positive_float, check_sga_lr, first_bad_row
from ._persist import checkpoint_params, param_entries
from ._registry import STREAMING_METHODS, inner_class, streaming_class
from ._sklearn_base import ConvergenceWarning, EstimatorBase, NotFittedError, as_real_matrix, seed_from
from .rotation import canonical_loadings, canonical_rotation
from ._exports import AnyFloatArray, canonical_components32, storage_snapshot

if TYPE_CHECKING:
    from typing_extensions import Self

FloatArray = NDArray[np.float64]
StreamingModel = OnlineEM | OnlineSGA | MiniBatchEM

#: Largest magnitude accepted by the query methods (transform, score, ...), as for fitting with
#: float64 state: it keeps every intermediate of the Woodbury computations finite.
MAX_QUERY_MAGNITUDE = 1e100

_SCHEDULES = ("auto", "harmonic", "power", "constant")
#: Hyper-parameters added after checkpoint format v1 first shipped, with the values that reproduce the
#: estimator of that time (thesis Algorithm 2), for checkpoints that do not store them.
_LEGACY_PARAMS: dict[str, Any] = {"whiten": False, "schedule": "harmonic", "tau0": 0.0, "kappa": 0.9, "rho": 0.01,
                                   "batch_size": 1, "max_iter": 1, "tol": 1e-5}
_CHECKPOINT_KIND = "OnlineFactorAnalysis"
#: Passes of ``fit`` with ``max_iter="auto"`` and ``batch_size > 1`` (an upper limit: the stopping rule of
#: ``tol`` ends the fit earlier; chosen by measurement, docs/results/minibatch.md).
MINIBATCH_MAX_ITER = 100
#: K fitted when ``n_components=None`` (capped at n_features − 1).
DEFAULT_N_COMPONENTS = 10
#: Guards the installation of the model by the first partial_fit when several threads race for it.
_FIRST_MODEL_LOCK = ForkSafeLock()


def _state_dtype(dtype: object) -> str:
    """``dtype`` as "float32" or "float64"; ValueError for anything else, whatever NumPy makes of it."""
    try:
        return check_dtype(dtype)
    except ValueError:
        raise
    except Exception as err:  # np.dtype raises SyntaxError, KeyError, ... for some strings
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}") from err


def _resolve_n_components(n_components: object, n_features: int) -> int:
    """The K fitted for ``n_features`` (see the ``n_components`` parameter of OnlineFactorAnalysis)."""
    if n_components is None:
        return min(DEFAULT_N_COMPONENTS, n_features - 1)
    return min(check_int(n_components, "n_components", 1), n_features - 1)


def _check_finite(X: NDArray[Any], limit: float | None) -> None:
    """Raise ValueError for NaN/±Inf, and for magnitudes above ``limit`` when one is given."""
    if limit is None or float(np.finfo(X.dtype).max) <= limit:  # e.g. float32: finite implies within limit
        if not np.isfinite(X).all():
            raise ValueError("Input X contains NaN or infinity")
        return
    if first_bad_row(X, limit) is not None:
        if not np.isfinite(X).all():
            raise ValueError("Input X contains NaN or infinity")
        raise ValueError(f"Input X contains a value with |x| > {limit:g}, the largest accepted")


class OnlineFactorAnalysis(EstimatorBase):
    """Streaming factor analysis with scikit-learn's estimator API (a streaming ``FactorAnalysis``).

    Fits N(``mean_``, ``components_ᵀ components_`` + diag ``noise_variance_``) in one pass over the
    data, with online EM (thesis Algorithm 2) or online SGA (Algorithm 1), in O(D·K) memory. Unlike
    ``sklearn.decomposition.FactorAnalysis`` it never forms a D×D matrix (except in
    :meth:`get_covariance` / :meth:`get_precision`), so D can be in the millions.

    Parameters
    ----------
    n_components : int or None, default=None
        K, the number of latent factors (>= 1). None means min(10, n_features − 1). A value >= n_features
        is fitted with K = n_features − 1 factors (``n_components_``), which already express every
        covariance matrix exactly: Σ = (Σ − λ_min I) + λ_min I with Σ − λ_min I positive semi-definite
        of rank <= n_features − 1. The streaming models need K < n_features.
    algorithm : {"em", "sga"}, default="em"
        Online EM (:class:`onlinefa.OnlineEM`) or online stochastic gradient ascent
        (:class:`onlinefa.OnlineSGA`).
    n_warmup : int or "auto", default="auto"
        Samples during which only the running averages move and the loadings keep their initial value;
        "auto" is min(K + 2, 100). :meth:`fit` needs more rows than this, and after :meth:`partial_fit`
        the estimator counts as fitted (and answers queries) only once more rows than this were seen.
    lr : "auto" or float, default="auto"
        Step of ``algorithm="sga"`` (validated, unused by EM): "auto", the whitened steps of size 1/t of
        :class:`onlinefa.OnlineSGA`, or a constant learning rate.
    whiten : bool, default=True
        EM only (validated, unused by SGA): apply the whitening (parameter-expanded EM) step after each
        M-step (:class:`onlinefa.OnlineEM`, docs/design/whitening.md). ``whiten=False, schedule="harmonic"``
        is exactly the thesis's Algorithm 2. The estimator reports the fit as it is (maximum likelihood, as
        scikit-learn's ``FactorAnalysis``), without the shrinkage :class:`onlinefa.OnlineEM` applies by
        default (its ``shrink``).
    schedule : {"auto", "harmonic", "power", "constant"}, default="auto"
        Step sizes ρ_t of the running averages. "auto" is "harmonic" (ρ_t = 1/t, equal weights: the
        fitted marginal variances are the samples' own, :class:`onlinefa.OnlineEM`) for one pass over the
        data, and "power" with ``kappa`` when EM makes several passes (``max_iter > 1``; the mini-batch
        configuration ``batch_size > 1`` has its own). "power": ρ_t = (t + ``tau0``)^(−``kappa``);
        "constant": ρ_t = ``rho`` (for drifting streams); all floored at 1/t.
    tau0 : float, default=0.0
        τ₀ >= 0 of the "power" schedule.
    kappa : float, default=0.9
        κ in (0.5, 1] of the "power" schedule.
    rho : float, default=0.01
        ρ in (0, 1] of the "constant" schedule.
    noise_floor : float, default=1e-10
        Lower bound on every noise variance ψ_d, relative to σ̂² (the mean over features of the running
        squared deviations), so it has no units. A constant feature gets ψ_d at the floor and a zero
        loading row.
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state (float32 halves memory; inputs must then stay below 1e18). Also the
        dtype of ``components_``, ``noise_variance_`` and ``mean_``; :meth:`transform`, :meth:`score_samples`,
        :meth:`sample`, :meth:`get_covariance` and :meth:`get_precision` compute and return float64.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the orthonormal initial loadings (thesis §4.4) and of the shuffling of ``max_iter > 1``
        passes. None draws fresh entropy.
    batch_size : int, default=1
        1 is the exact per-sample stream above. B > 1 (EM only) selects mini-batch online EM
        (:class:`onlinefa.MiniBatchEM`): the E-step of B rows shares one F and Ψ, so each batch costs
        two matrix products instead of B passes over the state. It is a different algorithm from the
        thesis's Algorithm 2; with ``schedule="auto"`` its step sizes over batches are
        ρ_t = (t + 1)^(−0.6), the setting measured best for it (``kappa``/``tau0`` apply with
        ``schedule="power"``), and ``n_warmup``, ``dtype`` and ``noise_floor``'s absolute meaning do not
        apply (the state is float64, the floor relative to the data's scale).
    max_iter : int or "auto", default="auto"
        Passes of :meth:`fit` over ``X``. "auto" is 1 for ``batch_size=1`` (the thesis's single pass over
        the stream, in order) and ``MINIBATCH_MAX_ITER`` (100) for ``batch_size > 1``, so that fitting a data
        matrix with mini-batches converges by default as scikit-learn's ``FactorAnalysis.fit`` does (the
        stopping rule below usually ends it after a few passes: 4 on 10⁵ × 1,000 rows of an FA model).
        1 streams the rows once, in order. More passes visit the rows in a new random order each time and
        stop early once two consecutive passes fail to raise the best average log-likelihood L (of at most
        5,000 rows of ``X``) by ``tol`` · max(1, ``|L|``). With ``batch_size > 1``, :meth:`fit` first
        computes ``X``'s exact mean, and passes run as in :func:`onlinefa.fit_minibatch`: the statistics are
        averaged over the last half of the passes and, once a pass fails to gain, exact EM steps finish the
        fit. When more than one pass is allowed, ``tol > 0`` and the passes run out before the stopping rule
        is met, :meth:`fit` warns with a ``ConvergenceWarning`` (``onlinefa.errors.ConvergenceWarning``, also
        scikit-learn's when it is installed). :meth:`partial_fit` always streams its rows once.
    tol : float, default=1e-5
        Relative stopping threshold of the passes (0 runs every pass, without a warning).

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Canonical loadings F_cᵀ (scikit-learn's orientation): the fitted F rotated by an orthogonal Q so
        that F_cᵀ F_c is diagonal and decreasing, with the largest-magnitude entry of each row of
        ``components_`` positive (:func:`onlinefa.canonical_loadings`). The Gaussian is unchanged
        (F_c F_cᵀ = F Fᵀ), and fits of the same data from different seeds give comparable rows.
    noise_variance_ : ndarray of shape (n_features,)
        Noise variances ψ.
    mean_ : ndarray of shape (n_features,)
        Running mean of the samples seen.
    n_samples_seen_ : int
        Number of samples seen since the last :meth:`fit`.
    n_features_in_ : int
        Number of features, fixed by the first :meth:`partial_fit` (or :meth:`fit`).
    n_components_ : int
        Number of factors actually fitted (``n_components`` resolved as described above).
    n_iter_ : int
        Passes made over ``X`` by the last :meth:`fit`, exact EM steps of mini-batch EM included (0 after
        :meth:`partial_fit` only).

    Notes
    -----
    Thread safety: concurrent :meth:`partial_fit` calls are serialised by the engine (each batch is
    applied atomically, the GIL is released meanwhile); queries may run concurrently with them.
    Hyper-parameters are read by :meth:`fit` and by the first :meth:`partial_fit`; changing them with
    ``set_params`` afterwards takes effect at the next :meth:`fit`. Rows are applied in order with
    exact sequential semantics, so ``fit(X)`` equals any sequence of ``partial_fit`` calls on
    consecutive chunks of ``X``. Fitting inputs are read in place when they are float32/float64
    (NumPy arrays, memory maps, DLPack producers such as PyTorch/JAX CPU arrays).

    Examples
    --------
    >>> import numpy as np
    >>> from onlinefa import OnlineFactorAnalysis
    >>> X = np.random.default_rng(0).standard_normal((1000, 8))
    >>> fa = OnlineFactorAnalysis(2, n_warmup=50, random_state=0)
    >>> for batch in np.array_split(X, 10):
    ...     _ = fa.partial_fit(batch)
    >>> fa.components_.shape, fa.n_samples_seen_
    ((2, 8), 1000)
    >>> fa.transform(X[:3]).shape
    (3, 2)
    """

    _model: StreamingModel

    def __init__(
        self,
        n_components: int | None = None,
        *,
        algorithm: str = "em",
        n_warmup: int | Literal["auto"] = "auto",
        lr: float | str = "auto",
        whiten: bool = True,
        schedule: str = "auto",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: str = "float64",
        random_state: int | np.random.RandomState | np.random.Generator | None = None,
        batch_size: int = 1,
        max_iter: int | Literal["auto"] = "auto",
        tol: float = 1e-5,
    ) -> None:
        self.n_components = n_components
        self.algorithm = algorithm
        self.n_warmup = n_warmup
        self.lr = lr
        self.whiten = whiten
        self.schedule = schedule
        self.tau0 = tau0
        self.kappa = kappa
        self.rho = rho
        self.noise_floor = noise_floor
        self.dtype = dtype
        self.random_state = random_state
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.tol = tol

    # -- construction of the streaming model ----------------------------------------------------------
    def _model_class(self) -> type[OnlineEM] | type[OnlineSGA]:
        if not isinstance(self.algorithm, str) or self.algorithm not in STREAMING_METHODS:
            raise ValueError(f"algorithm must be one of {STREAMING_METHODS}, got {self.algorithm!r}")
        model_class: type[OnlineEM] | type[OnlineSGA] = streaming_class(self.algorithm)
        return model_class

    def _model_options(self) -> dict[str, Any]:
        """Keyword arguments of the streaming model beyond the shared ones (one place to extend)."""
        if not isinstance(self.whiten, (bool, np.bool_)):
            raise TypeError(f"whiten must be a bool, got {type(self.whiten).__name__}")
        if not isinstance(self.schedule, str) or self.schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {_SCHEDULES}, got {self.schedule!r}")
        schedule = self.schedule
        if schedule == "auto":
            # One pass over a stream: equal weights (the marginal variances are the samples'). Several
            # passes of EM over the same rows: forget the earlier passes, as stochastic-approximation EM
            # needs to converge (with 1/t steps the later passes barely move the fit).
            several_passes = self.algorithm == "em" and self._resolved_max_iter() > 1
            schedule = "power" if several_passes else "harmonic"
        options: dict[str, Any] = {"schedule": schedule, "tau0": self.tau0, "kappa": self.kappa, "rho": self.rho}
        if self.algorithm == "sga":
            return {**options, "lr": self.lr}
        return {**options, "whiten": bool(self.whiten)}

    def _new_model(self, n_features: int, **moments: FloatArray) -> StreamingModel:
        """Validate the hyper-parameters and build a fresh streaming model for ``n_features``."""
        model_class = self._model_class()
        n_components = _resolve_n_components(self.n_components, n_features)
        check_sga_lr(self.lr)
        self._check_pass_options()
        if self.batch_size > 1:
            return self._new_minibatch_model(n_features, n_components, moments)
        # The estimator reports the fit as it is (maximum likelihood, as scikit-learn's FactorAnalysis): after
        # several passes over the same rows the sample count behind the statistics is not the rows' number,
        # which the reporting shrinkage of OnlineEM needs.
        reported: dict[str, Any] = {"shrink": False} if model_class is OnlineEM else {}
        return model_class(
            n_features,
            n_components,
            n_warmup=resolve_warmup(self.n_warmup, n_components),
            seed=seed_from(self.random_state),
            noise_floor=check_positive_float(self.noise_floor, "noise_floor"),
            dtype=_state_dtype(self.dtype),
            **self._model_options(),
            **reported,
        )

    def _check_pass_options(self) -> None:
        check_int(self.batch_size, "batch_size", 1)
        self._resolved_max_iter()
        if not (isinstance(self.tol, (int, float, np.floating)) and np.isfinite(self.tol) and self.tol >= 0):
            raise ValueError(f"tol must be a finite number >= 0, got {self.tol!r}")
        if self.batch_size > 1 and self.algorithm != "em":
            raise ValueError(f"batch_size > 1 is mini-batch EM and needs algorithm='em', got {self.algorithm!r}")

    def _resolved_max_iter(self) -> int:
        """``max_iter`` as a number of passes ("auto": 1 for the per-sample stream, ``MINIBATCH_MAX_ITER``
        for mini-batch EM)."""
        if isinstance(self.max_iter, str):
            if self.max_iter != "auto":
                raise ValueError(f"max_iter must be an int >= 1 or 'auto', got {self.max_iter!r}")
            return 1 if check_int(self.batch_size, "batch_size", 1) == 1 else MINIBATCH_MAX_ITER
        return check_int(self.max_iter, "max_iter", 1)

    def _new_minibatch_model(self, n_features: int, n_components: int, moments: dict[str, FloatArray]) -> MiniBatchEM:
        options = self._model_options()
        if self.schedule == "auto":
            options.update(schedule="power", kappa=MINIBATCH_KAPPA, tau0=MINIBATCH_TAU0)
        return MiniBatchEM(
            n_features,
            n_components,
            batch_size=self.batch_size,
            seed=seed_from(self.random_state),
            noise_floor=check_positive_float(self.noise_floor, "noise_floor"),
            mean=moments.get("mean"),
            variance=moments.get("variance"),
            **options,
        )

    # -- input checks ---------------------------------------------------------------------------------
    def _fitting_input(self, X: object, *, first: bool) -> NDArray[Any]:
        """Validate a fitting batch; ``first``: it fixes n_features (else it must match)."""
        arr = as_real_matrix(X)
        n_samples, n_features = arr.shape
        if n_samples < 1:
            raise ValueError(
                f"Found array with 0 sample(s) (shape={arr.shape}) while a minimum of 1 is required "
                f"by {type(self).__name__}."
            )
        if first and n_features < 2:
            raise ValueError(
                f"Found array with {n_features} feature(s) (shape={arr.shape}) while a minimum of 2 is "
                f"required by {type(self).__name__}."
            )
        if not first:
            self._check_n_features(n_features)
        _check_finite(arr, None)  # the core also rejects magnitudes beyond its dtype's range
        return arr

    def _query_input(self, X: object) -> FloatArray:
        """Validate the input of a query method (fitted model, matching features, finite, float64)."""
        self._fitted_model()
        arr = as_real_matrix(X)
        if arr.shape[0] < 1:
            raise ValueError(
                f"Found array with 0 sample(s) (shape={arr.shape}) while a minimum of 1 is required."
            )
        self._check_n_features(arr.shape[1])
        _check_finite(arr, MAX_QUERY_MAGNITUDE)
        out: FloatArray = arr.astype(np.float64, copy=False)
        return out

    def _check_n_features(self, n_features: int) -> None:
        model: StreamingModel | None = self.__dict__.get("_model")
        if model is None:
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet.")
        expected = model.n_features
        if n_features != expected:
            raise ValueError(
                f"X has {n_features} features, but {type(self).__name__} is expecting {expected} "
                "features as input."
            )

    def _fitted_model(self) -> StreamingModel:
        model: StreamingModel | None = self.__dict__.get("_model")
        if model is None:
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' or 'partial_fit' "
                "with appropriate arguments before using this estimator."
            )
        if not model.is_fitted:
            raise NotFittedError(
                f"This {type(self).__name__} instance has seen {model.n_seen} samples and is still in "
                f"its warm-up of {model.n_warmup}; call 'partial_fit' with more samples (or lower n_warmup)."
            )
        return model

    def __sklearn_is_fitted__(self) -> bool:
        """Whether the estimator has seen more samples than its warm-up (scikit-learn protocol)."""
        model: StreamingModel | None = self.__dict__.get("_model")
        return model is not None and model.is_fitted

    # -- fitting --------------------------------------------------------------------------------------
    def partial_fit(self, X: ArrayLike, y: object = None) -> Self:
        """Update the model with one batch of samples, in row order.

        The first call fixes ``n_features_in_`` and builds the model from the hyper-parameters.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            float32/float64 arrays are read in place; other real dtypes are converted once.
        y : ignored
            Present for scikit-learn API compatibility.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, a feature count different from ``n_features_in_``, an empty batch, NaN/±Inf or
            values too large for the state dtype, or invalid hyper-parameters. Nothing is applied.
        TypeError
            Non-numeric, sparse or complex-object input, or a hyper-parameter of the wrong type.
        """
        model = self.__dict__.get("_model")
        arr = self._fitting_input(X, first=model is None)
        if model is None and self._publish_first_model(arr):
            return self
        self._check_n_features(arr.shape[1])
        self.__dict__["_model"].update(arr)
        return self

    def _publish_first_model(self, arr: NDArray[Any]) -> bool:
        """Fit a fresh model to ``arr`` and install it unless another thread installed one meanwhile.

        The model is installed only after its first batch succeeded, so a failed first ``partial_fit``
        leaves the estimator unfitted. Returns False when another thread won the race; the caller then
        applies ``arr`` to that model (the result is the serial order "their batch, then ours").
        """
        fresh = self._new_model(arr.shape[1])
        fresh.update(arr)
        with _FIRST_MODEL_LOCK:
            if "_model" in self.__dict__:
                return False
            self._model = fresh
        return True

    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Forget previous data and fit a fresh model to the rows of ``X``.

        With ``batch_size=1`` and the default ``max_iter="auto"`` this is the thesis's single pass: the rows
        are streamed once, in order, exactly as the same rows given to :meth:`partial_fit`. With
        ``batch_size > 1`` (mini-batch EM) it fits the data matrix to convergence: the exact mean and variance
        of ``X``, then shuffled passes until the stopping rule of ``tol`` is met (at most ``max_iter``; "auto"
        is 100), with the statistics averaged over the last half of the passes and exact EM steps at the end
        (docs/guide/minibatch.md). An explicit ``max_iter > 1`` makes shuffled passes for ``batch_size=1`` too.
        ``n_iter_`` reports the passes made.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError, TypeError
            As :meth:`partial_fit`; on error the previous fit is kept unchanged.

        Warns
        -----
        ConvergenceWarning
            More than one pass was allowed, ``tol > 0``, and ``max_iter`` passes ended before the stopping
            rule was met (the fit is kept).
        """
        arr = self._fitting_input(X, first=True)
        self._check_pass_options()
        max_iter = self._resolved_max_iter()
        moments: dict[str, FloatArray] = {}
        if self.batch_size > 1:
            moments["mean"], moments["variance"] = data_moments(arr)
        fresh = self._new_model(arr.shape[1], **moments)
        if arr.shape[0] <= fresh.n_warmup:
            raise ValueError(
                f"fit needs more rows than n_warmup={fresh.n_warmup}, got n_samples={arr.shape[0]}: a fit that "
                "ends inside the warm-up would be only the initialisation. Lower n_warmup or pass more rows."
            )
        converged = True
        if max_iter == 1:
            fresh.update(arr)
            n_iter = 1
        else:
            rng = np.random.default_rng(seed_from(self.random_state))
            history = fit_passes(fresh, arr, max_iter=max_iter, tol=float(self.tol), shuffle="rows", rng=rng)
            n_iter = history.n_passes
            converged = history.converged or float(self.tol) == 0.0
        self._model = fresh
        self.n_iter_ = n_iter
        if not converged:
            warnings.warn(
                f"{type(self).__name__}.fit stopped after max_iter={max_iter} passes before the log-likelihood "
                f"stopped improving by tol={self.tol:g}; raise max_iter (or set tol=0 to run exactly max_iter "
                "passes without this warning).",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def fit_transform(self, X: ArrayLike, y: object = None) -> FloatArray:
        """:meth:`fit` to ``X``, then return ``transform(X)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        return self.fit(X).transform(X)

    # -- queries --------------------------------------------------------------------------------------
    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means of the latent factors, E[h | x] = (I + Fᵀ Ψ⁻¹ F)⁻¹ Fᵀ Ψ⁻¹ (x − mean).

        F is ``components_.T`` (the canonical loadings), so the latents are expressed in the same basis
        as ``components_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        arr = self._query_input(X)
        # One snapshot for both the rotation and the latents: an update in another thread cannot mix states.
        mean, loadings, noise_variance = self._fitted_model().snapshot()
        # E[h | x] of the engine's F, rotated to the basis of components_: F h = (F Q)(Qᵀ h).
        rotation = canonical_rotation(loadings)
        x = check_finite_samples(np.ascontiguousarray(arr, dtype=np.float64))
        latents: FloatArray = latent_mean(x, mean, loadings, noise_variance) @ rotation
        return latents

    def score_samples(self, X: ArrayLike) -> FloatArray:
        """Log-likelihood of each sample under the fitted Gaussian, in O(n·D·K).

        Uses the Woodbury identity and the matrix determinant lemma; no D×D matrix is formed.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        arr = self._query_input(X)
        return self._fitted_model().log_prob(arr)

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Average log-likelihood of the samples (as ``FactorAnalysis.score``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        float
        """
        return float(np.mean(self.score_samples(X)))

    def sample(
        self, n_samples: int = 1, random_state: int | np.random.RandomState | np.random.Generator | None = None
    ) -> FloatArray:
        """Draw samples from the fitted Gaussian without forming the D×D covariance.

        Parameters
        ----------
        n_samples : int, default=1
            Number of draws (>= 0).
        random_state : int, RandomState, Generator or None, default=None
            Seed of the draws (scikit-learn's convention); the same int gives the same draws.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        return self._fitted_model().sample(n_samples, seed=seed_from(random_state))

    def get_covariance(self) -> FloatArray:
        """Dense model covariance, ``components_.T @ components_ + diag(noise_variance_)``.

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If n_features exceeds 5000 (the matrix would be too large).
        """
        return self._fitted_model().covariance()

    def get_precision(self) -> FloatArray:
        """Dense inverse covariance by the Woodbury identity, Ψ⁻¹ − Ψ⁻¹F (I + FᵀΨ⁻¹F)⁻¹ FᵀΨ⁻¹.

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If n_features exceeds 5000 (the matrix would be too large).
        """
        model = self._fitted_model()
        check_dense_size(model.n_features, "get_precision()")
        noise_variance = model.noise_variance
        scaled, chol = precision_factor(model.loadings, noise_variance)
        half = np.linalg.solve(chol, scaled.T)  # L⁻¹ Fᵀ Ψ⁻¹, K×D
        precision: FloatArray = -(half.T @ half)
        precision[np.diag_indices(model.n_features)] += 1.0 / noise_variance
        return precision

    def get_feature_names_out(self, input_features: ArrayLike | None = None) -> NDArray[np.object_]:
        """Names of the output columns of :meth:`transform`: ``onlinefactoranalysis0``, ...

        Parameters
        ----------
        input_features : array-like of str, optional
            Only checked for its length (it must equal ``n_features_in_``).

        Returns
        -------
        ndarray of str objects, shape (n_components,)
        """
        model = self._fitted_model()
        if input_features is not None and len(np.asarray(input_features)) != model.n_features:
            raise ValueError("input_features should have length equal to number of features (n_features_in_)")
        prefix = type(self).__name__.lower()
        return np.array([f"{prefix}{i}" for i in range(model.n_components)], dtype=object)

    # -- fitted attributes ----------------------------------------------------------------------------
    @property
    def components_(self) -> AnyFloatArray:
        """Canonical loadings F_cᵀ, shape (n_components, n_features) (see the class docstring), in the
        model's dtype (float32 for ``dtype="float32"``, built without a float64 copy of the loadings)."""
        loadings = storage_snapshot(self._fitted_model())[1]
        if loadings.dtype == np.float32:
            return canonical_components32(np.asarray(loadings, dtype=np.float32))  # no copy
        return np.ascontiguousarray(canonical_loadings(loadings).T)

    @property
    def noise_variance_(self) -> AnyFloatArray:
        """Noise variances ψ, shape (n_features,), in the model's dtype."""
        return storage_snapshot(self._fitted_model())[2]

    @property
    def mean_(self) -> AnyFloatArray:
        """Running mean, shape (n_features,), in the model's dtype."""
        return storage_snapshot(self._fitted_model())[0]

    @property
    def n_samples_seen_(self) -> int:
        """Number of samples seen since the last :meth:`fit`."""
        return self._fitted_model().n_seen

    @property
    def n_components_(self) -> int:
        """Number of factors fitted (``n_components`` resolved for ``n_features_in_``)."""
        return self._fitted_model().n_components

    @property
    def n_features_in_(self) -> int:
        """Number of features seen during fitting."""
        return self._fitted_model().n_features

    # -- checkpoints ----------------------------------------------------------------------------------
    def _checkpoint_state(self) -> dict[str, Any]:
        state = param_entries(self.get_params())
        model = self.__dict__.get("_model")
        if model is not None:
            state["model.class"] = type(model).__name__
            state.update({f"model.{key}": value for key, value in model.__getstate__()["state"].items()})
        return state

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write an exact checkpoint (hyper-parameters and model state), atomically.

        See :mod:`onlinefa.checkpoint` for the file format. ``load`` then continues bit-identically.

        Parameters
        ----------
        path : str or path-like
            Destination file, used as given.

        Raises
        ------
        TypeError
            A hyper-parameter that the portable format cannot store (e.g. a RandomState object).
        """
        from .checkpoint import save_state

        save_state(path, _CHECKPOINT_KIND, self._checkpoint_state())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a checkpoint written by :meth:`save`.

        Parameters
        ----------
        path : str or path-like
            Checkpoint file.

        Returns
        -------
        OnlineFactorAnalysis

        Raises
        ------
        ValueError
            The file is truncated, corrupted, of an unknown format version or holds another model.
        """
        from .checkpoint import load_state

        state = load_state(path, _CHECKPOINT_KIND, adopt=True)  # arrays move into the engine, not copied
        try:
            params = checkpoint_params(state, cls._get_param_names(), cls.__name__, _LEGACY_PARAMS)
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)!r}: {err}") from err
        estimator = cls(**params)
        if "model.class" in state:
            estimator._model = _restore_model(state, os.fspath(path))
        _check_loaded(estimator, os.fspath(path))
        return estimator


def _check_loaded(estimator: OnlineFactorAnalysis, shown_path: str) -> None:
    """Validate a loaded estimator's hyper-parameters (and their agreement with its model) without building
    a model; ValueError naming the file."""
    try:
        if estimator.n_components is not None:
            check_int(estimator.n_components, "n_components", 1)
        model_class: type[StreamingModel] = estimator._model_class()
        estimator._model_options()
        estimator._check_pass_options()
        check_sga_lr(estimator.lr)
        check_positive_float(estimator.noise_floor, "noise_floor")
        resolve_warmup(estimator.n_warmup, 1)
        dtype = _state_dtype(estimator.dtype)
        if estimator.batch_size > 1:  # mini-batch EM: its own model class, float64 state
            model_class, dtype = MiniBatchEM, "float64"
        model = getattr(estimator, "_model", None)
        if model is not None and (
            type(model) is not model_class
            or model.n_components != _resolve_n_components(estimator.n_components, model.n_features)
            or getattr(model, "dtype", "float64") != dtype
        ):
            raise ValueError("the stored hyper-parameters do not match the stored model")
    except (TypeError, ValueError) as err:
        raise ValueError(f"{shown_path!r} is not a valid OnlineFactorAnalysis checkpoint: {err}") from err


def _restore_model(state: dict[str, Any], shown_path: str) -> StreamingModel:
    """Rebuild the streaming model saved under the ``model.`` prefix of an estimator checkpoint."""
    class_name = state["model.class"]
    model_class: type[StreamingModel] | None = inner_class(class_name)
    if model_class is None:
        raise ValueError(f"{shown_path!r}: unknown model class {class_name!r} in the checkpoint")
    model_state = {
        key[len("model."):]: value
        for key, value in state.items()
        if key.startswith("model.") and key != "model.class"
    }
    model: StreamingModel = object.__new__(model_class)  # as unpickling does: no constructor runs
    model.__setstate__({"class": class_name, "state": model_state})
    return model
