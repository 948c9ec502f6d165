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
from ._gaussian import FactorGaussianMixin
from ._persist import CheckpointMixin
from ._validation import (
    as_sample_matrix,
    check_dtype,
    check_init,
    check_int,
    check_positive_float,
    check_seed,
)

Schedule = Literal["harmonic", "power", "constant"]

#: Default lower bound on every ψ_d (absolute, squared data units).
DEFAULT_NOISE_FLOOR = 1e-10


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


def _schedule_args(schedule: str, tau0: float, kappa: float, rho: float) -> _ScheduleArgs:
    if schedule not in ("harmonic", "power", "constant"):
        raise ValueError(f"schedule must be 'harmonic', 'power' or 'constant', got {schedule!r}")
    return {"schedule": schedule, "tau0": float(tau0), "kappa": float(kappa), "rho": float(rho)}


def _common_args(
    n_features: object, n_components: object, n_warmup: object, init: ArrayLike | None,
    seed: object, noise_floor: object, dtype: object,
) -> _CommonArgs:
    d = check_int(n_features, "n_features", 2)
    k = check_int(n_components, "n_components", 1)
    if k >= d:
        raise ValueError(f"n_components must be < n_features = {d}, got {k}")
    return {
        "n_features": d,
        "n_components": k,
        "n_warmup": check_int(n_warmup, "n_warmup", 0),
        "init": check_init(init, d, k),
        "seed": check_seed(seed),
        "noise_floor": check_positive_float(noise_floor, "noise_floor"),
        "dtype": check_dtype(dtype),
    }


class _StreamingModel(CheckpointMixin, FactorGaussianMixin):
    """Shared front of the Rust engines: input conversion, properties, Gaussian helpers."""

    _core: _engine.OnlineEMCore | _engine.OnlineSGACore
    _core_class: type[_engine.OnlineEMCore] | type[_engine.OnlineSGACore]
    _n_features: int
    _n_components: int

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
            anywhere in the batch; the message names the first bad row and *no* row is applied. Also
            raised on a numerical breakdown (only reachable with inputs many orders of magnitude outside
            the data seen so far): models with D·K <= 2**18 then restore their exact previous state;
            larger ones skip that safety copy for speed and keep the rows before the failing one.
        TypeError
            Non-numeric or complex input.
        """
        self._core.update(as_sample_matrix(X, self._n_features))
        return self

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
        """Running mean θ̄_t (thesis c, θ_SWA), shape (D,)."""
        return self._core.mean()

    @property
    def loadings(self) -> NDArray[np.float64]:
        """Factor loading matrix F, shape (D, K)."""
        return self._core.loadings()

    @property
    def noise_variance(self) -> NDArray[np.float64]:
        """Diagonal noise variances ψ = diag Ψ, shape (D,)."""
        return self._core.noise_variance()

    def _restore(self, state: dict[str, Any]) -> None:
        self._core = self._core_class.from_state(state)
        self._n_features = int(state["n_features"])
        self._n_components = int(state["n_components"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_features={self._n_features}, n_components={self._n_components}, "
            f"n_seen={self.n_seen}, dtype={self.dtype!r})"
        )


class OnlineEM(_StreamingModel):
    """Online expectation-maximisation for factor analysis (thesis Algorithm 2).

    Streams samples θ_t and keeps running averages θ̄, Ā = mean(d mᵀ), B̄ = mean(m mᵀ), d̄² = mean(d²),
    with d_t = θ_t − θ̄_t (the mean *after* including θ_t) and m_t the latent posterior mean (4.23).
    After warm-up, F = Ā H̄⁻¹ and ψ = d̄² − rowsum(F ⊙ Ā) with H̄ = Σ + B̄; they are derived on demand,
    so the state is D·K + 4·D numbers. Each update reads and writes that state once.

    Parameters
    ----------
    n_features : int
        D, the dimension of the samples (>= 2).
    n_components : int
        K, the number of latent factors, 1 <= K < D.
    n_warmup : int, default=100
        For the first ``n_warmup`` samples the running averages are updated while F and ψ keep their
        initial values (as in the thesis's experiments). Warm-up matters: d_1 = θ_1 − θ̄_1 = 0, so without
        it the first M-step gives Ā = 0, F = 0 and ψ = 0; ψ is then held at ``noise_floor`` and F = 0 is
        absorbing (every later m_t = 0). Use at least a few times K samples.
    init : array-like of shape (D, K), optional
        Initial loadings F₀, used as given. Default: Q of the reduced QR of a standard-normal D×K matrix
        drawn with ``seed`` (thesis §4.4), so FᵀF = I.
    seed : int, optional
        Seed for the default initialisation (None: fresh entropy).
    noise_floor : float, default=1e-10
        Lower bound on every ψ_d (absolute, in squared data units). It is only active for degenerate
        features (constant ones, or no warm-up); whenever it is not active the result equals the thesis
        algorithm. Raise it if your data are on a tiny scale.
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state. "float32" halves memory and traffic; K×K quantities and all sums
        stay float64. Inputs may then not exceed 1e18 in magnitude.
    whiten : bool, default=False
        Apply the whitening (parameter-expanded EM) step after each M-step: with R Rᵀ = H̄, F ← F R,
        Ā ← Ā R⁻ᵀ, H̄ ← I. Off by default, so the defaults are exactly Algorithm 2.
    schedule : {"harmonic", "power", "constant"}, default="harmonic"
        Step sizes of the running averages: ρ_t = 1/t (the thesis), ρ_t = (t + tau0)^(−kappa), or a
        constant ``rho``; every schedule is floored at 1/t, so ρ_1 = 1.
    tau0, kappa, rho : float
        Parameters of the "power" (tau0 >= 0, kappa in (0.5, 1]) and "constant" (rho in (0, 1]) schedules.

    Examples
    --------
    >>> import numpy as np, onlinefa
    >>> X = np.random.default_rng(0).standard_normal((500, 20))
    >>> em = onlinefa.OnlineEM(20, 3, seed=0).update(X)
    >>> em.loadings.shape, em.noise_variance.shape, em.n_seen
    ((20, 3), (20,), 500)
    """

    _core_class = _engine.OnlineEMCore

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        n_warmup: int = 100,
        init: ArrayLike | None = None,
        seed: int | None = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: str = "float64",
        whiten: bool = False,
        schedule: Schedule = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.75,
        rho: float = 0.01,
    ) -> None:
        args = _common_args(n_features, n_components, n_warmup, init, seed, noise_floor, dtype)
        self._n_features = args["n_features"]
        self._n_components = args["n_components"]
        self._core = _engine.OnlineEMCore(
            **args, whiten=bool(whiten), **_schedule_args(schedule, tau0, kappa, rho)
        )


class OnlineSGA(_StreamingModel):
    """Online stochastic gradient ascent for factor analysis (thesis Algorithm 1).

    For each sample: θ̄_t (running mean), d_t = θ_t − θ̄_t, the latent posterior (4.23), then one plain
    SGD step of size ``lr`` on F (4.24) and on β = log ψ (4.26), ψ = exp β. Each update reads and
    writes the D×K state once.

    Parameters
    ----------
    n_features : int
        D, the dimension of the samples (>= 2).
    n_components : int
        K, the number of latent factors, 1 <= K < D.
    lr : float, default=1e-3
        Learning rate (> 0).
    n_warmup : int, default=100
        For the first ``n_warmup`` samples only the running mean is updated and F and ψ stay at their
        initial values, so the first gradients use a mean estimated from more than one sample
        (d_1 = θ_1 − θ̄_1 = 0 carries no information).
    init : array-like of shape (D, K), optional
        Initial loadings; default: orthonormal (thesis §4.4) drawn with ``seed``.
    seed : int, optional
        Seed for the default initialisation.
    noise_floor : float, default=1e-10
        Lower bound on every ψ_d; when not active, the result equals the thesis algorithm.
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state (K×K quantities and sums stay float64).
    schedule, tau0, kappa, rho
        Step sizes of the running mean, as in :class:`OnlineEM`.
    """

    _core_class = _engine.OnlineSGACore

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        lr: float = 1e-3,
        n_warmup: int = 100,
        init: ArrayLike | None = None,
        seed: int | None = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: str = "float64",
        schedule: Schedule = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.75,
        rho: float = 0.01,
    ) -> None:
        args = _common_args(n_features, n_components, n_warmup, init, seed, noise_floor, dtype)
        self._n_features = args["n_features"]
        self._n_components = args["n_components"]
        self._core = _engine.OnlineSGACore(
            **args, lr=check_positive_float(lr, "lr"), **_schedule_args(schedule, tau0, kappa, rho)
        )
