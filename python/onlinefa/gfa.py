"""Group factor analysis (GFA) by variational Bayes: :class:`GFA`.

Several groups ("views") of features share K latent factors; a group × factor ARD prior learns which
factor is active in which group (the structure behind CCA, inter-battery factor analysis and MOFA).
The model, in the low-level notation of ``docs/design/gfa.md``:

    x_nd = f_dᵀ h_n + c_d + noise of precision τ_{g(d)},   h_n ~ N(0, I_K),   c_d ~ N(0, 1/β),
    f_dk ~ N(0, 1/α_{g(d),k}),   α_mk ~ Gamma(a_α, b_α),   τ_m ~ Gamma(a_τ, b_τ)   (all a, b, β = 1e-5)

with g(d) the group of feature d and one noise precision per group (``noise="group"``) or per feature
(``noise="feature"``, the diagonal Ψ of factor analysis). The fit is mean-field coordinate ascent on the
full variational lower bound, with the exact translation and a numerically maximised rotation of the
latent space after every sweep (Luttinen & Ilin's speed-up generalised to groups), dropping of inactive
factors, and NaN (or ``observed=False``) marking missing values. The arithmetic runs in the Rust core.

With scikit-learn installed the class is a real ``BaseEstimator`` + ``TransformerMixin``; scikit-learn is
imported when this module is first imported, never by ``import onlinefa`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core
from ._gaussian import dense_covariance
from ._persist import EstimatorPersistMixin, to_json
from ._sklearn_base import EstimatorBase, NotFittedError, as_real_matrix, seed_from
from .estimator import MAX_QUERY_MAGNITUDE
from ._validation import check_bool, check_choice, check_int, check_positive_float, core_readable

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GFA"]

FloatArray = NDArray[np.float64]
NoiseName = Literal["group", "feature"]
GroupsSpec = int | Sequence[Hashable] | NDArray[Any]


def _check_tol(value: object, name: str, upper: float = np.inf) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (np.isfinite(out) and 0.0 <= out < upper):
        raise ValueError(f"{name} must be finite, >= 0 and < {upper}, got {value}")
    return out


def resolve_groups(groups: object, n_features: int) -> tuple[NDArray[np.int64], list[Any]]:
    """Each feature's group index (0..M-1) and the M group labels, from a ``groups`` specification.

    Parameters
    ----------
    groups : int, or sequence
        An int M splits the features into M contiguous groups of near-equal size (``numpy.array_split``).
        A sequence of length ``n_features`` gives one label per feature (labels are sorted: group m is
        the m-th smallest label). Any other sequence of positive ints summing to ``n_features`` gives
        the sizes of contiguous groups, in order (labels 0..M-1).
    n_features : int
        D.

    Returns
    -------
    index : ndarray of shape (n_features,)
    labels : list

    Raises
    ------
    ValueError
        The groups do not cover the features exactly, or a group is empty.
    TypeError
        ``groups`` is neither an int nor a sequence.
    """
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, (bool, np.bool_)):
        m = int(groups)
        if not 1 <= m <= n_features:
            raise ValueError(f"groups={m} must be between 1 and n_features={n_features} (no empty group)")
        split = [len(part) for part in np.array_split(np.arange(n_features), m)]
        return np.repeat(np.arange(m), split).astype(np.int64), list(range(m))
    if isinstance(groups, (str, bytes)) or not isinstance(groups, (Sequence, np.ndarray)):
        raise TypeError(f"groups must be an int or a sequence, got {type(groups).__name__}")
    values = np.asarray(groups)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"groups must be a non-empty 1-D sequence, got shape {values.shape}")
    if values.size == n_features:
        labels, index = np.unique(values, return_inverse=True)
        return index.astype(np.int64), labels.tolist()
    if values.dtype.kind in "iu":
        sizes: NDArray[np.int64] = values.astype(np.int64)
        if (sizes < 0).any():
            raise ValueError(f"group sizes must be >= 0, got {sizes.tolist()}")
        if int(sizes.sum()) == n_features:
            empty = np.flatnonzero(sizes == 0)
            if empty.size:
                raise ValueError(f"group {int(empty[0])} is empty (size 0 in groups={sizes.tolist()})")
            return np.repeat(np.arange(sizes.size), sizes).astype(np.int64), list(range(sizes.size))
        raise ValueError(
            f"groups do not cover the {n_features} features: {sizes.size} group sizes summing to "
            f"{int(sizes.sum())} (give sizes summing to n_features, or one label per feature)"
        )
    raise ValueError(
        f"groups has {values.size} labels but X has {n_features} features (give one label per feature, "
        "or integer group sizes summing to n_features)"
    )


class GFA(EstimatorPersistMixin, EstimatorBase):
    """Group factor analysis by variational Bayes with group × factor ARD.

    Parameters
    ----------
    n_components : int, default=10
        K, the number of factors at the start; factors inactive in every group are dropped, so K may
        exceed the true number (it may not exceed min(n_samples, n_features)).
    groups : int or sequence, default=1
        The group of every feature: an int M (M contiguous groups of near-equal size), one label per
        feature, or a sequence of group sizes (contiguous groups, in order). A sequence of length
        n_features is always read as labels.
    noise : {"group", "feature"}, default="group"
        One isotropic noise precision per group, or one per feature (diagonal Ψ).
    ard_rank : int or None, default=None
        None: the full-rank ARD, a Gamma posterior per group and factor. An int R: the low-rank ARD
        log α = U Vᵀ + μ_u 1ᵀ + 1 μ_vᵀ (U: groups × R, V: factors × R, point estimates with a N(0, 1/λ)
        prior), which shares strength between groups when there are many of them.
    ard_lambda : float, default=0.1
        λ of the low-rank ARD.
    rotate : bool, default=True
        Apply the exact translation and the group rotation after every sweep (much faster convergence).
    drop_factors : bool, default=True
        The variance-explained rule (as MOFA+'s ``dropR2``): drop a factor when its share of every group's
        variance, (S_kk/N) Σ_{d∈m}⟨f_dk²⟩ / Σ_{d∈m} var(x_d), is below ``drop_tol``, before every sweep and
        once more after the last one (so no returned factor is below it).
    drop_tol : float, default=1e-3
        The fraction of the rule above (0 ≤ ``drop_tol`` < 1). MOFA+'s threshold is off by default and its
        documentation's example uses 0.01.
    bound_pruning : bool, default=True
        After the sweeps converge, test the weakest factor (smallest largest share over the groups): remove
        it, re-converge, and keep the removal when the lower bound rises — a comparison of the evidence
        bounds of the models with K and K − 1 factors. Repeat until a removal lowers the bound. This drops
        a factor that coordinate ascent left fitting noise at a local optimum of the bound (docs/design/gfa.md,
        §2). False reproduces the fit without this step; ``drop_factors=False`` turns off both rules.
    max_iter : int, default=1000
        Maximum number of sweeps.
    tol : float, default=1e-6
        Stop when the relative change of the lower bound between two sweeps (with the same K) is at most
        ``tol``.
    init_noise_ratio : float, default=1e-2
        Initial noise variance as a fraction of each feature's variance.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the random initial loadings.

    Attributes
    ----------
    components_ : ndarray of shape (``n_components_``, n_features)
        Posterior-mean loadings F̄ᵀ of the kept factors.
    n_components_ : int
        Number of factors kept.
    noise_variance_ : ndarray of shape (n_features,)
        1/⟨τ⟩ of each feature's group (or of the feature, for ``noise="feature"``).
    noise_precision_ : ndarray of shape (n_groups,) or (n_features,)
        ⟨τ_m⟩ per group (⟨τ_d⟩ per feature for ``noise="feature"``).
    mean_ : ndarray of shape (n_features,)
        Posterior mean of the bias c.
    alpha_ : ndarray of shape (n_groups, ``n_components_``)
        ⟨α_mk⟩, the ARD precisions (large = factor k switched off in group m); α for the low-rank ARD.
    activity_ : ndarray of shape (n_groups, ``n_components_``)
        Share of each group's total variance explained by each factor.
    elbo_ : ndarray of shape (``n_iter_``,)
        The lower bound after each sweep (monotone between factor drops).
    n_components_history_ : ndarray of shape (``n_iter_``,)
        K during each sweep.
    fit_time_ : ndarray of shape (``n_iter_``,)
        Seconds since the start of :meth:`fit` after each sweep.
    n_iter_ : int
        Sweeps of the kept fit (the sweeps of a rejected pruning trial are not counted).
    converged_ : bool
        Whether ``tol`` was met.
    group_labels_ : list
        The label of each group (index m of ``alpha_``, ``activity_``, ...).
    group_index_ : ndarray of shape (n_features,)
        The group index of every feature.
    kept_components_ : list of int
        Which of the initial factors were kept.
    n_features_in_ : int
        D.
    """

    def __init__(
        self,
        n_components: int = 10,
        groups: GroupsSpec = 1,
        *,
        noise: NoiseName = "group",
        ard_rank: int | None = None,
        ard_lambda: float = 0.1,
        rotate: bool = True,
        drop_factors: bool = True,
        drop_tol: float = 1e-3,
        bound_pruning: bool = True,
        max_iter: int = 1000,
        tol: float = 1e-6,
        init_noise_ratio: float = 1e-2,
        random_state: object = None,
    ) -> None:
        self.n_components = n_components
        self.groups = groups
        self.noise = noise
        self.ard_rank = ard_rank
        self.ard_lambda = ard_lambda
        self.rotate = rotate
        self.drop_factors = drop_factors
        self.drop_tol = drop_tol
        self.bound_pruning = bound_pruning
        self.max_iter = max_iter
        self.tol = tol
        self.init_noise_ratio = init_noise_ratio
        self.random_state = random_state

    _core_class: ClassVar[Any] = _core.GFACore
    _reads_json_params = True  # checkpoints of the first layout: the hyper-parameters as one JSON entry

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.input_tags.allow_nan = True
        return tags

    # -- fitting --------------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: object = None, *, observed: ArrayLike | None = None) -> Self:
        """Fit q to ``X`` by coordinate ascent until the bound converges or ``max_iter`` sweeps.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Data; NaN marks a missing value.
        y : ignored
        observed : array-like of bool, shape (n_samples, n_features), optional
            Mask of observed entries; False entries are treated as missing (like NaN).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, an infinite value, groups that do not cover the features or an empty group, a
            group or feature with no observed value, n_components > min(n_samples, n_features), or an
            invalid parameter. On error the previous fit is kept unchanged.
        TypeError
            Non-numeric input or a parameter of the wrong type.
        """
        x = self._data(X, observed)
        index, labels = resolve_groups(self.groups, x.shape[1])
        engine = _core.GFACore(
            x,
            index.tolist(),
            check_int(self.n_components, "n_components", 1),
            noise=self._noise_name(),
            rotate=check_bool(self.rotate, "rotate"),
            rotate_start=1,
            drop_factors=check_bool(self.drop_factors, "drop_factors"),
            drop_tol=_check_tol(self.drop_tol, "drop_tol", 1.0),
            init_noise_ratio=check_positive_float(self.init_noise_ratio, "init_noise_ratio"),
            seed=seed_from(self.random_state),
            ard_rank=None if self.ard_rank is None else check_int(self.ard_rank, "ard_rank", 1),
            ard_lambda=check_positive_float(self.ard_lambda, "ard_lambda"),
        )
        max_iter, tol = check_int(self.max_iter, "max_iter", 1), _check_tol(self.tol, "tol")
        drop_factors = check_bool(self.drop_factors, "drop_factors")
        pruning = check_bool(self.bound_pruning, "bound_pruning")
        engine.fit(max_iter, tol)
        engine = self._final_drop(engine, drop_factors, max_iter, tol)
        while drop_factors and pruning and engine.loading_mean().shape[1] > 1:
            trial = self._without_weakest(engine)
            trial.fit(max_iter, tol)
            trial = self._final_drop(trial, drop_factors, max_iter, tol)
            if not trial.elbo() > engine.elbo():
                break
            engine = trial
        self._core = engine
        self.group_index_ = index
        self.group_labels_ = labels
        self.n_features_in_ = x.shape[1]
        self._refresh(engine)
        return self

    @staticmethod
    def _final_drop(engine: _core.GFACore, drop_factors: bool, max_iter: int, tol: float) -> _core.GFACore:
        """Apply the variance-explained rule after the last sweep; re-converge if it dropped a factor."""
        while drop_factors and engine.loading_mean().shape[1] > 1:
            before = engine.loading_mean().shape[1]
            engine.apply("drop")
            if engine.loading_mean().shape[1] == before:
                break
            engine.fit(max_iter, tol)
        return engine

    @staticmethod
    def _without_weakest(engine: _core.GFACore) -> _core.GFACore:
        """A copy of ``engine`` without its weakest factor (smallest largest share of a group's variance)."""
        trial = _core.GFACore.from_state(engine.get_state())
        trial.drop_components([int(np.argmin(engine.activity().max(axis=0)))])
        return trial

    def fit_transform(self, X: ArrayLike, y: object = None, **fit_params: Any) -> FloatArray:
        """:meth:`fit` to ``X``, then return ``transform(X)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored
        **fit_params
            Passed to :meth:`fit` (``observed``).

        Returns
        -------
        ndarray of shape (n_samples, ``n_components_``)
        """
        return self.fit(X, **fit_params).transform(X)

    def _noise_name(self) -> str:
        return check_choice(self.noise, "noise", ("group", "feature"))

    @staticmethod
    def _data(X: ArrayLike, observed: ArrayLike | None) -> FloatArray:
        arr = as_real_matrix(X).astype(np.float64)  # a copy: NaN may be written below
        for axis, what in ((0, "sample"), (1, "feature")):
            if arr.shape[axis] < 1:
                raise ValueError(
                    f"Found array with 0 {what}(s) (shape={arr.shape}) while a minimum of 1 is required by GFA."
                )
        if np.isinf(arr).any():
            raise ValueError("Input X contains infinity (NaN marks a missing value)")
        if observed is not None:
            mask = np.asarray(observed)
            if mask.dtype != np.bool_ or mask.shape != arr.shape:
                raise ValueError(f"observed must be a boolean array of shape {arr.shape}, got {mask.dtype} {mask.shape}")
            arr[~mask] = np.nan
        return core_readable(np.ascontiguousarray(arr))

    def _adopt(self, engine: _core.GFACore) -> None:
        self._core = engine
        self._refresh(engine)

    def _fitted_entries(self) -> dict[str, Any]:
        return {"group_labels": to_json(self.__dict__["group_labels_"])}

    def _check_restored(self, engine_state: dict[str, Any], state: dict[str, Any]) -> None:
        """Check the stored group labels against the engine's groups; set the group attributes."""
        index = np.asarray(engine_state["groups"]).astype(np.int64)
        labels = json.loads(state["group_labels"])
        if not isinstance(labels, list) or len(labels) != int(index.max()) + 1:
            raise ValueError("the group labels do not match the groups of the model")
        self.__dict__.update(group_index_=index, group_labels_=labels, n_features_in_=int(index.size))

    def _refresh(self, engine: _core.GFACore) -> None:
        elbo, ks, seconds = engine.history()
        self.components_ = np.ascontiguousarray(engine.loading_mean().T)
        self.n_components_ = int(self.components_.shape[0])
        self.noise_variance_ = engine.noise_variance()
        shape, rate = engine.noise()
        self.noise_precision_ = shape / rate
        self.mean_ = engine.bias_mean()
        self.alpha_ = engine.alpha_mean()
        self.activity_ = engine.activity()
        self.elbo_ = elbo
        self.n_components_history_ = ks.astype(np.int64)
        self.fit_time_ = seconds
        self.n_iter_ = int(elbo.size)
        self.converged_ = engine.converged
        self.kept_components_ = engine.kept_components()

    # -- queries --------------------------------------------------------------------------------------
    def _fitted(self) -> _core.GFACore:
        engine: _core.GFACore | None = self.__dict__.get("_core")
        if engine is None:
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with appropriate "
                "arguments before using this estimator."
            )
        return engine

    def __sklearn_is_fitted__(self) -> bool:
        """Whether :meth:`fit` has succeeded (scikit-learn protocol)."""
        return self.__dict__.get("_core") is not None

    def _query(self, X: ArrayLike, n_features: int | None = None) -> FloatArray:
        self._fitted()
        arr = as_real_matrix(X).astype(np.float64)
        expected = self.n_features_in_ if n_features is None else n_features
        if arr.shape[1] != expected:
            raise ValueError(
                f"X has {arr.shape[1]} features, but {type(self).__name__} is expecting {expected} features as input."
            )
        if (np.abs(arr) > MAX_QUERY_MAGNITUDE).any():
            raise ValueError(f"Input X contains infinity or a value with |x| > {MAX_QUERY_MAGNITUDE:g}")
        return core_readable(np.ascontiguousarray(arr))

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means E_q[h] of the latent factors of new rows given their non-NaN entries.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, ``n_components_``)
        """
        return self._fitted().latent_means(self._query(X))

    def predict_group(
        self, X: ArrayLike, group: Hashable, *, return_var: bool = False
    ) -> FloatArray | tuple[FloatArray, FloatArray]:
        """Predict one group's features from the other groups.

        The latents are inferred from the observed entries of the other groups only (the target group's
        columns are ignored), then E[x_nd] = c̄_d + f̄_dᵀ h̄_n and the predictive variance
        Var[x_nd] = c̃_d + f̄_dᵀ Σ_h f̄_d + tr(Σ_{f_d} ⟨h hᵀ⟩) + 1/⟨τ⟩ of feature d.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_features - size of the group)
            Either full rows (the target group's columns are ignored) or only the other groups' features,
            in their original order. NaN marks a missing value.
        group : label
            One of ``group_labels_``.
        return_var : bool, default=False
            Also return the predictive variances.

        Returns
        -------
        mean : ndarray of shape (n_samples, size of the group)
        var : ndarray of shape (n_samples, size of the group)
            Only when ``return_var``.
        """
        engine = self._fitted()
        if group not in self.group_labels_:
            raise ValueError(f"group must be one of {self.group_labels_}, got {group!r}")
        target = self.group_index_ == self.group_labels_.index(group)
        arr = np.asarray(X)
        if arr.ndim == 2 and arr.shape[1] == self.n_features_in_ - int(target.sum()) and target.any():
            full = np.full((arr.shape[0], self.n_features_in_), np.nan)
            full[:, ~target] = self._query(arr, self.n_features_in_ - int(target.sum()))
        else:
            full = self._query(X).copy()
        full[:, target] = np.nan
        mean, var = engine.predict(core_readable(np.ascontiguousarray(full)))
        if return_var:
            return mean[:, target], var[:, target]
        return mean[:, target]

    def score_samples(self, X: ArrayLike) -> FloatArray:
        """Log density of each row under N(``mean_``, ``components_ᵀ components_ + diag noise_variance_``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN entries are marginalised out.

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        x = self._query(X)
        return _core.vbfa_log_likelihood(x, self.mean_, np.ascontiguousarray(self.components_.T), self.noise_variance_)

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Mean of :meth:`score_samples`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        float
        """
        return float(np.mean(self.score_samples(X)))

    def get_covariance(self) -> FloatArray:
        """Dense model covariance F̄ F̄ᵀ + diag(``noise_variance_``).

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If n_features exceeds 5000 (the matrix would be too large).
        """
        self._fitted()
        return dense_covariance(self.components_.T, self.noise_variance_, "get_covariance()")

    def lower_bound(self) -> float:
        """The full variational lower bound of the current q (nats).

        Returns
        -------
        float
        """
        return self._fitted().elbo()

    def bound_terms(self) -> dict[str, float]:
        """The lower bound split by factor (likelihood, latents, bias, loadings, ard, noise).

        Returns
        -------
        dict of str to float
        """
        return self._fitted().bound_terms()
