"""Variational Bayesian factor analysis (VB-FA) with the Luttinen–Ilin transformations.

:class:`VBFA` fits a data matrix (NaN = missing) by mean-field coordinate ascent, with the full lower
bound after every sweep and, from a chosen sweep on, the *translation* and *rotation* of the latent
space that speed convergence up (Luttinen & Ilin, "Transformations for variational factor analysis to
speed up learning", §2). :class:`OnlineVBFA` is online VB on the same model: local q(h_n) per
mini-batch, running averages of the expected sufficient statistics, global factors rebuilt from them,
in O(D·K + K²) memory. The arithmetic runs in the Rust core; ``docs/vbfa.md`` has the model and the
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

from . import _core
from ._params import ParamsMixin
from ._validation import check_int, check_positive_float, check_seed, core_readable

__all__ = ["VBFA", "OnlineVBFA", "VBFAPosterior"]

FloatArray = NDArray[np.float64]
PriorName = Literal["ard", "broad"]
TranslationName = Literal["mean", "exact"]
StepName = Literal["latents", "bias", "loadings", "noise", "ard", "translate", "rotate"]
ScheduleName = Literal["harmonic", "power", "constant"]

_STEPS = ("latents", "bias", "loadings", "noise", "ard", "translate", "rotate")


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices`` (ValueError otherwise)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def _check_bool(value: object, name: str) -> bool:
    """Return ``value`` if it is a bool (TypeError otherwise)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return bool(value)


def _check_tol(value: object) -> float:
    """Return ``value`` as a finite float >= 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"tol must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (np.isfinite(out) and out >= 0.0):
        raise ValueError(f"tol must be finite and >= 0, got {value}")
    return out


def _as_data(X: ArrayLike, n_features: int | None = None) -> FloatArray:
    """Return ``X`` as a C-contiguous float64 (n, D) array; NaN stays (missing), ±Inf is left to the core.

    Raises
    ------
    TypeError
        Non-numeric or complex input.
    ValueError
        Not 2-D (a 1-D input of length D is accepted as one row once D is known), or the wrong D.
    """
    arr = np.asarray(X)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"expected a real numeric array (NaN marks missing values), got dtype {arr.dtype}")
    if arr.ndim == 1 and n_features is not None:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ValueError(f"expected a 2-D array of shape (n_samples, n_features), got shape {arr.shape}")
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"expected samples of shape (n_samples, {n_features}), got shape {arr.shape}")
    return core_readable(np.ascontiguousarray(arr, dtype=np.float64))  # aligned too: np.frombuffer may not be


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


class _FittedGaussian(ParamsMixin):
    """Prediction helpers shared by both estimators (plug-in posterior means F̄, c̄, ψ = 1/⟨τ⟩), and
    scikit-learn's ``get_params``/``set_params`` so that ``sklearn.base.clone`` works."""

    #: ``transform`` is also the method, so the parameter is stored as ``transform_enabled``.
    _param_attributes: ClassVar[dict[str, str]] = {"transform": "transform_enabled"}
    mean_: FloatArray
    components_: FloatArray
    noise_variance_: FloatArray
    n_features_in_: int

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters, validated as by the constructor; they take effect at the next ``fit``.

        Parameters
        ----------
        **params
            Parameter name → new value.

        Returns
        -------
        self

        Raises
        ------
        ValueError, TypeError
            An unknown name or an invalid value; nothing is changed then.
        """
        self._check_param_names(params)
        checked = type(self)(**{**self.get_params(), **params})  # validates everything before any change
        return super().set_params(**checked.get_params())

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            f"{type(self).__name__} cannot be pickled: its variational posterior lives in the Rust core, which "
            "has no serialised form yet. Keep components_, mean_, noise_variance_ (and alpha_), or refit."
        )

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
        x = _as_data(X, self.n_features_in_)
        return _core.vbfa_log_likelihood(x, self.mean_, np.ascontiguousarray(self.components_.T), self.noise_variance_)

    def score(self, X: ArrayLike) -> float:
        """Mean of :meth:`score_samples` over the rows of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

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
        """
        f = self.components_.T
        return f @ f.T + np.diag(self.noise_variance_)


class VBFA(_FittedGaussian):
    """Batch variational Bayesian factor analysis with the Luttinen–Ilin transformations.

    Model: x_nd = f_dᵀ h_n + c_d + noise with precision τ_d, h_n ~ N(0, I), c_d ~ N(0, 1/β),
    f_dk ~ N(0, 1/α_k); α_k ~ Gamma(a_α, b_α) ("ard") or α_k = α fixed ("broad");
    τ_d ~ Gamma(a_τ, b_τ); all hyper-parameters 1e-5. q = Π q(h_n) q(c_d) q(f_d) q(τ_d) q(α_k).

    Parameters
    ----------
    n_components : int
        K, the number of latent factors (the ARD prior prunes unneeded ones).
    prior : {"ard", "broad"}, default "ard"
        Hierarchical ARD prior on the loading columns, or a fixed broad prior (α = 1e-5).
    transform : bool, default True
        Apply the translation and the rotation after each sweep from ``transform_start`` on.
    transform_start : int, default 5
        First sweep (counted from 1) after which the transformations run; 1 = immediately. The paper
        warns that starting very early can speed up the pruning of components.
    translation : {"mean", "exact"}, default "mean"
        "mean" is the paper's b = mean of the latent means (can lower the bound slightly when values are
        missing); "exact" maximises the bound (its eq. (18) with per-dimension precisions).
    max_iter : int, default 1000
        Maximum number of sweeps.
    tol : float, default 1e-6
        Stop when the relative change of the bound between sweeps is at most ``tol``.
    init_noise_ratio : float, default 1e-2
        Initial noise variance as a fraction of each column's variance (the paper initialises τ large).
    seed : int or None
        Seed of the random initial loadings.

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
    elbo_ : ndarray of shape (n_iter_,)
        The lower bound after each sweep.
    fit_time_ : ndarray of shape (n_iter_,)
        Seconds since the start of :meth:`fit` after each sweep.
    converged_ : bool
        Whether the last :meth:`fit` met ``tol``.
    n_features_in_ : int
        D.
    """

    def __init__(
        self,
        n_components: int,
        *,
        prior: PriorName = "ard",
        transform: bool = True,
        transform_start: int = 5,
        translation: TranslationName = "mean",
        max_iter: int = 1000,
        tol: float = 1e-6,
        init_noise_ratio: float = 1e-2,
        seed: int | None = None,
    ) -> None:
        self.n_components = check_int(n_components, "n_components", 1)
        self.prior = _check_choice(prior, "prior", ("ard", "broad"))
        self.transform_enabled = _check_bool(transform, "transform")
        self.transform_start = check_int(transform_start, "transform_start", 1)
        self.translation = _check_choice(translation, "translation", ("mean", "exact"))
        self.max_iter = check_int(max_iter, "max_iter", 1)
        self.tol = _check_tol(tol)
        self.init_noise_ratio = check_positive_float(init_noise_ratio, "init_noise_ratio")
        self.seed = check_seed(seed)
        self._engine: _core.VBFACore | None = None

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
            Wrong shape, an infinite value, a column with no observed value, or a numerical breakdown.
        """
        engine = self._start(X)
        engine.fit(self.max_iter, self.tol)
        self._refresh()
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
        self._start(X)
        self._refresh()
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
        self._fitted_engine().apply(step)
        self._refresh()
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
        return self._fitted_engine().latent_means(_as_data(X, self.n_features_in_))

    def _start(self, X: ArrayLike) -> _core.VBFACore:
        """Create a fresh engine for ``X``."""
        self._engine = _core.VBFACore(
            _as_data(X),
            self.n_components,
            prior=self.prior,
            transform=self.transform_enabled,
            transform_start=self.transform_start,
            translation=self.translation,
            init_noise_ratio=self.init_noise_ratio,
            seed=self.seed,
        )
        return self._engine

    def _fitted_engine(self) -> _core.VBFACore:
        """The engine, or ValueError before :meth:`fit`/:meth:`initialize`."""
        if self._engine is None:
            raise ValueError("this VBFA instance is not fitted yet: call fit(X) or initialize(X) first")
        return self._engine

    def _refresh(self) -> None:
        """Copy the fitted attributes from the engine."""
        engine = self._fitted_engine()
        elbo, seconds = engine.history()
        self.mean_ = engine.bias_mean()
        self.components_ = np.ascontiguousarray(engine.loading_mean().T)
        self.noise_variance_ = engine.noise_variance()
        self.alpha_ = engine.alpha_mean()
        self.n_iter_ = int(elbo.shape[0])
        self.elbo_ = elbo
        self.fit_time_ = seconds
        self.converged_ = engine.converged
        self.n_features_in_ = int(self.mean_.shape[0])


class OnlineVBFA(_FittedGaussian):
    """Online variational Bayesian factor analysis (stochastic VB on mini-batches of complete rows).

    For each mini-batch: the local q(h_n) with the current global factors; running averages of the
    expected sufficient statistics (x̄, mean x², mean h̄, mean x h̄ᵀ, mean ⟨h hᵀ⟩) with step ρ_t; the
    global q(c), q(F), q(τ), q(α) rebuilt from the averages scaled by the effective sample size; then
    the translation and rotation applied to q(F), q(c) and the averages alike. Memory O(D·K + K²).

    Parameters
    ----------
    n_components : int
        K.
    prior : {"ard", "broad"}, default "ard"
    transform : bool, default True
        Apply the translation and rotation after each mini-batch from ``transform_start`` on (without
        them online VB-FA converges poorly).
    transform_start : int, default 1
        First mini-batch (counted from 1) after which the transformations run.
    translation : {"mean", "exact"}, default "mean"
    schedule : {"harmonic", "power", "constant"}, default "harmonic"
        ρ_t for the t-th mini-batch: "harmonic" = B_t / (samples seen), the exact running mean;
        "power" = max((t + tau0)^(−kappa), 1/t); "constant" = max(rho, 1/t).
    tau0, kappa, rho : float
        Parameters of the "power" and "constant" schedules.
    n_effective : float or None
        N_eff, the sample size the averages stand for when rebuilding the global factors; None = the
        number of samples seen. Pass the data-set size when cycling over a finite data set several times.
    batch_size : int, default 50
        Mini-batch size used by :meth:`fit`.
    init_noise_ratio : float, default 1e-2
        Initial noise variance as a fraction of each column's variance in the first mini-batch.
    seed : int or None
        Seed of the random initial loadings.

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
    """

    def __init__(
        self,
        n_components: int,
        *,
        prior: PriorName = "ard",
        transform: bool = True,
        transform_start: int = 1,
        translation: TranslationName = "mean",
        schedule: ScheduleName = "harmonic",
        tau0: float = 1.0,
        kappa: float = 0.7,
        rho: float = 0.01,
        n_effective: float | None = None,
        batch_size: int = 50,
        init_noise_ratio: float = 1e-2,
        seed: int | None = None,
    ) -> None:
        self.n_components = check_int(n_components, "n_components", 1)
        self.prior = _check_choice(prior, "prior", ("ard", "broad"))
        self.transform_enabled = _check_bool(transform, "transform")
        self.transform_start = check_int(transform_start, "transform_start", 1)
        self.translation = _check_choice(translation, "translation", ("mean", "exact"))
        self.schedule = _check_choice(schedule, "schedule", ("harmonic", "power", "constant"))
        self.tau0, self.kappa, self.rho = float(tau0), float(kappa), float(rho)
        self.n_effective = None if n_effective is None else check_positive_float(n_effective, "n_effective")
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self.init_noise_ratio = check_positive_float(init_noise_ratio, "init_noise_ratio")
        self.seed = check_seed(seed)
        self._engine: _core.OnlineVBFACore | None = None
        self._new_engine(1)  # validates the schedule parameters now; replaced on the first batch

    def partial_fit(self, X: ArrayLike, y: object = None) -> Self:
        """Process one mini-batch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Complete rows (no NaN). The first call fixes D and initialises the global factors from
            this batch, so it should hold several rows.
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, or a NaN/infinite value (nothing of the batch is applied).
        """
        x = _as_data(X, getattr(self, "n_features_in_", None))
        if not hasattr(self, "n_features_in_"):
            self._new_engine(x.shape[1])
        self._active_engine().partial_fit(x)
        self._refresh(x.shape[1])
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
        """
        x = _as_data(X)
        self._forget()
        for start in range(0, x.shape[0], self.batch_size):
            self.partial_fit(x[start : start + self.batch_size])
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
        self._check_fitted()
        return self._active_engine().latent_means(_as_data(X, self.n_features_in_))

    def latent_moments(self) -> tuple[FloatArray, FloatArray]:
        """Running averages of ⟨h hᵀ⟩ and of h̄ over the samples seen, in the current latent basis.

        After a transformation they are whitened: the first is (close to) I and the second 0.

        Returns
        -------
        second_moment : ndarray of shape (K, K)
        mean : ndarray of shape (K,)
        """
        self._check_fitted()
        return self._active_engine().latent_moments()

    def loading_gram(self) -> FloatArray:
        """⟨FᵀF⟩ = Σ_d ⟨f_d f_dᵀ⟩ of the current q(F) (diagonal after a rotation).

        Returns
        -------
        ndarray of shape (K, K)
        """
        self._check_fitted()
        return self._active_engine().loading_gram()

    def _new_engine(self, n_features: int) -> None:
        """A fresh engine for D = ``n_features``."""
        self._engine = _core.OnlineVBFACore(
            n_features,
            self.n_components,
            prior=self.prior,
            transform=self.transform_enabled,
            transform_start=self.transform_start,
            translation=self.translation,
            init_noise_ratio=self.init_noise_ratio,
            seed=self.seed,
            schedule=self.schedule,
            tau0=self.tau0,
            kappa=self.kappa,
            rho=self.rho,
            n_effective=self.n_effective,
        )

    def _forget(self) -> None:
        """Drop the fitted state."""
        for name in ("mean_", "components_", "noise_variance_", "alpha_", "n_samples_seen_",
                     "n_batches_seen_", "n_features_in_"):
            self.__dict__.pop(name, None)

    def _active_engine(self) -> _core.OnlineVBFACore:
        """The engine (always present after construction)."""
        assert self._engine is not None
        return self._engine

    def _check_fitted(self) -> None:
        """ValueError before the first :meth:`partial_fit`."""
        if not hasattr(self, "n_features_in_"):
            raise ValueError("this OnlineVBFA instance is not fitted yet: call partial_fit(X) or fit(X) first")

    def _refresh(self, n_features: int) -> None:
        """Copy the fitted attributes from the engine."""
        engine = self._active_engine()
        self.n_features_in_ = n_features
        self.n_samples_seen_ = engine.n_seen
        self.n_batches_seen_ = engine.n_batches
        if engine.n_seen == 0:
            return
        self.mean_ = engine.bias_mean()
        self.components_ = np.ascontiguousarray(engine.loading_mean().T)
        self.noise_variance_ = engine.noise_variance()
        self.alpha_ = engine.alpha_mean()
