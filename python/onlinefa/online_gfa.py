"""Online group factor analysis: :class:`OnlineGFA`, stochastic variational inference over mini-batches.

The model is :class:`onlinefa.GFA`'s. For each mini-batch of complete rows: the local q(h_n) given the
current global factors; running averages of the expected sufficient statistics moved towards the
batch's by a Robbins–Monro step ρ_t; the global q(c), q(F), q(τ), q(α) rebuilt from the averages
scaled by the effective sample size; then the translation and the group rotation (``docs/design/gfa.md``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from ._forklock import ForkSafeLock, ModelLock
from . import _core
from ._validation import check_bool, check_int, check_positive_float, core_readable
from .gfa import GFA, FloatArray, GroupsSpec, NoiseName, resolve_groups
from ._sklearn_base import as_real_matrix, seed_from

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["OnlineGFA"]

ScheduleName = Literal["harmonic", "power", "constant"]
_FIRST_BATCH_LOCK = ForkSafeLock()  # guards the lazy creation of each model's lock


class OnlineGFA(GFA):
    """Group factor analysis by stochastic variational inference on a stream of mini-batches.

    Parameters
    ----------
    n_components : int, default=10
        K. Factors are not dropped while streaming; ``activity_`` shows which are inactive in every group.
    groups : int or sequence, default=1
        As for :class:`GFA`.
    noise : {"group", "feature"}, default="group"
    ard_rank : int or None, default=None
    ard_lambda : float, default=0.1
    rotate : bool, default=True
        Apply the translation and the group rotation after each mini-batch from ``rotate_start`` on.
    rotate_start : int, default=1
        First mini-batch (counted from 1) after which the transformations run.
    schedule : {"harmonic", "power", "constant"}, default="harmonic"
        ρ_t of the t-th mini-batch: "harmonic" = B_t / (samples seen), the exact running mean;
        "power" = max((t + tau0)^(−kappa), 1/t); "constant" = max(rho, 1/t) (a drifting stream).
    tau0 : float, default=0.0
    kappa : float, default=0.9
    rho : float, default=0.01
    n_effective : float or None, default=None
        N_eff, the sample size the averages stand for; None = the number of samples seen.
    batch_size : int, default=50
        Mini-batch size used by :meth:`fit`.
    init_noise_ratio : float, default=1e-2
        Initial noise variance as a fraction of each feature's variance in the first mini-batch.
    random_state : int, RandomState, Generator or None, default=None

    Attributes
    ----------
    components_, n_components_, noise_variance_, noise_precision_, mean_, alpha_, activity_
        As for :class:`GFA` (all K factors are kept).
    n_samples_seen_ : int
    n_batches_seen_ : int
    group_labels_, group_index_, n_features_in_
        As for :class:`GFA`.

    Notes
    -----
    Rows must be complete (use :class:`GFA` for missing values). The first mini-batch sets the initial
    factors and must hold at least ``n_components`` rows. Every batch is applied atomically: bad input or a
    numerical breakdown raises and leaves the model exactly as it was. Pickles, :meth:`save` and
    ``onlinefa.load`` restore the stream state exactly: further batches continue bit-identically.

    Calls from several threads happen in a serial order: :meth:`partial_fit` and :meth:`fit` publish the
    engine and every fitted attribute under the model's lock, and the queries (:meth:`transform`,
    :meth:`score_samples`, :meth:`score`, :meth:`predict_group`, :meth:`get_covariance`,
    :meth:`latent_second_moment`) and pickling read under it, so each answer comes from the state before
    or after a whole call. (Reading two fitted attributes one after the other from outside is two reads.)
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
        rotate_start: int = 1,
        schedule: ScheduleName = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        n_effective: float | None = None,
        batch_size: int = 50,
        init_noise_ratio: float = 1e-2,
        random_state: object = None,
    ) -> None:
        self.n_components = n_components
        self.groups = groups
        self.noise = noise
        self.ard_rank = ard_rank
        self.ard_lambda = ard_lambda
        self.rotate = rotate
        self.rotate_start = rotate_start
        self.schedule = schedule
        self.tau0 = tau0
        self.kappa = kappa
        self.rho = rho
        self.n_effective = n_effective
        self.batch_size = batch_size
        self.init_noise_ratio = init_noise_ratio
        self.random_state = random_state

    _core_class = _core.OnlineGFACore
    _engine_attribute = "_online"
    _transient_attributes = ("_core", "_lock")  # the query snapshot (rebuilt by _adopt) and the model's lock

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags

    def _new_online(self, n_features: int) -> tuple[_core.OnlineGFACore, Any, list[Any]]:
        index, labels = resolve_groups(self.groups, n_features)
        if not isinstance(self.schedule, str):
            raise ValueError(f"schedule must be 'harmonic', 'power' or 'constant', got {self.schedule!r}")
        n_eff = None if self.n_effective is None else check_positive_float(self.n_effective, "n_effective")
        online = _core.OnlineGFACore(
            index.tolist(),
            check_int(self.n_components, "n_components", 1),
            noise=self._noise_name(),
            rotate=check_bool(self.rotate, "rotate"),
            rotate_start=check_int(self.rotate_start, "rotate_start", 1),
            init_noise_ratio=check_positive_float(self.init_noise_ratio, "init_noise_ratio"),
            seed=seed_from(self.random_state),
            ard_rank=None if self.ard_rank is None else check_int(self.ard_rank, "ard_rank", 1),
            ard_lambda=check_positive_float(self.ard_lambda, "ard_lambda"),
            schedule=self.schedule,
            tau0=float(self.tau0),
            kappa=float(self.kappa),
            rho=float(self.rho),
            n_effective=n_eff,
        )
        return online, index, labels

    def _rows(self, X: ArrayLike, n_features: int | None = None) -> FloatArray:
        arr = as_real_matrix(X, type(self).__name__).astype(np.float64)
        for axis, what in ((0, "sample"), (1, "feature")):
            if arr.shape[axis] < 1:
                raise ValueError(
                    f"Found array with 0 {what}(s) (shape={arr.shape}) while a minimum of 1 is required."
                )
        if n_features is not None and arr.shape[1] != n_features:
            raise ValueError(
                f"X has {arr.shape[1]} features, but {type(self).__name__} is expecting {n_features} features as input."
            )
        if not np.isfinite(arr).all():
            raise ValueError("Input X contains NaN or infinity (OnlineGFA needs complete rows; use GFA)")
        return core_readable(np.ascontiguousarray(arr))

    def partial_fit(self, X: ArrayLike, y: object = None) -> Self:
        """Process one mini-batch of complete rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The first call fixes the features and their groups, validates the hyper-parameters and sets
            the initial factors from this batch (at least ``n_components`` rows).
        y : ignored

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, no rows, a NaN or infinite value, too few rows in the first batch, or an invalid
            hyper-parameter; the model is left exactly as it was.
        onlinefa.NumericalBreakdownError
            The update broke down numerically; the model is left exactly as it was.
        """
        with self._model_lock():  # the whole call, publication included, is one step of a serial order
            online: _core.OnlineGFACore | None = self.__dict__.get("_online")
            if online is None:
                x = self._rows(X)
                fresh, index, labels = self._new_online(x.shape[1])
                fresh.partial_fit(x)
                self._install(fresh, index, labels)
                return self
            online.partial_fit(self._rows(X, online.n_features))
            self._snapshot(online)
        return self

    def _model_lock(self) -> ModelLock:
        """This model's lock, made on first use (scikit-learn's ``__init__`` sets hyper-parameters only)."""
        lock: ModelLock | None = self.__dict__.get("_lock")
        if lock is None:
            with _FIRST_BATCH_LOCK:
                lock = self.__dict__.setdefault("_lock", ModelLock())
        assert lock is not None
        return lock

    def __getstate__(self) -> dict[str, Any]:
        with self._model_lock():  # the state after a whole call (the lock itself is left out)
            return super().__getstate__()

    def fit(self, X: ArrayLike, y: object = None, **fit_params: Any) -> Self:
        """Forget everything and make one pass over ``X`` in mini-batches of ``batch_size`` rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Complete rows.
        y : ignored
        **fit_params
            None accepted (for scikit-learn's ``fit_transform``).

        Returns
        -------
        self

        Raises
        ------
        ValueError, onlinefa.NumericalBreakdownError
            As :meth:`partial_fit`; the previous fit is kept unchanged on any error.
        """
        if fit_params:
            raise TypeError(f"OnlineGFA.fit got unexpected arguments {sorted(fit_params)}")
        x = self._rows(X)
        batch_size = check_int(self.batch_size, "batch_size", 1)
        fresh, index, labels = self._new_online(x.shape[1])
        for start in range(0, x.shape[0], batch_size):
            fresh.partial_fit(x[start : start + batch_size])
        with self._model_lock():
            self._install(fresh, index, labels)
        return self

    def _install(self, online: _core.OnlineGFACore, index: Any, labels: list[Any]) -> None:
        self.group_index_ = index
        self.group_labels_ = labels
        self.n_features_in_ = int(index.size)
        self._online = online
        self._snapshot(online)

    def _adopt(self, engine: Any) -> None:
        self._online = engine
        self._snapshot(engine)

    def _snapshot(self, online: _core.OnlineGFACore) -> None:
        engine = online.snapshot()
        assert engine is not None
        self._core = engine
        self._refresh(engine)
        self.n_samples_seen_ = online.n_seen
        self.n_batches_seen_ = online.n_batches

    def _refresh(self, engine: _core.GFACore) -> None:
        self.components_ = np.ascontiguousarray(engine.loading_mean().T)
        self.n_components_ = int(self.components_.shape[0])
        self.noise_variance_ = engine.noise_variance()
        shape, rate = engine.noise()
        self.noise_precision_ = shape / rate
        self.mean_ = engine.bias_mean()
        self.alpha_ = engine.alpha_mean()
        self.activity_ = engine.activity()

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means E_q[h] of complete rows given the current global factors.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
        """
        with self._model_lock():
            engine = self._fitted()
            n_features = self.n_features_in_
        return engine.latent_means(self._rows(X, n_features))

    def score_samples(self, X: ArrayLike) -> FloatArray:
        """Log density of each row under the state after the last whole call (see :meth:`GFA.score_samples`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        with self._model_lock():
            return super().score_samples(X)

    def predict_group(
        self, X: ArrayLike, group: Hashable, *, return_var: bool = False
    ) -> FloatArray | tuple[FloatArray, FloatArray]:
        """As :meth:`GFA.predict_group`, from the state after the last whole call.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, n_features - size of the group)
        group : label
        return_var : bool, default=False

        Returns
        -------
        mean : ndarray
        var : ndarray
            Only when ``return_var``.
        """
        with self._model_lock():
            return super().predict_group(X, group, return_var=return_var)

    def get_covariance(self) -> FloatArray:
        """Dense model covariance F̄ F̄ᵀ + diag(``noise_variance_``) of the state after the last whole call.

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If n_features exceeds 5000 (the matrix would be too large).
        """
        with self._model_lock():
            return super().get_covariance()

    def latent_second_moment(self) -> FloatArray:
        """Running average of ⟨h hᵀ⟩ over the samples seen, in the current latent basis (K×K).

        Returns
        -------
        ndarray of shape (n_components_, n_components_)
        """
        with self._model_lock():
            self._fitted()
            online: _core.OnlineGFACore = self.__dict__["_online"]
            moment = online.latent_second_moment()
        assert moment is not None
        return moment

    def lower_bound(self) -> float:
        """Not available: the bound needs every sample, which a stream does not keep.

        Raises
        ------
        TypeError
            Always.
        """
        raise TypeError("OnlineGFA keeps no data, so its lower bound cannot be computed; use GFA")

    def bound_terms(self) -> dict[str, float]:
        """Not available (see :meth:`lower_bound`).

        Raises
        ------
        TypeError
            Always.
        """
        raise TypeError("OnlineGFA keeps no data, so its lower bound cannot be computed; use GFA")
