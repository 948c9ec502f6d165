"""Variational Bayesian factor analysis (VB-FA) with the Luttinen–Ilin transformations.

:class:`VBFA` fits a data matrix (NaN = missing) by mean-field coordinate ascent, with the full lower
bound after every sweep and, from a chosen sweep on, the *translation* and *rotation* of the latent
space that speed convergence up (Luttinen & Ilin, "Transformations for variational factor analysis to
speed up learning", §2). :class:`OnlineVBFA` is online VB on the same model: local q(h_n) per
mini-batch, running averages of the expected sufficient statistics, global factors rebuilt from them,
in O(D·K + K²) memory. The arithmetic runs in the Rust core; ``docs/design/vbfa.md`` has the model and the
measured results.

Notation (project ↔ paper): data dimension D ↔ M, latent dimension K ↔ D, loadings F (D×K, row f_d)
↔ W (row w_m), latents h_n ↔ x_n, bias c ↔ μ, noise precisions τ_d ↔ τ_m (the attribute
``noise_variance_`` is ψ_d = 1/⟨τ_d⟩), ARD precisions α_k ↔ α_d. ``components_`` is K×D = F̄ᵀ as in
scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from typing_extensions import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._forklock import ForkSafeLock
from ._gaussian import dense_covariance
from . import _core
from ._persist import EstimatorPersistMixin
from ._sklearn_base import EstimatorBase, NotFittedError, as_real_matrix, seed_from
from ._validation import MAX_ABS_VALUE, check_bool, check_int, check_positive_float, core_readable, first_bad_row

__all__ = ["VBFA", "OnlineVBFA", "VBFAPosterior"]

FloatArray = NDArray[np.float64]
PriorName = Literal["ard", "broad"]
TranslationName = Literal["mean", "exact"]
StepName = Literal["latents", "bias", "loadings", "noise", "ard", "translate", "rotate"]
ScheduleName = Literal["harmonic", "power", "constant"]

#: Fitted attributes of VBFA copied from the engine (rebuilt from it when unpickled).
_DERIVED_ATTRIBUTES = (
    "mean_",
    "components_",
    "noise_variance_",
    "alpha_",
    "n_iter_",
    "elbo_",
    "fit_time_",
    "converged_",
    "n_features_in_",
)
_STEPS = ("latents", "bias", "loadings", "noise", "ard", "translate", "rotate")
#: K fitted when ``n_components=None`` (capped at D).
DEFAULT_N_COMPONENTS = 10
#: Guards the installation of the engine by the first partial_fit when several threads race for it.
_FIRST_ENGINE_LOCK = ForkSafeLock()


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices`` (ValueError otherwise)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def _check_tol(value: object) -> float:
    """Return ``value`` as a finite float >= 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"tol must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (np.isfinite(out) and out >= 0.0):
        raise ValueError(f"tol must be finite and >= 0, got {value}")
    return out


def _check_real(value: object, name: str) -> float:
    """Return ``value`` as a float if it is a real number (TypeError otherwise; the core checks the range)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _as_data(X: ArrayLike, estimator: str, n_features: int | None = None, *, allow_missing: bool) -> FloatArray:
    """Return ``X`` as a C-contiguous float64 (n, D) array with at least one row.

    With ``allow_missing`` NaN stays (a missing value) and ±Inf is left to the core; without it every
    value must be finite with ``|x| <= 1e100``, and the first offending row is named.

    Raises
    ------
    TypeError
        Non-numeric or sparse input.
    ValueError
        Not 2-D, complex, no rows, the wrong D, or (without ``allow_missing``) a non-finite value.
    """
    arr = as_real_matrix(X, estimator)
    if arr.shape[0] < 1:
        raise ValueError(
            f"Found array with 0 sample(s) (shape={arr.shape}) while a minimum of 1 is required by {estimator}."
        )
    if arr.shape[1] < 1:
        raise ValueError(
            f"Found array with 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required by {estimator}."
        )
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(
            f"X has {arr.shape[1]} features, but {estimator} is expecting {n_features} features as input."
        )
    x = core_readable(np.ascontiguousarray(arr, dtype=np.float64))  # aligned too: np.frombuffer may not be
    if not allow_missing:
        bad_row = first_bad_row(x)
        if bad_row is not None:
            raise ValueError(
                f"row {bad_row} of X contains NaN, infinity or |x| > {MAX_ABS_VALUE:g} ({estimator} needs "
                "complete rows; use VBFA for missing values); no row was applied"
            )
    return x


@dataclass(frozen=True)
class VBFAPosterior:
    """Every factor of the variational posterior q of a :class:`VBFA` model (project notation).

    Attributes
    ----------
    latent_mean : ndarray of shape (N, K)
        h̄_n, the means of q(h_n).
    latent_covariance : ndarray of shape (N, K, K)
        Σ_{h_n}.
    bias_mean : ndarray of shape (D,)
        c̄_d, the means of q(c_d).
    bias_variance : ndarray of shape (D,)
        c̃_d.
    loading_mean : ndarray of shape (D, K)
        f̄_d as rows, the means of q(f_d).
    loading_covariance : ndarray of shape (D, K, K)
        Σ_{f_d}.
    ard_shape, ard_rate : ndarray of shape (K,) or None
        q(α_k) = Gamma(shape, rate); None for the fixed broad prior.
    alpha_mean : ndarray of shape (K,)
        ⟨α_k⟩ (the fixed α for the broad prior).
    noise_shape, noise_rate : ndarray of shape (D,)
        q(τ_d) = Gamma(shape, rate).
    """

    latent_mean: FloatArray
    latent_covariance: FloatArray
    bias_mean: FloatArray
    bias_variance: FloatArray
    loading_mean: FloatArray
    loading_covariance: FloatArray
    ard_shape: FloatArray | None
    ard_rate: FloatArray | None
    alpha_mean: FloatArray
    noise_shape: FloatArray
    noise_rate: FloatArray


class _VBFAEstimator(EstimatorPersistMixin, EstimatorBase):
    """What both VB-FA estimators share: hyper-parameter checks at fit time, the fitted-Gaussian queries
    (plug-in posterior means F̄, c̄, ψ = 1/⟨τ⟩), and scikit-learn's protocols."""

    #: Whether NaN in the input means "missing" (batch VB-FA) or is rejected (online VB-FA).
    _allows_missing: ClassVar[bool] = False
    n_components: int | None
    prior: PriorName
    transformations: bool
    transformations_start: int
    translation: TranslationName
    init_noise_ratio: float
    random_state: int | np.random.RandomState | np.random.Generator | None
    _core: Any

    def _check_common_params(self) -> dict[str, Any]:
        """The core's keyword arguments shared by both engines, validated (ValueError/TypeError)."""
        return {
            "prior": _check_choice(self.prior, "prior", ("ard", "broad")),
            "transform": check_bool(self.transformations, "transformations"),
            "transform_start": check_int(self.transformations_start, "transformations_start", 1),
            "translation": _check_choice(self.translation, "translation", ("mean", "exact")),
            "init_noise_ratio": check_positive_float(self.init_noise_ratio, "init_noise_ratio"),
            "seed": seed_from(self.random_state),
        }

    def _resolved_n_components(self, n_features: int) -> int:
        """K for D = ``n_features``: None is min(10, D); a K above D is fitted with D (the ARD prior prunes
        unneeded factors anyway, and D factors already express every covariance)."""
        if self.n_components is None:
            return min(DEFAULT_N_COMPONENTS, n_features)
        return min(check_int(self.n_components, "n_components", 1), n_features)

    def _data(self, X: ArrayLike, n_features: int | None = None) -> FloatArray:
        return _as_data(X, type(self).__name__, n_features, allow_missing=self._allows_missing)

    def __sklearn_tags__(self) -> Any:
        """scikit-learn tags: a transformer; batch VB-FA reads NaN as missing values."""
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.input_tags.allow_nan = self._allows_missing
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        """Whether :meth:`fit` (or a first ``partial_fit``) has succeeded (scikit-learn protocol)."""
        return self.__dict__.get("_core") is not None

    def _check_is_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with appropriate "
                "arguments before using this estimator."
            )

    # -- pickling and checkpoints (EstimatorPersistMixin) ----------------------------------------------
    _transient_attributes = _DERIVED_ATTRIBUTES

    def _check_restored(self, engine_state: dict[str, Any], state: dict[str, Any]) -> None:
        """ValueError unless the stored hyper-parameters are valid and describe the stored engine."""
        options = self._check_common_params()
        n_features = int(engine_state["n_features"])
        expected = {
            "n_components": self._resolved_n_components(n_features),
            "prior": options["prior"],
            "transform": options["transform"],
            "transform_start": options["transform_start"],
            "translation": options["translation"],
            "init_noise_ratio": options["init_noise_ratio"],
            **self._engine_settings(),
        }
        differing = sorted(key for key, value in expected.items() if engine_state.get(key) != value)
        if differing:
            raise ValueError(f"the stored hyper-parameters do not match the stored model ({', '.join(differing)})")

    def _engine_settings(self) -> dict[str, Any]:
        """Settings of the engine beyond the common ones, as its state map stores them."""
        return {}

    def score_samples(self, X: ArrayLike) -> FloatArray:
        """Log density of each row under N(c̄, F̄ F̄ᵀ + diag ψ) (posterior means plugged in).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN entries are missing and marginalised out (a row with nothing observed scores 0).

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        mean, loadings, noise_variance = self._plugin_gaussian()
        x = _as_data(X, type(self).__name__, mean.shape[0], allow_missing=True)
        return _core.vbfa_log_likelihood(x, mean, loadings, noise_variance)

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Mean of :meth:`score_samples` over the rows of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored
            Present for scikit-learn API compatibility.

        Returns
        -------
        float
        """
        return float(np.mean(self.score_samples(X)))

    def get_covariance(self) -> FloatArray:
        """Dense model covariance F̄ F̄ᵀ + diag ψ with ψ_d = 1/⟨τ_d⟩.

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If n_features exceeds 5000 (the matrix would be too large).
        """
        _, f, noise_variance = self._plugin_gaussian()
        return dense_covariance(f, noise_variance, "get_covariance()")

    def _plugin_gaussian(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """c̄ (D,), F̄ (D×K, C-contiguous) and ψ (D,) of the fitted model (NotFittedError before a fit)."""
        raise NotImplementedError


class VBFA(_VBFAEstimator):
    """Batch variational Bayesian factor analysis with the Luttinen–Ilin transformations.

    Model: x_nd = f_dᵀ h_n + c_d + noise with precision τ_d, h_n ~ N(0, I), c_d ~ N(0, 1/β),
    f_dk ~ N(0, 1/α_k); α_k ~ Gamma(a_α, b_α) ("ard") or α_k = α fixed ("broad");
    τ_d ~ Gamma(a_τ, b_τ); all hyper-parameters 1e-5. q = Π q(h_n) q(c_d) q(f_d) q(τ_d) q(α_k).

    Parameters
    ----------
    n_components : int or None, default=None
        K, the number of latent factors (the ARD prior prunes unneeded ones). None is min(10, D); a
        value above D is fitted with K = D.
    prior : {"ard", "broad"}, default="ard"
        Hierarchical ARD prior on the loading columns, or a fixed broad prior (α = 1e-5).
    transformations : bool, default=True
        Apply the translation and the rotation after each sweep from ``transformations_start`` on.
    transformations_start : int, default=5
        First sweep (counted from 1) after which the transformations run; 1 = immediately. The paper
        warns that starting very early can speed up the pruning of components.
    translation : {"mean", "exact"}, default="mean"
        "mean" is the paper's b = mean of the latent means (can lower the bound slightly when values are
        missing); "exact" maximises the bound (its eq. (18) with per-dimension precisions).
    max_iter : int, default=1000
        Maximum number of sweeps.
    tol : float, default=1e-6
        Stop when the relative change of the bound between sweeps is at most ``tol``.
    init_noise_ratio : float, default=1e-2
        Initial noise variance as a fraction of each column's variance (the paper initialises τ large).
    random_state : int, RandomState, Generator or None, default=None
        Seed of the random initial loadings. None draws fresh entropy.

    Attributes
    ----------
    mean_ : ndarray of shape (D,)
        c̄, the posterior mean of the bias.
    components_ : ndarray of shape (K, D)
        F̄ᵀ, posterior-mean loadings (rows are components, ordered by decreasing ⟨‖F_k‖²⟩ after a rotation).
    noise_variance_ : ndarray of shape (D,)
        ψ_d = 1/⟨τ_d⟩.
    alpha_ : ndarray of shape (K,)
        ⟨α_k⟩, the ARD precisions (large = pruned component).
    n_iter_ : int
        Sweeps run by the last :meth:`fit`.
    elbo_ : ndarray of shape (``n_iter_``,)
        The lower bound after each sweep.
    fit_time_ : ndarray of shape (``n_iter_``,)
        Seconds since the start of :meth:`fit` after each sweep.
    converged_ : bool
        Whether the last :meth:`fit` met ``tol``.
    n_features_in_ : int
        D.

    Notes
    -----
    Hyper-parameters are validated by :meth:`fit` (scikit-learn's convention: the constructor only stores
    them). A failed :meth:`fit` — invalid input or a numerical breakdown — leaves the previous fit as it
    was.
    """

    _allows_missing: ClassVar[bool] = True
    mean_: FloatArray
    components_: FloatArray
    noise_variance_: FloatArray
    alpha_: FloatArray
    n_iter_: int
    elbo_: FloatArray
    fit_time_: FloatArray
    converged_: bool
    n_features_in_: int

    def __init__(
        self,
        n_components: int | None = None,
        *,
        prior: PriorName = "ard",
        transformations: bool = True,
        transformations_start: int = 5,
        translation: TranslationName = "mean",
        max_iter: int = 1000,
        tol: float = 1e-6,
        init_noise_ratio: float = 1e-2,
        random_state: int | np.random.RandomState | np.random.Generator | None = None,
    ) -> None:
        self.n_components = n_components
        self.prior = prior
        self.transformations = transformations
        self.transformations_start = transformations_start
        self.translation = translation
        self.max_iter = max_iter
        self.tol = tol
        self.init_noise_ratio = init_noise_ratio
        self.random_state = random_state

    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Fit q to ``X`` by coordinate ascent until the bound converges or ``max_iter`` sweeps.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Data; NaN marks a missing value (every column needs one observed value).
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, no rows, an infinite value, a column with no observed value, or an invalid
            hyper-parameter. The previous fit is then kept unchanged.
        onlinefa.NumericalBreakdownError
            The coordinate ascent broke down numerically; the previous fit is kept unchanged.
        """
        max_iter = check_int(self.max_iter, "max_iter", 1)
        tol = _check_tol(self.tol)
        engine = self._new_engine(X)
        engine.fit(max_iter, tol)
        self._adopt(engine)
        return self

    def initialize(self, X: ArrayLike) -> Self:
        """Set q up for ``X`` without any sweep (for step-by-step use with :meth:`apply`).

        Initial q: c̄ = observed column means, ⟨τ_d⟩ = 1/(init_noise_ratio · column variance), random
        f̄_d (seeded), q(h_n) = the prior N(0, I), q(α) optimal for the initial q(F).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Data; NaN marks a missing value.

        Returns
        -------
        self
        """
        self._adopt(self._new_engine(X))
        return self

    def apply(self, step: StepName) -> Self:
        """Apply one coordinate update or transformation to the current q.

        Parameters
        ----------
        step : {"latents", "bias", "loadings", "noise", "ard", "translate", "rotate"}
            q(h_n) ∀n, q(c_d) ∀d, q(f_d) ∀d, q(τ_d) ∀d, q(α_k) ∀k, the translation, or the rotation
            (followed by the re-optimised q(α), as in the paper).

        Returns
        -------
        self
        """
        _check_choice(step, "step", _STEPS)
        engine = self._fitted_engine()
        engine.apply(step)
        self._adopt(engine)
        return self

    def lower_bound(self) -> float:
        """The full variational lower bound L of the current q (nats).

        Returns
        -------
        float
        """
        return self._fitted_engine().elbo()

    def bound_terms(self) -> dict[str, float]:
        """L split by factor: likelihood, latents, bias, loadings, ard, noise (they sum to L).

        Returns
        -------
        dict of str to float
        """
        return self._fitted_engine().bound_terms()

    def posterior(self) -> VBFAPosterior:
        """Copy of every factor of q.

        Returns
        -------
        VBFAPosterior
        """
        engine = self._fitted_engine()
        ard = engine.ard()
        noise_shape, noise_rate = engine.noise()
        return VBFAPosterior(
            latent_mean=engine.latent_mean(),
            latent_covariance=engine.latent_cov(),
            bias_mean=engine.bias_mean(),
            bias_variance=engine.bias_var(),
            loading_mean=engine.loading_mean(),
            loading_covariance=engine.loading_cov(),
            ard_shape=None if ard is None else ard[0],
            ard_rate=None if ard is None else ard[1],
            alpha_mean=engine.alpha_mean(),
            noise_shape=noise_shape,
            noise_rate=noise_rate,
        )

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means E_q[h] of the latent factors of new rows, given the fitted global factors.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing value.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        engine = self._fitted_engine()
        return engine.latent_means(self._data(X, self.n_features_in_))

    def _plugin_gaussian(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        self._check_is_fitted()
        return self.mean_, np.ascontiguousarray(self.components_.T), self.noise_variance_

    def _new_engine(self, X: ArrayLike) -> _core.VBFACore:
        """A fresh engine for ``X`` (validates the hyper-parameters and the data; nothing is installed)."""
        options = self._check_common_params()
        x = self._data(X)
        return _core.VBFACore(x, self._resolved_n_components(x.shape[1]), **options)

    _core_class = _core.VBFACore

    def _fitted_engine(self) -> _core.VBFACore:
        """The engine, or NotFittedError before :meth:`fit`/:meth:`initialize`."""
        self._check_is_fitted()
        engine: _core.VBFACore = self._core
        return engine

    def _adopt(self, engine: Any) -> None:
        """Make ``engine`` (a ``VBFACore``) the fitted model and copy the fitted attributes from it."""
        elbo, seconds = engine.history()
        mean = engine.bias_mean()
        fitted = {
            "mean_": mean,
            "components_": np.ascontiguousarray(engine.loading_mean().T),
            "noise_variance_": engine.noise_variance(),
            "alpha_": engine.alpha_mean(),
            "n_iter_": int(elbo.shape[0]),
            "elbo_": elbo,
            "fit_time_": seconds,
            "converged_": engine.converged,
        }
        self.__dict__.update(fitted, n_features_in_=int(mean.shape[0]), _core=engine)


class OnlineVBFA(_VBFAEstimator):
    """Online variational Bayesian factor analysis (stochastic VB on mini-batches of complete rows).

    For each mini-batch: the local q(h_n) with the current global factors; running averages of the
    expected sufficient statistics (x̄, mean x², mean h̄, mean x h̄ᵀ, mean ⟨h hᵀ⟩) with step ρ_t; the
    global q(c), q(F), q(τ), q(α) rebuilt from the averages scaled by the effective sample size; then
    the translation and rotation applied to q(F), q(c) and the averages alike. Memory O(D·K + K²).

    Parameters
    ----------
    n_components : int or None, default=None
        K. None is min(10, D); a value above D is fitted with K = D.
    prior : {"ard", "broad"}, default="ard"
    transformations : bool, default=True
        Apply the translation and rotation after each mini-batch from ``transformations_start`` on
        (without them online VB-FA converges poorly).
    transformations_start : int, default=1
        First mini-batch (counted from 1) after which the transformations run.
    translation : {"mean", "exact"}, default="mean"
    schedule : {"harmonic", "power", "constant"}, default="harmonic"
        ρ_t for the t-th mini-batch: "harmonic" = B_t / (samples seen), the exact running mean;
        "power" = max((t + tau0)^(−kappa), 1/t); "constant" = max(rho, 1/t).
    tau0 : float, default=0.0
        τ₀ >= 0 of the "power" schedule.
    kappa : float, default=0.9
        κ in (0.5, 1] of the "power" schedule (the same default as the other streaming models).
    rho : float, default=0.01
        ρ in (0, 1] of the "constant" schedule.
    n_effective : float or None, default=None
        N_eff, the sample size the averages stand for when rebuilding the global factors; None = the
        number of samples seen. Pass the data-set size when cycling over a finite data set several times.
    batch_size : int, default=50
        Mini-batch size used by :meth:`fit`.
    init_noise_ratio : float, default=1e-2
        Initial noise variance as a fraction of each column's variance in the first mini-batch.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the random initial loadings. None draws fresh entropy.

    Attributes
    ----------
    mean_ : ndarray of shape (D,)
    components_ : ndarray of shape (K, D)
    noise_variance_ : ndarray of shape (D,)
        ψ_d = 1/⟨τ_d⟩.
    alpha_ : ndarray of shape (K,)
    n_samples_seen_ : int
    n_batches_seen_ : int
    n_features_in_ : int

    Notes
    -----
    Hyper-parameters are validated by :meth:`fit` and by the first :meth:`partial_fit`. Every batch is
    applied atomically: invalid input or a numerical breakdown raises and leaves the model exactly as it
    was, and a failed :meth:`fit` keeps the previous fit. Concurrent :meth:`partial_fit` calls are
    serialised (the first batch of each thread is applied, in some order).
    """

    def __init__(
        self,
        n_components: int | None = None,
        *,
        prior: PriorName = "ard",
        transformations: bool = True,
        transformations_start: int = 1,
        translation: TranslationName = "mean",
        schedule: ScheduleName = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        n_effective: float | None = None,
        batch_size: int = 50,
        init_noise_ratio: float = 1e-2,
        random_state: int | np.random.RandomState | np.random.Generator | None = None,
    ) -> None:
        self.n_components = n_components
        self.prior = prior
        self.transformations = transformations
        self.transformations_start = transformations_start
        self.translation = translation
        self.schedule = schedule
        self.tau0 = tau0
        self.kappa = kappa
        self.rho = rho
        self.n_effective = n_effective
        self.batch_size = batch_size
        self.init_noise_ratio = init_noise_ratio
        self.random_state = random_state

    def partial_fit(self, X: ArrayLike, y: object = None) -> Self:
        """Process one mini-batch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Complete rows (no NaN). The first call fixes D, validates the hyper-parameters and
            initialises the global factors from this batch, so it should hold several rows.
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, no rows, a NaN/infinite value or an invalid hyper-parameter; the model is left
            exactly as it was.
        onlinefa.NumericalBreakdownError
            The update broke down numerically; the model is left exactly as it was.
        """
        engine: _core.OnlineVBFACore | None = self.__dict__.get("_core")
        if engine is None:
            x = self._data(X)
            fresh = self._new_engine(x.shape[1])
            fresh.partial_fit(x)
            with _FIRST_ENGINE_LOCK:
                engine = self.__dict__.get("_core")
                if engine is None:
                    self._core = fresh
                    return self
        # Another thread installed its engine first (or this is a later batch): apply to that one.
        engine.partial_fit(self._data(X, engine.n_features))
        return self

    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Forget everything and make one pass over ``X`` in mini-batches of ``batch_size`` rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Complete rows.
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError, onlinefa.NumericalBreakdownError
            As :meth:`partial_fit`, for any batch; every row is validated before any is applied, and the
            previous fit is kept unchanged on any error.
        """
        x = self._data(X)
        batch_size = check_int(self.batch_size, "batch_size", 1)
        fresh = self._new_engine(x.shape[1])
        for start in range(0, x.shape[0], batch_size):
            fresh.partial_fit(x[start : start + batch_size])
        self._core = fresh
        return self

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means E_q[h] of complete rows given the current global factors.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        engine = self._fitted_engine()
        return engine.latent_means(self._data(X, engine.n_features))

    def latent_moments(self) -> tuple[FloatArray, FloatArray]:
        """Running averages of ⟨h hᵀ⟩ and of h̄ over the samples seen, in the current latent basis.

        After a transformation they are whitened: the first is (close to) I and the second 0.

        Returns
        -------
        second_moment : ndarray of shape (K, K)
        mean : ndarray of shape (K,)
        """
        return self._fitted_engine().latent_moments()

    def loading_gram(self) -> FloatArray:
        """⟨FᵀF⟩ = Σ_d ⟨f_d f_dᵀ⟩ of the current q(F) (diagonal after a rotation).

        Returns
        -------
        ndarray of shape (K, K)
        """
        return self._fitted_engine().loading_gram()

    # -- fitted attributes (read from the engine, so they always describe one state) -----------------
    @property
    def mean_(self) -> FloatArray:
        """c̄, shape (n_features,)."""
        return self._fitted_engine().bias_mean()

    @property
    def components_(self) -> FloatArray:
        """F̄ᵀ, shape (n_components, n_features)."""
        return np.ascontiguousarray(self._fitted_engine().loading_mean().T)

    @property
    def noise_variance_(self) -> FloatArray:
        """ψ_d = 1/⟨τ_d⟩, shape (n_features,)."""
        return self._fitted_engine().noise_variance()

    @property
    def alpha_(self) -> FloatArray:
        """⟨α_k⟩, shape (n_components,)."""
        return self._fitted_engine().alpha_mean()

    @property
    def n_samples_seen_(self) -> int:
        """Samples seen since the last :meth:`fit`."""
        return self._fitted_engine().n_seen

    @property
    def n_batches_seen_(self) -> int:
        """Mini-batches seen since the last :meth:`fit`."""
        return self._fitted_engine().n_batches

    @property
    def n_features_in_(self) -> int:
        """D, fixed by the first :meth:`partial_fit` (or :meth:`fit`)."""
        return self._fitted_engine().n_features

    def _plugin_gaussian(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        engine = self._fitted_engine()
        return engine.bias_mean(), engine.loading_mean(), engine.noise_variance()

    def _new_engine(self, n_features: int) -> _core.OnlineVBFACore:
        """A fresh engine for D = ``n_features`` (validates the hyper-parameters)."""
        options = self._check_common_params()
        schedule = _check_choice(self.schedule, "schedule", ("harmonic", "power", "constant"))
        n_effective = None if self.n_effective is None else check_positive_float(self.n_effective, "n_effective")
        return _core.OnlineVBFACore(
            n_features,
            self._resolved_n_components(n_features),
            **options,
            schedule=schedule,
            tau0=_check_real(self.tau0, "tau0"),
            kappa=_check_real(self.kappa, "kappa"),
            rho=_check_real(self.rho, "rho"),
            n_effective=n_effective,
        )

    _core_class = _core.OnlineVBFACore

    def _adopt(self, engine: Any) -> None:
        """Make ``engine`` (an ``OnlineVBFACore``) the fitted model (every fitted attribute is read from it)."""
        self._core = engine

    def _engine_settings(self) -> dict[str, Any]:
        schedule = _check_choice(self.schedule, "schedule", ("harmonic", "power", "constant"))
        settings: dict[str, Any] = {"schedule": schedule}
        if schedule == "power":
            settings.update(tau0=_check_real(self.tau0, "tau0"), kappa=_check_real(self.kappa, "kappa"))
        elif schedule == "constant":
            settings["rho"] = _check_real(self.rho, "rho")
        n_effective = self.n_effective
        settings["n_effective"] = None if n_effective is None else check_positive_float(n_effective, "n_effective")
        return settings

    def _fitted_engine(self) -> _core.OnlineVBFACore:
        """The engine, or NotFittedError before the first successful :meth:`partial_fit`/:meth:`fit`."""
        self._check_is_fitted()
        engine: _core.OnlineVBFACore = self._core
        return engine
