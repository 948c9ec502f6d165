"""Variational inference with a factor-analysis posterior: :class:`VIFA` (thesis §4.3, Algorithm 3).

VIFA learns q(θ) = N(c, F Fᵀ + Ψ) over the parameters θ of *any* differentiable model by stochastic
gradient descent on the negative ELBO, using only gradients ∇θ of the model's negative log-likelihood
that the caller computes with whatever framework it likes. The arithmetic (one pass over the D×K state
per step, no D×D matrix) runs in the Rust core; ``docs/design/vifa.md`` maps every term to the thesis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from typing_extensions import Self

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _core
from ._device import DeviceMovable
from ._persist import CheckpointMixin
from ._gaussian import FactorGaussianMixin
from ._validation import (
    NATIVE_FLOATS, as_numpy, check_dtype, check_init, check_int, check_positive_float, check_seed, core_readable,
    SeedLike, StateDTypeLike,
)

__all__ = ["VIFA"]

OptimizerName = Literal["sgd", "adam"]
FloatArray = NDArray[np.float64]


def _check_non_negative_float(value: object, name: str) -> float:
    """Return ``value`` as a finite float >= 0 (ValueError otherwise, TypeError if not a number)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (np.isfinite(out) and out >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return out


def _check_vector(value: ArrayLike | None, n_features: int, name: str) -> FloatArray | None:
    """Validate an optional real (D,) vector of finite values and return it as float64."""
    if value is None:
        return None
    arr = as_numpy(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real ({n_features},) array, got dtype {arr.dtype}")
    out = np.ascontiguousarray(arr, dtype=np.float64)
    if out.shape != (n_features,):
        raise ValueError(f"{name} has shape {out.shape}, expected ({n_features},)")
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{name} must contain only finite values")
    return out


def _check_optimizer(optimizer: object) -> str:
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    return str(optimizer)


def _as_gradients(grad: ArrayLike, n_rows: int, n_features: int) -> NDArray[Any]:
    """Return ``grad`` as an (n_rows, D) float32/float64 array, read in place when the core can (see
    :func:`~onlinefa._validation.core_readable`)."""
    arr = as_numpy(grad)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"grad must be a real numeric array, got dtype {arr.dtype}")
    if arr.dtype.newbyteorder("=") not in NATIVE_FLOATS:
        arr = arr.astype(np.float64)
    if arr.ndim == 1 and n_rows == 1:
        arr = arr.reshape(1, -1)
    if arr.shape != (n_rows, n_features):
        expected = f"({n_features},) or (1, {n_features})" if n_rows == 1 else f"({n_rows}, {n_features})"
        raise ValueError(
            f"grad must have shape {expected} (one row per pending draw), got shape {np.shape(grad)}"
        )
    return core_readable(arr)


#: η_c = AUTO_LR_MEAN · rms(c₀) for ``VIFA.from_gaussian(..., lr_mean="auto")`` (Adam).
AUTO_LR_MEAN = 0.01
#: η_F = AUTO_LR_LOADINGS · rms(c₀) for ``lr_loadings="auto"`` (Adam).
AUTO_LR_LOADINGS = 0.001
#: η_β for ``lr_log_noise="auto"`` (Adam).
AUTO_LR_LOG_NOISE = 0.01
#: ``from_gaussian`` raises ψ to at least this fraction of its mean.
_NOISE_FLOOR = 1e-8


def _gaussian_of(model: object) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(mean (D,), loadings (D, K), noise_variance (D,)) of a fitted onlinefa Gaussian, as float64 copies."""
    snapshot = getattr(model, "snapshot", None)
    if callable(snapshot):
        parts = snapshot()
    elif all(hasattr(model, a) for a in ("mean", "loadings", "noise_variance")):
        parts = (getattr(model, "mean"), getattr(model, "loadings"), getattr(model, "noise_variance"))
    elif all(hasattr(model, a) for a in ("mean_", "components_", "noise_variance_")):
        parts = (getattr(model, "mean_"), np.asarray(getattr(model, "components_")).T, getattr(model, "noise_variance_"))
    else:
        raise TypeError(f"{type(model).__name__} has no Gaussian (mean, loadings, noise_variance)")
    if not (isinstance(parts, tuple) and len(parts) == 3):
        raise TypeError(f"{type(model).__name__}.snapshot() does not return (mean, loadings, noise_variance)")
    mean, loadings, noise = (np.array(as_numpy(p), dtype=np.float64) for p in parts)
    d = mean.shape[0] if mean.ndim == 1 else -1
    if mean.ndim != 1 or loadings.ndim != 2 or loadings.shape[0] != d or noise.shape != (d,):
        raise ValueError(
            f"inconsistent Gaussian: mean {mean.shape}, loadings {loadings.shape}, noise_variance {noise.shape}"
        )
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(loadings)) and np.all(np.isfinite(noise))):
        raise ValueError("the Gaussian has non-finite values")
    if np.any(noise < 0.0):
        raise ValueError("the Gaussian has negative noise variances")
    return mean, loadings, noise


class VIFA(DeviceMovable, CheckpointMixin, FactorGaussianMixin):
    """Variational inference with a factor-analysis posterior (thesis Algorithm 3).

    Fits q(θ) = N(c, F Fᵀ + Ψ) (c: ``mean``, F: ``loadings`` D×K, ψ = diag Ψ: ``noise_variance``) to the
    posterior p(θ | D) ∝ exp(−NLL(θ)) · N(θ; 0, α⁻¹ I) by minimising the negative ELBO
    E_q[log q] − E_q[log p(θ)] + E_q[NLL(θ)] with reparameterised stochastic gradients. ψ is optimised
    as β = log ψ. One training iteration is::

        theta = vi.sample()               # θ = F h + c + ψ^{1/2} ⊙ z (4.50); the draw is remembered
        vi.step(nll_gradient(theta))      # ∇θ of the FULL-DATA negative log-likelihood at θ

    **Gradient convention.** ``step`` expects the gradient of the negative log-likelihood of the *whole*
    data set, NLL(θ) = −Σ_{n=1}^{N} log p(y_n | x_n, θ), or an unbiased estimate of it: with a mini-batch
    of M examples, **the mini-batch mean of the per-example gradients times N** (equivalently, the
    mini-batch sum times N/M). It is the gradient of the *negative* log-likelihood (what
    ``loss.backward()`` gives for a loss to minimise), not of the log-likelihood. The prior and entropy
    terms are added by VIFA unscaled, so only this convention gives the Bayesian posterior; thesis
    Algorithm 3 line 8 writes a plain mini-batch mean, which targets the posterior of a data set of size 1
    with the likelihood of the average example (a posterior N times too wide when the prior is weak).

    **Several draws per step.** With ``n_grad_samples = L``, call :meth:`sample` L times, then
    :meth:`step` once with the L gradients stacked as an (L, D) array, row l for the l-th draw; the step
    averages the L reparameterised gradient estimates (thesis code: ``n_gradients_per_update``).

    **sample() vs sample(n).** ``sample()`` without arguments is the *training* draw above. With any
    argument, ``sample(n_samples, seed=None)`` returns ``n_samples`` independent draws from the current
    q as an (n_samples, D) array, exactly like ``OnlineEM.sample``: nothing is remembered, and neither the
    training random stream nor a pending step is affected.

    Parameters
    ----------
    n_features : int
        D, the number of parameters θ of the model (>= 1).
    n_components : int
        K, the number of factors, 1 <= K <= D.
    prior_precision : float
        α >= 0, precision of the prior N(0, α⁻¹ I) (0: a flat prior).
    lr_mean, lr_loadings, lr_log_noise : float
        Learning rates η_c, η_F, η_β of c, F and β = log ψ (finite, >= 0; 0 freezes that group).
        They can be changed between steps with :meth:`set_learning_rates` (schedules).
    optimizer : {"sgd", "adam"}, default="sgd"
        "sgd": p ← p − η g (Algorithm 3, lines 17–19). "adam": Adam with bias correction, β₁ = 0.9,
        β₂ = 0.999, ε = 1e-8, separate moment estimates for every entry of c, F and β.
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
        Seed of the training draws (and of the default initial F). None: fresh entropy. The random stream
        is part of the state, so a checkpoint resumes the same draws. A ``Generator`` gives one draw
        ``int(seed.integers(0, 2**63 - 1))`` (and so advances); a ``SeedSequence`` its first 64-bit word.
    init : array-like of shape (D, K), optional
        Initial F. Default: Q of the reduced QR of a standard-normal D×K matrix drawn with ``seed``
        (thesis §4.4), so FᵀF = I.
    n_grad_samples : int, default=1
        L, the draws (and gradients) averaged per step.
    clip_grad_norm : float, optional
        If given, each parameter group's gradient (c, F and β separately, after averaging over the L
        draws) is rescaled to Euclidean norm at most this value before the optimiser uses it — the
        clipping of the thesis's code. Costs one extra read-only pass per step.
    init_mean : array-like of shape (D,), optional
        Initial c (default 0, Algorithm 3 line 1), e.g. pre-trained weights.
    init_noise_variance : array-like of shape (D,), optional
        Initial ψ (> 0; default 1, line 1).
    dtype : {"float64", "float32"}, default="float64"
        Storage of the D-sized state (c, F, β and Adam's moments); K×K algebra and sums stay float64.
        dtype objects are accepted as for :class:`onlinefa.OnlineEM`.
    device : str or torch.device, optional
        Where c, F, β and Adam's moments live. None (the default): in the Rust core, with NumPy arrays in and
        out. Any torch device (``"cuda:0"``, ``"cpu"``, ...): in torch tensors there, with the training draws and
        gradients as tensors on that device and the K×K algebra in float64 on the CPU (needs PyTorch). Both are
        this class with the same checkpoints; :meth:`to` moves a model between them. The device model's draws
        come from torch generators keyed by (seed, draw index): the same distribution, another random stream.

    Raises
    ------
    ValueError
        A hyper-parameter out of range or an array of the wrong shape or with non-finite values.
    TypeError
        A hyper-parameter of the wrong type.

    Examples
    --------
    A Gaussian "likelihood" NLL(θ) = ½ (θ − μ)ᵀ A (θ − μ) with a flat prior: q approaches N(μ, A⁻¹).

    >>> import numpy as np, onlinefa
    >>> mu, precision = np.array([1.0, -2.0, 0.5]), np.diag([4.0, 1.0, 0.25])
    >>> vi = onlinefa.VIFA(3, 2, prior_precision=0.0, lr_mean=1e-2, lr_loadings=1e-2,
    ...                    lr_log_noise=1e-2, optimizer="adam", seed=0)
    >>> for _ in range(3000):
    ...     theta = vi.sample()
    ...     _ = vi.step(precision @ (theta - mu))
    >>> bool(np.allclose(vi.mean, mu, atol=0.2))
    True
    """

    _device_impl = "onlinefa.torch._vifa_model:VIFA"

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        prior_precision: float,
        lr_mean: float,
        lr_loadings: float,
        lr_log_noise: float,
        optimizer: OptimizerName = "sgd",
        seed: SeedLike = None,
        init: ArrayLike | None = None,
        n_grad_samples: int = 1,
        clip_grad_norm: float | None = None,
        init_mean: ArrayLike | None = None,
        init_noise_variance: ArrayLike | None = None,
        dtype: StateDTypeLike = "float64",
        device: Any = None,
    ) -> None:
        d = check_int(n_features, "n_features", 1)
        k = check_int(n_components, "n_components", 1)
        if k > d:
            raise ValueError(f"n_components must be <= n_features = {d}, got {k}")
        noise = _check_vector(init_noise_variance, d, "init_noise_variance")
        if noise is not None and not np.all(noise > 0.0):
            raise ValueError("init_noise_variance must contain only values > 0")
        self._core = _core.VIFACore(
            d,
            k,
            init=check_init(init, d, k),
            init_mean=_check_vector(init_mean, d, "init_mean"),
            init_noise_variance=noise,
            seed=check_seed(seed),
            prior_precision=_check_non_negative_float(prior_precision, "prior_precision"),
            lr_mean=_check_non_negative_float(lr_mean, "lr_mean"),
            lr_loadings=_check_non_negative_float(lr_loadings, "lr_loadings"),
            lr_log_noise=_check_non_negative_float(lr_log_noise, "lr_log_noise"),
            optimizer=_check_optimizer(optimizer),
            n_grad_samples=check_int(n_grad_samples, "n_grad_samples", 1),
            clip_grad_norm=None if clip_grad_norm is None else check_positive_float(clip_grad_norm, "clip_grad_norm"),
            dtype=check_dtype(dtype),
        )
        self._n_features = d
        self._n_components = k
        self._n_grad_samples = int(n_grad_samples)

    @classmethod
    def from_gaussian(
        cls,
        model: object,
        *,
        prior_precision: float,
        lr_mean: float | Literal["auto"] = "auto",
        lr_loadings: float | Literal["auto"] = "auto",
        lr_log_noise: float | Literal["auto"] = "auto",
        optimizer: OptimizerName = "adam",
        seed: SeedLike = None,
        n_grad_samples: int = 1,
        clip_grad_norm: float | None = None,
        dtype: StateDTypeLike = "float64",
        device: Any = None,
    ) -> Self:
        """Start VIFA from a fitted Gaussian N(c, F Fᵀ + diag ψ), with scale-aware learning rates.

        q starts at the mean, loadings and noise variance of ``model`` (K = the width of its loadings),
        so a streaming fit over SGD iterates (SWAG-FA: :class:`onlinefa.OnlineEM` or
        :class:`onlinefa.OnlineSGA` fed by :class:`onlinefa.torch.SnapshotCollector`, or
        :class:`onlinefa.torch.SWAG`) is refined by the ELBO without passing ``init``, ``init_mean`` and
        ``init_noise_variance`` by hand. Entries of ψ below 1e-8 × mean(ψ) (e.g. parameters that SGD
        never moved) are raised to that floor, since β = log ψ must be finite.

        Parameters
        ----------
        model : object
            Any onlinefa Gaussian: a model with ``snapshot()`` returning (mean, loadings, noise_variance)
            (``OnlineEM``, ``OnlineSGA``, ``VIFA``, …), or with the properties ``mean``, ``loadings``
            (D×K) and ``noise_variance`` (``SWAG``), or with the fitted attributes ``mean_``,
            ``components_`` (K×D) and ``noise_variance_``.
        prior_precision : float
            α >= 0, as in :class:`VIFA`.
        lr_mean, lr_loadings, lr_log_noise : float or "auto", default="auto"
            Learning rates as in :class:`VIFA`. ``"auto"`` (for ``optimizer="adam"`` only) scales the
            rates with the size of the start's parameters, r = sqrt(mean c₀²): η_c = 0.01 r and
            η_F = 0.001 r (an Adam step moves a parameter by about 1 % of a typical weight, the loadings
            ten times slower), and η_β = 0.01 (β is already on a log scale). Chosen by measurement on
            small UCI regression networks (``docs/design/vifa.md``, "A VIFA you can run"). The spread of the
            start, sqrt ψ₀, is deliberately not used: a fit to SGD iterates is typically far narrower
            than the posterior (sqrt ψ₀ ≈ 1e-4 there), so rates proportional to it barely move q.
        optimizer : {"sgd", "adam"}, default="adam"
        seed, n_grad_samples, clip_grad_norm, dtype, device
            As in :class:`VIFA` (``model`` may hold tensors on any device).

        Returns
        -------
        VIFA

        Raises
        ------
        TypeError
            ``model`` has no Gaussian.
        ValueError
            Inconsistent shapes, non-finite values, a start without loadings (K = 0), ψ that is zero
            everywhere, or ``"auto"`` rates with ``optimizer="sgd"`` (SGD rates depend on the gradient
            scale, which the start does not tell).
        """
        mean, loadings, noise = _gaussian_of(model)
        if loadings.shape[1] == 0:
            raise ValueError("the Gaussian has no loadings (K = 0, e.g. SWAG-diagonal or SWAG with < 2 snapshots)")
        scale = float(np.mean(noise))
        size = float(np.sqrt(np.mean(mean**2)))
        if not scale > 0.0:
            raise ValueError("the Gaussian's noise variance is zero everywhere; VIFA needs ψ > 0")
        noise = np.maximum(noise, _NOISE_FLOOR * scale)
        opt = _check_optimizer(optimizer)
        rates = {"lr_mean": lr_mean, "lr_loadings": lr_loadings, "lr_log_noise": lr_log_noise}
        if any(isinstance(v, str) for v in rates.values()) and opt != "adam":
            raise ValueError("learning rates 'auto' need optimizer='adam'; give the SGD rates explicitly")
        resolved: dict[str, float] = {}
        for name, value in rates.items():
            if isinstance(value, str):
                if value != "auto":
                    raise ValueError(f"{name} must be a float or 'auto', got {value!r}")
                if name != "lr_log_noise" and not size > 0.0:
                    raise ValueError(f"{name}='auto' scales with the start's mean, which is zero; give the rate")
                factor = {"lr_mean": AUTO_LR_MEAN, "lr_loadings": AUTO_LR_LOADINGS}.get(name)
                resolved[name] = AUTO_LR_LOG_NOISE if factor is None else factor * size
            else:
                resolved[name] = _check_non_negative_float(value, name)
        return cls(
            mean.shape[0], loadings.shape[1], prior_precision=prior_precision, optimizer=opt,  # type: ignore[arg-type]
            seed=seed, init=loadings, init_mean=mean, init_noise_variance=noise, n_grad_samples=n_grad_samples,
            clip_grad_norm=clip_grad_norm, dtype=dtype, device=device, **resolved,
        )

    # -- training --------------------------------------------------------------------------------
    def sample(
        self, n_samples: int | None = None, seed: SeedLike = None, *, dtype: DTypeLike = np.float64
    ) -> NDArray[Any]:
        """Training draw (no arguments), or ``n_samples`` model draws (any argument).

        Parameters
        ----------
        n_samples : int, optional
            Omitted (and ``seed`` omitted): draw θ = F h + c + ψ^{1/2} ⊙ z (4.50) from the training
            stream, remember (h, z) for :meth:`step`, and return θ with shape (D,). Given: return
            ``n_samples`` independent draws from q with shape (n_samples, D); nothing is remembered.
        seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
            Seed of the model draws (as in ``OnlineEM.sample``); giving it alone means ``n_samples=1``.
        dtype : {float64, float32}, default=float64
            dtype of model draws (as in ``OnlineEM.sample``); the training draw is always float64.

        Returns
        -------
        ndarray
            (D,) for the training draw, (n_samples, D) for model draws.

        Raises
        ------
        RuntimeError
            A training draw while ``n_grad_samples`` draws are already waiting for :meth:`step`.
        """
        if n_samples is None and seed is None:
            return self._core.sample()
        return super().sample(1 if n_samples is None else n_samples, seed, dtype=dtype)

    def step(self, grad: ArrayLike) -> Self:
        """Apply one optimiser step to c, F and β (Algorithm 3, lines 9–20).

        Parameters
        ----------
        grad : array-like of shape (D,) or (L, D)
            ∇θ of the negative log-likelihood of the **whole data set** at each pending draw (mini-batch
            mean of per-example gradients × N for an unbiased estimate), row l for the l-th draw since
            the last step; L = ``n_grad_samples`` (a 1-D array is accepted when L = 1). float32/float64
            arrays are read in place.

        Returns
        -------
        self

        Raises
        ------
        RuntimeError
            Fewer than ``n_grad_samples`` draws are pending (call :meth:`sample` first).
        ValueError
            Wrong shape, or a NaN/±Inf (or a magnitude above 1e100 for float64 state, 1e18 for float32)
            in ``grad``: nothing changes. Also if the step makes a parameter non-finite (divergence:
            learning rates too large); the model is then unusable — restore a checkpoint.
        TypeError
            Non-numeric or complex input.
        """
        self._core.step(_as_gradients(grad, self.n_grad_samples, self._n_features))
        return self

    def fit(self, nll_gradient: Callable[[FloatArray], ArrayLike], n_steps: int) -> Self:
        """Run ``n_steps`` training iterations with a gradient function.

        Parameters
        ----------
        nll_gradient : callable
            θ (D,) → ∇θ of the full-data negative log-likelihood (or its unbiased mini-batch estimate),
            shape (D,). Called ``n_grad_samples`` times per step.
        n_steps : int
            Number of optimiser steps (>= 0).

        Returns
        -------
        self
        """
        for _ in range(check_int(n_steps, "n_steps", 0)):
            grads = [np.asarray(nll_gradient(self.sample()), dtype=np.float64) for _ in range(self.n_grad_samples)]
            self.step(np.stack(grads))
        return self

    def set_learning_rates(
        self, *, lr_mean: float | None = None, lr_loadings: float | None = None, lr_log_noise: float | None = None
    ) -> Self:
        """Change any of η_c, η_F, η_β (finite, >= 0) for the following steps, e.g. for a schedule.

        Returns
        -------
        self
        """
        current = self.learning_rates
        new = [
            current[i] if value is None else _check_non_negative_float(value, name)
            for i, (name, value) in enumerate(
                (("lr_mean", lr_mean), ("lr_loadings", lr_loadings), ("lr_log_noise", lr_log_noise))
            )
        ]
        self._core.set_learning_rates(*new)
        return self

    def set_prior_precision(self, prior_precision: float) -> Self:
        """Change α, the precision of the prior N(0, α⁻¹ I), for the following steps (finite, >= 0).

        Returns
        -------
        self
        """
        self._core.set_prior_precision(_check_non_negative_float(prior_precision, "prior_precision"))
        return self

    def optimal_prior_precision(self) -> float:
        """The α that maximises the ELBO for the current q (empirical Bayes, type-II maximum likelihood).

        α enters the ELBO only through −KL(q ‖ N(0, α⁻¹ I)) =
        −½ [α (‖c‖² + ‖F‖²_F + Σ_d ψ_d) − D log α − log det(F Fᵀ + Ψ) − D], whose derivative in α vanishes
        at α* = D / (‖c‖² + ‖F‖²_F + Σ_d ψ_d) = D / E_q[‖θ‖²] (MacKay's update for an isotropic Gaussian
        prior). Alternating VIFA steps with ``set_prior_precision(optimal_prior_precision())`` is coordinate
        ascent on one ELBO, so the prior is learned from the data rather than set by hand
        (:func:`onlinefa.torch.vifa_regression_step` does it with ``learn_prior_precision=True``). Reads
        one :meth:`snapshot` of q.

        Returns
        -------
        float
            α* (> 0).
        """
        mean, loadings, noise_variance = self.snapshot()
        second_moment = float(mean @ mean) + float(np.einsum("ij,ij->", loadings, loadings)) + float(noise_variance.sum())
        return self.n_features / second_moment

    def pending_noise(self) -> tuple[FloatArray, FloatArray]:
        """The reparameterisation noise of the draws waiting for :meth:`step`.

        Returns
        -------
        h : ndarray of shape (n_pending, K)
        z : ndarray of shape (n_pending, D)
            Draw l was θ_l = F h_l + c + ψ^{1/2} ⊙ z_l (4.50) at the current parameters.
        """
        return self._core.pending_noise()

    # -- state -----------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        """D, the dimension of θ."""
        return self._n_features

    @property
    def n_components(self) -> int:
        """K, the number of factors."""
        return self._n_components

    @property
    def mean(self) -> FloatArray:
        """Variational mean c, shape (D,)."""
        return self._core.mean()

    @property
    def loadings(self) -> FloatArray:
        """Factor loading matrix F, shape (D, K)."""
        return self._core.loadings()

    @property
    def noise_variance(self) -> FloatArray:
        """Diagonal variances ψ = exp β, shape (D,)."""
        return self._core.noise_variance()

    def snapshot(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(mean, loadings, noise_variance) read together under the model's lock: one consistent state even
        while another thread runs :meth:`step`."""
        return self._core.snapshot()

    def _params(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        return self.snapshot()

    def _query_engine(self) -> Any:
        return self._core

    @property
    def log_noise_variance(self) -> FloatArray:
        """β = log ψ, the parameter the optimiser updates, shape (D,)."""
        return self._core.log_noise_variance()

    @property
    def n_steps(self) -> int:
        """Optimiser steps applied so far."""
        return self._core.n_steps

    @property
    def n_pending(self) -> int:
        """Training draws waiting for :meth:`step`."""
        return self._core.n_pending

    @property
    def n_grad_samples(self) -> int:
        """L, the draws averaged per step."""
        return self._n_grad_samples

    @property
    def prior_precision(self) -> float:
        """α, the precision of the prior N(0, α⁻¹ I)."""
        return float(self._core.hyper_parameters()["prior_precision"])

    @property
    def learning_rates(self) -> tuple[float, float, float]:
        """(η_c, η_F, η_β) used by the next step."""
        params = self._core.hyper_parameters()
        return float(params["lr_mean"]), float(params["lr_loadings"]), float(params["lr_log_noise"])

    @property
    def optimizer(self) -> str:
        """"sgd" or "adam"."""
        return str(self._core.hyper_parameters()["optimizer"])

    @property
    def clip_grad_norm(self) -> float | None:
        """The per-group gradient-norm bound, or None."""
        value = self._core.hyper_parameters()["clip_grad_norm"]
        return None if value is None else float(value)

    @property
    def seed(self) -> int:
        """Seed of the training draws (the one drawn from entropy if none was given)."""
        return int(self._core.hyper_parameters()["seed"])

    @property
    def dtype(self) -> str:
        """Storage dtype of the D-sized state, "float32" or "float64"."""
        return self._core.dtype

    # -- checkpoints -----------------------------------------------------------------------------
    def _restore(self, state: dict[str, Any]) -> None:
        self._core = _core.VIFACore.from_state(state)
        self._n_features = int(state["n_features"])
        self._n_components = int(state["n_components"])
        self._n_grad_samples = int(state["n_grad_samples"])

    def __repr__(self) -> str:
        return (
            f"VIFA(n_features={self._n_features}, n_components={self._n_components}, "
            f"optimizer={self.optimizer!r}, n_steps={self.n_steps}, dtype={self.dtype!r})"
        )
