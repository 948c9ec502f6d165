"""The streaming models: :class:`OnlineEM` (thesis Algorithm 2) and :class:`OnlineSGA` (Algorithm 1).

Both fit N(c, F Fᵀ + Ψ) to a stream θ_1, θ_2, … of D-dimensional vectors, one pass over the D×K state
per sample, in the Rust core. Thesis symbols ↔ attributes: c = θ̄ ↔ ``mean``, F ↔ ``loadings``,
ψ = diag Ψ ↔ ``noise_variance``, t ↔ ``n_seen``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core as _engine
from ._device import DeviceMovable
from ._gaussian import CachedSnapshot, FactorGaussianMixin, refreshed_snapshot
from ._persist import CheckpointMixin
from .errors import NotFittedError
from ._validation import (
    as_sample_matrix,
    check_choice,
    check_dims,
    check_dtype,
    check_init,
    check_int,
    check_positive_float,
    check_seed,
    sga_step_args,
    SeedLike,
    StateDTypeLike,
)

Schedule = Literal["harmonic", "power", "constant"]
Scaling = Literal["data", "unit"]

#: Default lower bound on every ψ_d: relative to σ̂² (the mean over features of the running squared
#: deviations) under ``scaling="data"``, absolute (squared data units) under ``scaling="unit"``.
DEFAULT_NOISE_FLOOR = 1e-10

#: Range of variances over which ``scaling="data"`` is measured to be scale-equivariant (fitting c·θ gives
#: c² times the covariance of θ, to 1e-3 relative or better), per model and state dtype:
#: ``(smallest noise variance, largest feature variance)``, in squared data units. The lower end is 1000
#: times the absolute floor every ψ_d is kept above (1e-200 for float64, 1e-30 for float32 state); the
#: upper end of :class:`OnlineSGA` is 1/100 of the ceiling its ψ is kept under (1e150 / 1e18). ``None``:
#: no limit inside the accepted inputs (|x| <= 1e100 / 1e18). These limits are documented, not checked.
SCALE_EQUIVARIANT_VARIANCES: dict[str, dict[str, tuple[float, float | None]]] = {
    "OnlineEM": {"float64": (1e-197, None), "float32": (1e-27, None)},
    "OnlineSGA": {"float64": (1e-197, 1e148), "float32": (1e-27, 1e16)},
}

#: ``n_warmup="auto"``: K + 2 samples (the first fit then has K + 1 non-zero deviations d_t, enough for K
#: factors), at most 100. Shorter warm-ups start the fit from rank-deficient statistics, and the fit
#: stays worse for good (see :class:`OnlineEM`'s ``n_warmup``).
AUTO_WARMUP_MAX = 100



def resolve_warmup(n_warmup: object, n_components: int) -> int:
    """Return the warm-up length: ``"auto"`` is min(K + 2, 100), an int is used as given (>= 0)."""
    if isinstance(n_warmup, str):
        if n_warmup != "auto":
            raise ValueError(f"n_warmup must be 'auto' or an integer >= 0, got {n_warmup!r}")
        return min(n_components + 2, AUTO_WARMUP_MAX)
    return check_int(n_warmup, "n_warmup", 0)


def check_scaling(scaling: object) -> str:
    """The validated ``scaling`` argument: "data" or "unit" (ValueError otherwise)."""
    return check_choice(scaling, "scaling", ("data", "unit"))


class _ScheduleArgs(TypedDict):
    schedule: str
    tau0: float
    kappa: float
    rho: float


class _CommonArgs(TypedDict):
    n_features: int
    n_components: int
    n_warmup: int
    init: NDArray[np.float64] | None
    seed: int | None
    noise_floor: float
    dtype: str


def schedule_args(schedule: str, tau0: float, kappa: float, rho: float) -> _ScheduleArgs:
    check_choice(schedule, "schedule", ("harmonic", "power", "constant"))
    return {"schedule": schedule, "tau0": float(tau0), "kappa": float(kappa), "rho": float(rho)}


def _settings(own: dict[str, Any], schedule: str, tau0: float, kappa: float, rho: float, scaling: str,
              noise_floor: float) -> dict[str, Any]:
    """The configuration shown by ``repr``: the class's own options, then the schedule with only the
    parameters it uses, the scaling and the noise floor (the same from arguments and from a checkpoint)."""
    schedule_settings: dict[str, Any] = {"schedule": schedule}
    if schedule == "power":
        schedule_settings.update(tau0=float(tau0), kappa=float(kappa))
    elif schedule == "constant":
        schedule_settings["rho"] = float(rho)
    return {**own, **schedule_settings, "scaling": scaling, "noise_floor": float(noise_floor)}


def common_args(
    n_features: object, n_components: object, n_warmup: object, init: ArrayLike | None,
    seed: object, noise_floor: object, dtype: object,
) -> _CommonArgs:
    d, k = check_dims(n_features, n_components)
    return {
        "n_features": d,
        "n_components": k,
        "n_warmup": resolve_warmup(n_warmup, k),
        "init": check_init(init, d, k),
        "seed": check_seed(seed),
        "noise_floor": check_positive_float(noise_floor, "noise_floor"),
        "dtype": check_dtype(dtype),
    }


class _StreamingModel(DeviceMovable, CheckpointMixin, FactorGaussianMixin):
    """Shared front of the Rust engines: input conversion, properties, Gaussian helpers."""

    _core: _engine.OnlineEMCore | _engine.OnlineSGACore
    _core_class: type[_engine.OnlineEMCore] | type[_engine.OnlineSGACore]
    _n_features: int
    _n_components: int
    _cache: CachedSnapshot | None = None
    #: (n_seen, engine) of :meth:`_ended_warmup`'s last answer (OnlineEM during warm-up).
    _provisional: tuple[int, Any] | None = None
    #: The configuration options specific to the class (beyond schedule, scaling and noise floor).
    _own_settings: tuple[str, ...] = ()
    #: Values of own settings that checkpoints written before the setting existed imply.
    _legacy_settings: dict[str, Any] = {}
    #: (n_seen, R): the K×K reporting map of a model whose rows are one shard of a larger model, computed over
    #: all the shards after the last update (``onlinefa.distributed``); None: the engine's own.
    _fixed_map: tuple[int, NDArray[np.float64]] | None = None
    _settings: dict[str, Any]

    def _construct(self, core_class: Any, own: dict[str, Any], own_settings: dict[str, Any], args: _CommonArgs,
                   schedule: str, tau0: float, kappa: float, rho: float, scaling: str) -> None:
        """Build the engine from the shared arguments and the algorithm's own (``own``, recorded as
        ``own_settings``): the one constructor body of both streaming classes."""
        self._n_features = args["n_features"]
        self._n_components = args["n_components"]
        self._core = core_class(**args, **own, **schedule_args(schedule, tau0, kappa, rho),
                                scaling=check_scaling(scaling))
        self._settings = _settings(own_settings, schedule, tau0, kappa, rho, scaling, args["noise_floor"])

    def update(self, X: ArrayLike) -> "_StreamingModel":
        """Apply one sample or a batch of samples, in row order.

        Parameters
        ----------
        X : array-like of shape (n_features,) or (n_samples, n_features)
            float32 or float64 arrays in any memory layout are read in place (no copy); integers and
            booleans are converted to float64 once. The GIL is released during the update.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Wrong shape, or a NaN/±Inf (or a magnitude above 1e100 for float64 state, 1e18 for float32)
            anywhere in the batch; the message names the first bad row and *no* row is applied.
        NumericalBreakdownError
            A numerical breakdown (an ``ArithmeticError``; only reachable with inputs many orders of
            magnitude outside the data seen so far, or an SGA step that diverges): models with
            D·K <= 2**18 restore their exact previous state; larger ones skip that safety copy for speed and
            keep the rows before the failing one, and are then exactly the model they were before the failing
            row (no part of that row is applied; the same future under the same data).
        TypeError
            Non-numeric or complex input.
        """
        self._cache = self._provisional = None
        self._core.update(as_sample_matrix(X, self._n_features))
        self._cache = self._provisional = None
        return self

    @property
    def n_warmup(self) -> int:
        """Warm-up length: the fitted Gaussian is available once more than this many samples were seen."""
        return self._core.n_warmup

    @property
    def is_fitted(self) -> bool:
        """Whether warm-up is over, so that ``loadings``, ``noise_variance`` and the queries are fitted."""
        return self._core.is_fitted

    def snapshot(self, dtype: Any = None) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
        """The fitted Gaussian (mean, F, ψ), read from one consistent state.

        The three arrays are computed together under the model's lock, so an update running in another
        thread cannot mix two states. In float64 (the default) they are cached (read-only) until the next
        ``update``: repeated accessor calls do not recompute the D×K loadings. Being read-only, they go to
        PyTorch as ``torch.from_numpy(array.copy())`` (``torch.as_tensor`` warns that they are not writable).

        Parameters
        ----------
        dtype : {None, "float64", "float32"}, default=None
            None or ``"float64"``: float64, cached and read-only. ``"float32"``: new writable float32 arrays
            (each value of the float64 snapshot rounded once); for a float32 model they are built without a
            float64 D×K copy (half the memory of the default at D = 10⁸).

        Returns
        -------
        mean : ndarray of shape (n_features,)
        loadings : ndarray of shape (n_features, n_components)
        noise_variance : ndarray of shape (n_features,)

        Raises
        ------
        NotFittedError
            OnlineSGA before its warm-up has ended (``n_seen <= n_warmup``: the model would only return its
            initialisation); OnlineEM before two distinct samples (during its warm-up it answers with the
            Gaussian of the first fit from the samples so far, see ``n_warmup``).
        """
        wanted = _snapshot_dtype(dtype)
        core = self._answering_core()
        if wanted == np.float32:
            if core is self._core and self.dtype == "float32":
                _, mean, loadings, psi = _engine.storage_snapshot(core)
                return mean, loadings, psi
            mean64, loadings64, psi64 = self.snapshot()
            return mean64.astype(np.float32), loadings64.astype(np.float32), psi64.astype(np.float32)
        cached = refreshed_snapshot(core, self._cache)
        self._cache = cached
        return cached[1], cached[2], cached[3]

    def _answering_core(self) -> Any:
        """The engine whose Gaussian the queries report: the model's own once warm-up is over; before
        that, where the class allows it (:meth:`_ended_warmup`), a copy with the warm-up ended at the last
        sample; otherwise NotFittedError."""
        core = self._core
        if core.is_fitted:
            fixed = self._fixed_map
            return core if fixed is None or fixed[0] != core.n_seen else MappedCore(core, fixed[1])
        ended = self._ended_warmup()
        if ended is None:
            raise NotFittedError(self._warmup_message())
        return ended

    def _ended_warmup(self) -> Any:
        """An engine answering during warm-up, or None (the default: queries wait for the warm-up)."""
        return None

    def _warmup_message(self) -> str:
        return (
            f"{type(self).__name__} has seen {self.n_seen} samples and is still in its warm-up of "
            f"{self.n_warmup}; its loadings and noise variances are only the initialisation. Feed more samples."
        )

    def _require_fitted(self) -> None:
        self._answering_core()

    def _params(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        return self.snapshot()

    def _query_engine(self) -> Any:
        return self._answering_core()

    @property
    def n_features(self) -> int:
        """D, the dimension of the samples."""
        return self._n_features

    @property
    def n_components(self) -> int:
        """K, the number of latent factors."""
        return self._n_components

    @property
    def n_seen(self) -> int:
        """Number of samples applied so far (t)."""
        return self._core.n_seen

    @property
    def dtype(self) -> str:
        """Storage dtype of the D-sized state, "float32" or "float64"."""
        return self._core.dtype

    @property
    def mean(self) -> NDArray[np.float64]:
        """Running mean θ̄_t, shape (D,): under ``scaling="data"`` the exact average of every sample fed
        (θ_SWA) whatever the schedule. A new array on each access (available before warm-up ends)."""
        return self._core.mean()

    @property
    def loadings(self) -> NDArray[np.float64]:
        """Factor loading matrix F, shape (D, K) (read-only, cached until the next update; see
        :meth:`snapshot`). Raises :class:`NotFittedError` during warm-up."""
        return self.snapshot()[1]

    @property
    def noise_variance(self) -> NDArray[np.float64]:
        """Diagonal noise variances ψ = diag Ψ, shape (D,) (read-only, cached until the next update).
        Raises :class:`NotFittedError` during warm-up."""
        return self.snapshot()[2]

    def initial_parameters(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(F, ψ) as the next E-step uses them, also during warm-up (then the data-scaled start F₀ σ̂, σ̂²).

        A computation on every call, for inspection and tests; use :meth:`snapshot` for the fitted model.
        """
        return self._core.loadings(), self._core.noise_variance()

    def _restore(self, state: dict[str, Any]) -> None:
        self._cache = self._provisional = None
        self._core = self._core_class.from_state(state)
        self._n_features = int(state["n_features"])
        self._n_components = int(state["n_components"])
        own = {name: state[name] if name in state else self._legacy_settings[name] for name in self._own_settings}
        self._settings = _settings(
            own, state["schedule"], state["tau0"], state["kappa"],
            state["rho"], state["scaling"], state["noise_floor"],
        )

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in self._settings.items())
        return (
            f"{type(self).__name__}(n_features={self._n_features}, n_components={self._n_components}, {settings}, "
            f"n_warmup={self.n_warmup}, dtype={self.dtype!r}, n_seen={self.n_seen})"
        )


class MappedCore:
    """An engine whose queries report its Gaussian with the loadings mapped by a fixed K×K transform."""

    def __init__(self, core: Any, transform: NDArray[np.float64]) -> None:
        self._core, self._transform = core, transform

    @property
    def n_seen(self) -> int:
        n: int = self._core.n_seen
        return n

    @property
    def is_fitted(self) -> bool:
        fitted: bool = self._core.is_fitted
        return fitted

    def snapshot(self) -> Any:
        return self._core.snapshot(self._transform)

    def log_prob(self, x: NDArray[np.float64]) -> Any:
        return self._core.log_prob(x, self._transform)

    def latent_mean(self, x: NDArray[np.float64]) -> Any:
        return self._core.latent_mean(x, self._transform)

    def draw_into(self, latent: NDArray[np.float64], out: NDArray[Any]) -> None:
        self._core.draw_into(latent, out, self._transform)

    def query_sums(self, x: NDArray[np.float64]) -> Any:
        return self._core.query_sums(x, self._transform)


def sharded_query_engine(local: _StreamingModel, rank: int) -> Any:
    """The engine that answers the collective queries of one rank's rows of a sharded model (``local``, on the
    Rust core): with ``shrink``, the loadings mapped by the K×K map computed over every rank's rows after the
    last update (RuntimeError if a failed collective left it out of date)."""
    local._require_fitted()
    core = local._core
    if not local._settings.get("shrink", False) or not core.is_fitted:
        return core
    fixed = local._fixed_map
    if fixed is None or fixed[0] != core.n_seen:
        raise RuntimeError(
            f"rank {rank}: the reporting map of the sharded model is out of date (a collective failed after the "
            "last samples were applied); call update again (with the next samples) on every rank")
    return MappedCore(core, fixed[1])


class OnlineEM(_StreamingModel):
    """Online expectation-maximisation for factor analysis (Brownlie 2021, Algorithm 2, with whitening).

    Streams samples θ_t and keeps running averages θ̄, Ā = mean(d mᵀ), B̄ = mean(m mᵀ), d̄² = mean(d²),
    with d_t = θ_t − θ̄_t (the mean *after* including θ_t) and m_t the latent posterior mean (4.23).
    After warm-up, F = Ā H̄⁻¹ and ψ = d̄² − rowsum(F ⊙ Ā) with H̄ = Σ + B̄; they are derived on demand,
    so the state is D·K + 4·D numbers (plus the D×K initial loadings until the warm-up ends). Each update
    reads and writes that state once.

    The defaults are the configuration that is accurate on real data at any scale: whitening (a
    parameter-expanded EM step), equal weights ρ_t = 1/t for every statistic, the exact running mean
    (θ_SWA), and a start and noise floor measured in the data's units (``scaling="data"``), so that
    fitting c·θ gives c² times the covariance (within the range of variances given under ``scaling``).
    With whitening the marginal variances diag(F Fᵀ) + ψ equal d̄², so with equal weights they are the
    samples' own variances: on ordered SGD iterates of real networks 0.99–1.00 times the iterates'
    empirical variances (a forgetting schedule ρ_t = t^(−0.9) weights the late, most distant iterates more
    and measured 1.24–1.44 times). :meth:`algorithm2` builds the thesis's exact algorithm instead (used to
    reproduce its experiments).

    Parameters
    ----------
    n_features : int
        D, the dimension of the samples (>= 2).
    n_components : int
        K, the number of latent factors, 1 <= K < D.
    n_warmup : int or "auto", default="auto"
        For the first ``n_warmup`` samples the running averages are updated while F and ψ keep their
        starting values; the updates fit from sample ``n_warmup + 1`` on. "auto" is min(K + 2, 100): the
        first fit then has K + 1 non-zero deviations (d_1 = θ_1 − θ̄_1 = 0), enough for K factors. Shorter
        warm-ups start from rank-deficient statistics and measured persistently worse fits: at D = 50,
        K = 10, T = 20,000 the relative covariance error was 0.05 with 12, 0.13 with 10, 0.29 with 5 and
        0.35 with 2. **Queries during the warm-up** (from the second distinct sample on) answer with the
        Gaussian the first fit would give if the warm-up had ended at the last sample (exactly that of the
        same model with ``n_warmup = n_seen − 1``; rank at most n_seen − 1; marginal variances d̄²). The
        model itself keeps warming up; the answer costs one copy of the state, made once per sample count.
        So any stream of T >= 2 snapshots gives a posterior whatever K is (e.g. K = 20 with one snapshot
        per epoch over 20 epochs); ``is_fitted`` tells whether the warm-up is over. Before two distinct
        samples, queries raise :class:`NotFittedError`.
    init : array-like of shape (D, K), optional
        Initial loadings F₀. Default: Q of the reduced QR of a standard-normal D×K matrix drawn with
        ``seed`` (thesis §4.4), so FᵀF = I. Under ``scaling="data"`` the warm-up uses F₀ σ̂ and ψ₀ = σ̂².
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
        Seed for the default initialisation (None: fresh entropy). A ``Generator`` gives one draw
        ``int(seed.integers(0, 2**63 - 1))`` and so advances it; a ``SeedSequence`` its first 64-bit word.
    noise_floor : float, default=1e-10
        Lower bound on every ψ_d, as a fraction of σ̂² = mean over features of d̄² (``scaling="data"``), or
        in squared data units (``scaling="unit"``). It only acts on degenerate features (constant ones);
        whenever it is not active the result equals the unfloored algorithm.
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state. "float32" halves memory and traffic; K×K quantities and all sums
        stay float64. Inputs may then not exceed 1e18 in magnitude. Also accepted: ``np.float32``/``np.float64``,
        ``np.dtype`` objects and ``torch.float32``/``torch.float64``.
    whiten : bool, default=True
        Apply the whitening (parameter-expanded EM) step after each M-step: with R Rᵀ = H̄, F ← F R,
        Ā ← Ā R⁻ᵀ, H̄ ← I.
    schedule : {"harmonic", "power", "constant"}, default="harmonic"
        Step sizes of the covariance statistics: ρ_t = 1/t (the thesis; equal weights), ρ_t =
        (t + tau0)^(−kappa) (forgets early samples: lower error on long stationary streams, wider than the
        samples on drifting ones), or a constant ``rho``; every schedule is floored at 1/t, so ρ_1 = 1.
        Equal weights keep the first, poorly started steps for good: on a stationary D = 30, K = 3 stream
        one of two seeds was still 0.14 from the true loadings after 20,000 samples (κ = 0.9: 0.03),
        0.016 after 100,000; in float32 the 1/t steps also drift more from float64 (6e-5 against 1.3e-5
        after 10⁵ samples, both far below the statistical error). For long stationary streams (not SGD
        iterates) ``schedule="power"`` is the better choice.
    tau0, kappa, rho : float
        Parameters of the "power" (tau0 >= 0, kappa in (0.5, 1], default 0.9) and "constant" (rho in (0, 1])
        schedules.
    scaling : {"data", "unit"}, default="data"
        "data": warm-up start F₀ σ̂, ψ₀ = σ̂², relative noise floor, the mean is the exact running average
        whatever the schedule. "unit": the thesis (F₀, ψ₀ = 1, absolute floor, mean on the schedule).
        Under "data", fitting c·θ gives c² times the covariance (to 1e-3 relative, measured) while every
        feature's noise variance is at least 1e-197 (float64 state) or 1e-27 (float32), 1000 times the
        absolute floor ψ_d >= 1e-200 / 1e-30 that applies when σ̂² is that small; there is no upper limit
        inside the accepted inputs (measured up to ``|x|`` = 5e99 / 5e17). Below that end the fit is wrong
        without an error (1.4% off at noise variances of 5e-201 / 5e-31, 17% at 1.6e-31 in float32); the
        limit is not checked, since that would take a second pass over every batch
        (``SCALE_EQUIVARIANT_VARIANCES`` in ``onlinefa.streaming`` holds the range).
    shrink : bool, default=True
        Report the fitted Gaussian with the factors shrunk to what the samples support (the spiked covariance
        model; Donoho, Gavish & Johnstone, "Optimal shrinkage of eigenvalues in the spiked covariance model",
        2018). The factor strengths m_k (eigenvalues of Fᵀ Ψ⁻¹ F, the factors' variance over the noise's) of a
        fit to n samples in D dimensions overstate the true ones when γ = D/(n − 1) is not small, and those
        below (1 + √γ)² − 1 cannot be told from noise: each is set to its Frobenius-optimal value (zero below
        that edge), keeping its direction, and the variance it gives up moves to ψ, so the marginal
        variances diag(F Fᵀ) + ψ are exactly the fit's. n is the effective number of samples of the schedule
        (n = t for equal weights); the shrinkage vanishes as n grows. The state and the updates are the
        same either way: only what the queries report (``snapshot``, ``loadings``, ``log_prob``, ``sample``,
        ...) changes, at the cost of one more read of the state per query. On the synthetic stream of
        ``onlinefa demo`` (D = 1000, K = 10) the relative covariance error at T = 20 / 50 / 100 / 200 /
        500 / 1,000 / 5,000 / 20,000 was 0.38 / 0.23 / 0.17 / 0.14 / 0.11 / 0.10 / 0.075 / 0.043 against
        3.73 / 1.56 / 0.83 / 0.47 / 0.24 / 0.16 / 0.082 / 0.043 without it (thesis Algorithm 2: 0.86 /
        0.36 / 0.22 / 0.17 / 0.13 / 0.12 / 0.085 / 0.054). ``False`` reports the fit as it is.
    device : str or torch.device, optional
        Where the D-sized rows live. None (the default): in the Rust core, in host memory, with NumPy arrays in
        and out. Any torch device (``"cuda:0"``, ``"cpu"``, ...): in torch tensors on that device, with torch
        tensors in and out, the same Rust K×K step driving them (needs PyTorch). Both are this class; the
        checkpoints are the same, and :meth:`to` moves a model between them.

    Examples
    --------
    >>> import numpy as np, onlinefa
    >>> X = np.random.default_rng(0).standard_normal((500, 20))
    >>> em = onlinefa.OnlineEM(20, 3, seed=0).update(X)
    >>> em.loadings.shape, em.noise_variance.shape, em.n_seen
    ((20, 3), (20,), 500)
    """

    _core_class = _engine.OnlineEMCore
    _device_impl = "onlinefa.torch._online_em:OnlineEM"
    _own_settings = ("whiten", "shrink")
    _legacy_settings = {"shrink": False}

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        n_warmup: int | Literal["auto"] = "auto",
        init: ArrayLike | None = None,
        seed: SeedLike = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: StateDTypeLike = "float64",
        whiten: bool = True,
        schedule: Schedule = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        scaling: Scaling = "data",
        shrink: bool = True,
        device: Any = None,
    ) -> None:
        args = common_args(n_features, n_components, n_warmup, init, seed, noise_floor, dtype)
        own = {"whiten": bool(whiten), "shrink": bool(shrink)}
        self._construct(_engine.OnlineEMCore, own, own, args, schedule, tau0, kappa, rho, scaling)

    @classmethod
    def algorithm2(
        cls,
        n_features: int,
        n_components: int,
        *,
        n_warmup: int = 100,
        init: ArrayLike | None = None,
        seed: SeedLike = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: StateDTypeLike = "float64",
        device: Any = None,
    ) -> "OnlineEM":
        """The thesis's Algorithm 2 exactly: no whitening, ρ_t = 1/t, F₀ = Q, ψ₀ = 1, 100 warm-up samples,
        absolute noise floor (``scaling="unit"``), the fit reported as it is (``shrink=False``). For reproducing the thesis; on data far from unit scale
        (network weights) it collapses — use the default constructor there. ``device`` as for the constructor."""
        return cls(
            n_features, n_components, n_warmup=n_warmup, init=init, seed=seed, noise_floor=noise_floor,
            dtype=dtype, whiten=False, schedule="harmonic", scaling="unit", shrink=False, device=device,
        )

    def _ended_warmup(self) -> Any:
        """During warm-up, from the second distinct sample on: a copy of the engine whose warm-up ended at
        the last sample (the first M-step on the statistics so far), built once per sample count."""
        core = self._core
        assert isinstance(core, _engine.OnlineEMCore)
        cached = self._provisional
        if cached is not None and cached[0] == core.n_seen:
            return cached[1]
        if core.n_seen < 2:
            return None
        try:
            ended = core.ended_warmup()
        except RuntimeError:  # warm-up ended meanwhile (another thread), or no scale yet
            return core if core.is_fitted else None
        self._provisional = (ended.n_seen, ended)
        return ended

    def _warmup_message(self) -> str:
        return (
            f"OnlineEM has seen {self.n_seen} samples: a first fit needs two samples that differ (the fitted "
            f"Gaussian then has rank at most n_seen − 1 until the warm-up of {self.n_warmup} ends). Feed more "
            "samples."
        )


class OnlineSGA(_StreamingModel):
    """Online stochastic gradient ascent for factor analysis (Brownlie 2021, Algorithm 1).

    For each sample: θ̄_t (running mean), d_t = θ_t − θ̄_t, the latent posterior (4.23) m_t = Σ Fᵀ Ψ⁻¹ d_t,
    P_t = Σ + m_t m_tᵀ with Σ = (I + Fᵀ Ψ⁻¹ F)⁻¹, then one step on F and ψ. Each update reads and writes the
    D×K state once. Under the default ``scaling="data"`` the model starts from F₀ σ̂ and ψ₀ = d̄² of the warm-up
    samples, and the F step is preconditioned by ψ, so c·θ gives c² times the covariance (within the range given
    under ``scaling``).

    The default step (``lr="auto"``) is the one that is right on SGD iterates: with a = 1/t for sample t,

    * F ← (F + a_F (d mᵀ − F P)) L with a_F = min(a, 1/(1 + m·m)) and L Lᵀ = (1 − a_F) I + a_F P: the gradient
      step (4.24), kept a contraction, then the whitening of online EM (parameter expansion: the latent
      covariance the step implies is moved into F);
    * ψ ← ψ + a (q − ψ), q = d² − 2 d (F m) + diag(F P Fᵀ): the β = log ψ gradient (4.26) preconditioned by its
      Fisher information.

    Measured against the thesis's constant step (lr = 1e-3) on the streams below, in the project's
    ``benches/sga_variants.py``: on the demo's synthetic stream (D = 1000, K = 10) the covariance error falls
    with T (0.138 / 0.076 / 0.042 at T = 1,000 / 5,000 / 20,000, against 0.276 / 0.105 / 0.113; the default
    :class:`OnlineEM` 0.098 / 0.075 / 0.043); on ordered SGD iterates of small networks the marginal variances
    are the iterates' (0.99–1.00×, against 0.04–0.10×) and the Bayesian model average beats SWAG-diagonal's
    where OnlineEM's does; on standardised digits, whose nearly constant pixels have rare large values, the
    error against scikit-learn's ``FactorAnalysis`` is 0.16 (against 1.5·10⁵).

    A float ``lr`` takes the constant-step gradient method instead: ΔF = lr·(d mᵀ − F P) (preconditioned by ψ
    under "data") and a step of lr on β = log ψ bounded to ±1 per sample (a feature frozen during warm-up starts
    at the noise floor, and its first deviations would otherwise throw ψ to the largest storable value).
    :meth:`algorithm1` builds the thesis's algorithm. A constant step leaves a noise floor (lr = 1e-3: 0.113 at
    T = 20,000 above) and heavy-tailed features can throw it off by orders of magnitude (Warnings below).

    :class:`OnlineEM` is as accurate or more on every stream measured, and is the library's default posterior.

    Parameters
    ----------
    n_features : int
        D, the dimension of the samples (>= 2).
    n_components : int
        K, the number of latent factors, 1 <= K < D.
    lr : "auto" or float, default="auto"
        "auto": the whitened steps of size 1/t above (needs ``scaling="data"``). A float (> 0): the constant
        learning rate of the gradient method, free of units under ``scaling="data"``; its noise floor grows
        with lr·D (on a D = 1000, K = 10 model lr = 1e-3 reached a relative covariance error of 0.11 after
        5,000 samples where 1e-2 stalled at 0.78).
    n_warmup : int or "auto", default="auto"
        For the first ``n_warmup`` samples only the running mean (and, under ``scaling="data"``, the
        running d̄² that sets the start) is updated; queries before it ends raise :class:`NotFittedError`.
        "auto" is min(K + 2, 100).
    init : array-like of shape (D, K), optional
        Initial loadings; default: orthonormal (thesis §4.4) drawn with ``seed``.
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
        Seed for the default initialisation (None: fresh entropy). A ``Generator`` gives one draw
        ``int(seed.integers(0, 2**63 - 1))`` and so advances it; a ``SeedSequence`` its first 64-bit word.
    noise_floor : float, default=1e-10
        Lower bound on every ψ_d, relative to σ̂² (``scaling="data"``) or absolute (``"unit"``).
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state (K×K quantities and sums stay float64); dtype objects are accepted as
        for :class:`OnlineEM`.
    schedule, tau0, kappa, rho
        Step sizes of the running mean under ``scaling="unit"``, as in :class:`OnlineEM`; under "data"
        the mean is the exact running average.
    scaling : {"data", "unit"}, default="data"
        As in :class:`OnlineEM`; "data" also preconditions the F step by ψ.
        Under "data", fitting c·θ gives c² times the covariance (to 1e-3 relative, measured with the
        constant step lr = 1e-3 on Gaussian data) while every feature's noise variance is at least 1e-197
        (float64 state) or 1e-27 (float32) and every feature's variance at most 1e148 (float64) or 1e16
        (float32): ψ is kept within [1e-200, 1e150] (float64) or [1e-30, 1e18] (float32), and these ends are
        1000 times the floor and 1/100 of the ceiling. Outside them the fit is wrong without an error (at
        variances of 8e149 / 8e17 it was 1% off, at 10 times that 26%; at noise variances of 5e-201 /
        5e-31, 3.5% off); the limits are not checked, since that would take a second pass over every
        batch (``SCALE_EQUIVARIANT_VARIANCES`` in ``onlinefa.streaming`` holds the range).
    device : str or torch.device, optional
        Where the D-sized rows live. None (the default): in the Rust core, in host memory, with NumPy arrays in
        and out. Any torch device (``"cuda:0"``, ``"cpu"``, ...): in torch tensors on that device, with torch
        tensors in and out, the same Rust K×K step driving them (needs PyTorch). Both are this class; the
        checkpoints are the same, and :meth:`to` moves a model between them.

    Warnings
    --------
    With a constant ``lr``, heavy-tailed features can throw the fit off. A feature that is nearly constant with
    rare large values (a pixel that is almost always blank, standardised: most values near 0, a few near 40)
    gets a tiny ψ from the bulk of its samples, and each rare value then enters the latent posterior with
    weight d/ψ and moves every loading by a step of lr·(m·m), which can exceed the stable size. On the
    standardised scikit-learn digits (the 61 pixels that vary, K = 5, 10,000 samples drawn from the 1,797
    images) the covariance's relative error against scikit-learn's ``FactorAnalysis`` reached 1.5·10⁵, with no
    error raised. The default ``lr="auto"`` bounds that step (0.16 on the same stream; :class:`OnlineEM` 0.14).
    """

    _core_class = _engine.OnlineSGACore
    _device_impl = "onlinefa.torch._online_sga:OnlineSGA"
    _own_settings = ("lr",)

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        lr: float | Literal["auto"] = "auto",
        n_warmup: int | Literal["auto"] = "auto",
        init: ArrayLike | None = None,
        seed: SeedLike = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: StateDTypeLike = "float64",
        schedule: Schedule = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        scaling: Scaling = "data",
        device: Any = None,
    ) -> None:
        args = common_args(n_features, n_components, n_warmup, init, seed, noise_floor, dtype)
        own, setting = sga_step_args(lr, scaling)
        self._construct(_engine.OnlineSGACore, own, {"lr": setting}, args, schedule, tau0, kappa, rho, scaling)

    def _restore(self, state: dict[str, Any]) -> None:
        super()._restore(state)
        if state.get("rule") == "whitened":
            self._settings["lr"] = "auto"

    @classmethod
    def algorithm1(
        cls,
        n_features: int,
        n_components: int,
        *,
        lr: float = 1e-3,
        n_warmup: int = 100,
        init: ArrayLike | None = None,
        seed: SeedLike = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: StateDTypeLike = "float64",
        device: Any = None,
    ) -> "OnlineSGA":
        """The thesis's Algorithm 1 exactly: plain SGD (constant lr = 1e-3) from F₀ = Q, ψ₀ = 1, 100 warm-up samples,
        ρ_t = 1/t, absolute noise floor (``scaling="unit"``). For reproducing the thesis only; ``device`` as for the
        constructor."""
        return cls(
            n_features, n_components, lr=lr, n_warmup=n_warmup, init=init, seed=seed, noise_floor=noise_floor,
            dtype=dtype, schedule="harmonic", scaling="unit", device=device,
        )


def _snapshot_dtype(dtype: Any) -> type[np.floating[Any]]:
    """np.float64 for None/"float64", np.float32 for "float32" (or the NumPy types); ValueError otherwise."""
    if dtype is None:
        return np.float64
    try:
        resolved = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"dtype must be None, 'float64' or 'float32', got {dtype!r}") from err
    if resolved == np.float64:
        return np.float64
    if resolved == np.float32:
        return np.float32
    raise ValueError(f"dtype must be None, 'float64' or 'float32', got {dtype!r}")
