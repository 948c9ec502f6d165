r"""SLANG, a baseline of the UCI benchmark: natural-gradient variational inference with a low-rank-plus-diagonal
precision, written from Mishkin, Kunstner, Nielsen, Schmidt & Khan, "SLANG: Fast Structured Covariance
Approximations for Bayesian Deep Learning with Natural Gradient" (NeurIPS 2018), Section 3 and Algorithm 1.

This is a baseline of the experiments, not a public API.

Model
-----
A one-hidden-layer ReLU network f(x; θ) (inputs -> ``n_hidden`` -> 1) with the D parameters θ flattened in the
order (first-layer weights, first-layer biases, output weights, output bias); the prior is N(0, diag(λ)⁻¹) with
λ = ``prior_precision`` (optionally another value for the biases) and the likelihood of one example is
Gaussian with precision τ = ``noise_precision``, so the per-example negative log-likelihood is

    ℓ_i(θ) = τ/2 (y_i − f(x_i; θ))² − ½ log τ + ½ log 2π.

The variational posterior is q(θ) = N(μ, Σ) with a low-rank-plus-diagonal precision

    Σ⁻¹ = U Uᵀ + diag(d),        U ∈ ℝ^{D×L},  d ∈ ℝ^D_{>0},

initialised with μ = the network's default PyTorch initialisation, U = 0 and d = ``init_precision``.

One step (Algorithm 1 of the paper)
-----------------------------------
With a minibatch B of M of the N training examples and S draws θ_s ~ q (S = ``n_mc_samples``):

1. **Sampling**, in O(D L²) from the low-rank-plus-diagonal precision without any D×D matrix (the paper's
   fast sampling does this with L×L factorisations; here with a thin SVD): with V = diag(d)^{-1/2} U and its
   thin SVD V = Q diag(s) Wᵀ (Q ∈ ℝ^{D×L}),

       θ_s = μ + diag(d)^{-1/2} (ε + Q diag((1 + s²)^{-1/2} − 1) Qᵀ ε),      ε ~ N(0, I_D),

   whose covariance is exactly diag(d)^{-1/2} (I + V Vᵀ)⁻¹ diag(d)^{-1/2} = (U Uᵀ + diag(d))⁻¹.
2. **Per-example gradients** g_{s,i} = ∇ℓ_i(θ_s) for i ∈ B (``torch.func``: ``vmap`` of ``grad`` of a
   ``functional_call``), collected as the columns of G ∈ ℝ^{D×MS}; with the scale c = N / (M S),

       ĝ = c Σ_{s,i} g_{s,i},                Ĝ = c G Gᵀ      (the empirical Fisher of the data term).

3. **Precision** (natural-gradient step on the precision with the empirical Fisher in place of the Hessian,
   step size β): the exact update Σ⁻¹ ← (1 − β) Σ⁻¹ + β (Ĝ + diag(λ)) is projected back onto the
   low-rank-plus-diagonal family. The low-rank part takes the top L eigen-pairs of

       A = (1 − β) U Uᵀ + β Ĝ = W Wᵀ,        W = [√(1−β) U, √(β c) G] ∈ ℝ^{D×(L+MS)},

   computed exactly through the small Gram matrix Wᵀ W = P diag(e) Pᵀ (eigenvalues in decreasing order):
   U ← W P_{:, 1..L}, so that U Uᵀ is the best rank-L approximation of A. (The paper finds these eigen-pairs
   with a randomised eigendecomposition; the Gram-matrix route gives the same subspace exactly and costs
   O(D (L + MS)²).) The diagonal keeps the diagonal of the exact update:

       d ← (1 − β) d + β λ + Δ,        Δ = diag(A) − diag(U_new U_newᵀ) ≥ 0,

   so diag(U_new U_newᵀ + diag(d_new)) = (1 − β) diag(U Uᵀ + diag(d)) + β (diag(Ĝ) + λ). Δ is non-negative in
   exact arithmetic (it is the diagonal of the discarded PSD part of A); round-off below zero is clipped.
4. **Mean** (natural-gradient step, step size α = ``learning_rate``), with the new precision:

       μ ← μ − α (U Uᵀ + diag(d))⁻¹ (ĝ + λ ⊙ μ),

   applied with the Woodbury identity, (U Uᵀ + diag d)⁻¹ v = d⁻¹ ⊙ v − d⁻¹ ⊙ U (I_L + Uᵀ diag(d)⁻¹ U)⁻¹
   Uᵀ (d⁻¹ ⊙ v), never forming a D×D matrix.

With L ≥ rank(A) nothing is discarded, Δ = 0, and the step is exactly the full-covariance Gaussian
natural-gradient VI step with the empirical Fisher (Khan et al., "Fast and Scalable Bayesian Deep Learning by
Weight-Perturbation in Adam", ICML 2018, the update SLANG approximates).

The paper's UCI experiments (its public code) use L = 1, minibatches of 10, 120 epochs, S = 4 training draws,
α = 0.01, β = α, an initial diagonal precision of 1, and an exponential moving average of ĝ with rate 0.9
(bias-corrected as in Adam) in place of ĝ in the mean step; these are the defaults of the optional
arguments here (``momentum=0`` gives Algorithm 1 as printed). That code also gives the biases a prior
precision of 1e-6 (``bias_prior_precision``) and picks λ and τ (τ in the target's original units) per split by
Bayesian optimisation on a 5-fold cross-validation of the training rows. The first step is the same with or without the
moving average, since its bias-corrected value is then ĝ itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

__all__ = ["SlangPosterior", "fit_slang", "n_parameters"]

FloatArray = npt.NDArray[np.float64]

_DTYPE = torch.float64

#: Defaults of the paper's UCI experiments (its public code): draws per step, mean-gradient moving average,
#: initial diagonal precision.
PAPER_N_MC_SAMPLES = 4
PAPER_MOMENTUM = 0.9
PAPER_INIT_PRECISION = 1.0


def n_parameters(n_inputs: int, n_hidden: int) -> int:
    """Number D of parameters of the one-hidden-layer network ``n_inputs -> n_hidden -> 1``."""
    return n_hidden * n_inputs + n_hidden + n_hidden + 1


def _shapes(n_inputs: int, n_hidden: int) -> list[tuple[str, tuple[int, ...]]]:
    """The network's parameters in the flattening order, as (name in the ``nn.Sequential``, shape)."""
    return [("0.weight", (n_hidden, n_inputs)), ("0.bias", (n_hidden,)),
            ("2.weight", (1, n_hidden)), ("2.bias", (1,))]


def _network(n_inputs: int, n_hidden: int, seed: int = 0) -> nn.Sequential:
    """The network with PyTorch's default initialisation drawn from ``seed`` (the global generator untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(n_inputs, n_hidden), nn.ReLU(), nn.Linear(n_hidden, 1)).to(_DTYPE)


def _unflatten(theta: Tensor, shapes: list[tuple[str, tuple[int, ...]]]) -> dict[str, Tensor]:
    params: dict[str, Tensor] = {}
    start = 0
    for name, shape in shapes:
        size = math.prod(shape)
        params[name] = theta[start:start + size].reshape(shape)
        start += size
    return params


def _bias_mask(n_inputs: int, n_hidden: int) -> Tensor:
    """True at the flat positions of the biases."""
    mask = torch.zeros(n_parameters(n_inputs, n_hidden), dtype=torch.bool)
    start = 0
    for name, shape in _shapes(n_inputs, n_hidden):
        size = math.prod(shape)
        if name.endswith("bias"):
            mask[start:start + size] = True
        start += size
    return mask


class _Net:
    """The network as a pure function of the flat parameter vector (``torch.func.functional_call``)."""

    def __init__(self, n_inputs: int, n_hidden: int) -> None:
        self.module = _network(n_inputs, n_hidden)
        self.shapes = _shapes(n_inputs, n_hidden)

    def forward(self, theta: Tensor, x: Tensor) -> Tensor:
        """Outputs, shape ``x.shape[:-1]``, of the network with flat parameters ``theta`` (shape (D,))."""
        out: Tensor = functional_call(self.module, _unflatten(theta, self.shapes), (x,))
        return out.squeeze(-1)

    def per_example_grads(self, thetas: Tensor, x: Tensor, y: Tensor, noise_precision: float) -> Tensor:
        """Gradients ∇ℓ_i(θ_s) of the per-example negative log-likelihoods, shape (S, M, D)."""

        def nll(theta: Tensor, x_i: Tensor, y_i: Tensor) -> Tensor:
            residual = y_i - self.forward(theta, x_i.unsqueeze(0)).squeeze(0)
            return 0.5 * noise_precision * residual * residual

        per_example = vmap(grad(nll), in_dims=(None, 0, 0))
        grads: Tensor = vmap(per_example, in_dims=(0, None, None))(thetas, x, y)
        return grads


def _sample(mean: Tensor, factor: Tensor, diag: Tensor, eps: Tensor) -> Tensor:
    """Draws μ + T ε with T Tᵀ = (U Uᵀ + diag d)⁻¹, for standard-normal ``eps`` of shape (S, D)."""
    inv_sqrt_d = diag.rsqrt()
    v = factor * inv_sqrt_d.unsqueeze(1)
    q, s, _ = torch.linalg.svd(v, full_matrices=False)
    shrink = (1.0 + s * s).rsqrt() - 1.0
    z = eps + ((eps @ q) * shrink) @ q.T
    draws: Tensor = mean + z * inv_sqrt_d
    return draws


def _woodbury_solve(factor: Tensor, diag: Tensor, v: Tensor) -> Tensor:
    """(U Uᵀ + diag d)⁻¹ v by the Woodbury identity (v of shape (D,))."""
    d_inv_v = v / diag
    d_inv_u = factor / diag.unsqueeze(1)
    inner = torch.eye(factor.shape[1], dtype=factor.dtype) + factor.T @ d_inv_u
    correction: Tensor = d_inv_u @ torch.linalg.solve(inner, factor.T @ d_inv_v)
    return d_inv_v - correction


@dataclass
class _State:
    """SLANG's variational parameters (μ, U, d) and the moving average of ĝ."""

    mean: Tensor
    factor: Tensor
    diag: Tensor
    grad_average: Tensor
    step: int = 0


def _update(state: _State, grads: Tensor, *, n_data: int, learning_rate: float, beta: float, momentum: float,
            prior: Tensor) -> _State:
    """One SLANG step (steps 2-4 of the module docstring) from the per-example gradients ``grads``.

    ``grads`` has shape (S, M, D) or (K, D): all S·M per-example gradients at the S draws of this step, so the
    scale is c = N / (S M) = ``n_data / K``.
    """
    rows = grads.reshape(-1, grads.shape[-1])
    scale = n_data / rows.shape[0]
    rank = state.factor.shape[1]
    g_hat = scale * rows.sum(dim=0)

    w = torch.cat([math.sqrt(1.0 - beta) * state.factor, math.sqrt(beta * scale) * rows.T], dim=1)
    evals, evecs = torch.linalg.eigh(w.T @ w)
    keep = min(rank, w.shape[1])
    top = evecs[:, evecs.shape[1] - keep:].flip(1)     # eigenvectors of the `keep` largest eigenvalues
    factor = torch.zeros_like(state.factor)
    factor[:, :keep] = w @ top
    correction = ((w * w).sum(dim=1) - (factor * factor).sum(dim=1)).clamp(min=0.0)
    diag = (1.0 - beta) * state.diag + beta * prior + correction

    step = state.step + 1
    grad_average = momentum * state.grad_average + (1.0 - momentum) * g_hat
    direction = grad_average / (1.0 - momentum ** step) + prior * state.mean
    mean = state.mean - learning_rate * _woodbury_solve(factor, diag, direction)
    return _State(mean=mean, factor=factor, diag=diag, grad_average=grad_average, step=step)


@dataclass(frozen=True)
class SlangPosterior:
    """SLANG's Gaussian posterior N(μ, (U Uᵀ + diag d)⁻¹) over the parameters of the one-hidden-layer network.

    Attributes
    ----------
    mean : ndarray of shape (D,)
        μ, flattened as (first-layer weights, first-layer biases, output weights, output bias).
    precision_factor : ndarray of shape (D, L)
        U.
    precision_diag : ndarray of shape (D,)
        d.
    n_inputs, n_hidden : int
        The network's sizes.
    """

    mean: FloatArray
    precision_factor: FloatArray
    precision_diag: FloatArray
    n_inputs: int
    n_hidden: int
    _net: _Net = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_net", _Net(self.n_inputs, self.n_hidden))

    def sample_parameters(self, n_samples: int, seed: int) -> FloatArray:
        """Draws of the flat parameter vector, shape (``n_samples``, D)."""
        _check_count("n_samples", n_samples)
        generator = torch.Generator().manual_seed(int(seed))
        eps = torch.randn(n_samples, self.mean.shape[0], generator=generator, dtype=_DTYPE)
        draws = _sample(torch.from_numpy(self.mean), torch.from_numpy(self.precision_factor),
                        torch.from_numpy(self.precision_diag), eps)
        out: FloatArray = draws.numpy()
        return out

    def predict_draws(self, x: npt.ArrayLike, n_samples: int, seed: int) -> FloatArray:
        """Network outputs for ``n_samples`` parameter draws from the posterior.

        Parameters
        ----------
        x : array of shape (n, n_inputs)
            Inputs (standardised as in training).
        n_samples : int
            Number of parameter draws.
        seed : int
            Seed of the draws.

        Returns
        -------
        ndarray of shape (n_samples, n)
            Outputs, in the (standardised) units of the training targets.
        """
        xt = torch.from_numpy(_check_x(x, self.n_inputs))
        thetas = torch.from_numpy(self.sample_parameters(n_samples, seed))
        with torch.no_grad():
            out: Tensor = vmap(self._net.forward, in_dims=(0, None))(thetas, xt)
        result: FloatArray = out.numpy()
        return result


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.floating)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def _check_x(x: npt.ArrayLike, n_inputs: int | None = None) -> FloatArray:
    arr = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"x must be a non-empty 2-D array, got shape {arr.shape}")
    if n_inputs is not None and arr.shape[1] != n_inputs:
        raise ValueError(f"x must have {n_inputs} columns, got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        raise ValueError("x must be finite")
    return arr


def fit_slang(x: npt.ArrayLike, y: npt.ArrayLike, *, n_hidden: int, prior_precision: float, noise_precision: float,
              rank: int, n_epochs: int, batch_size: int, learning_rate: float, seed: int,
              beta: float | None = None, momentum: float = PAPER_MOMENTUM,
              n_mc_samples: int = PAPER_N_MC_SAMPLES, init_precision: float = PAPER_INIT_PRECISION,
              bias_prior_precision: float | None = None) -> SlangPosterior:
    """Fit SLANG (module docstring) to a regression data set.

    Parameters
    ----------
    x : array of shape (N, n_inputs)
        Training inputs (standardised by the caller).
    y : array of shape (N,)
        Training targets (standardised by the caller).
    n_hidden : int
        Hidden ReLU units.
    prior_precision : float
        λ, the precision of the zero-mean Gaussian prior on every parameter.
    noise_precision : float
        τ, the precision of the Gaussian likelihood, in the units of ``y``.
    rank : int
        L, the rank of the low-rank part of the precision.
    n_epochs : int
        Passes over the data (each reshuffled; the last minibatch of a pass may be smaller).
    batch_size : int
        M, examples per minibatch.
    learning_rate : float
        α, the step size of the mean.
    seed : int
        Seeds the initial mean, the shuffling and the draws.
    beta : float, optional
        β ∈ (0, 1], the step size of the precision; defaults to ``learning_rate`` (the paper's UCI choice).
    momentum : float, default 0.9
        Rate of the bias-corrected moving average of ĝ used in the mean step (0: Algorithm 1 as printed).
    n_mc_samples : int, default 4
        S, posterior draws per step.
    init_precision : float, default 1.0
        Initial diagonal precision d (U starts at 0).
    bias_prior_precision : float, optional
        Prior precision of the biases; defaults to ``prior_precision``.

    Returns
    -------
    SlangPosterior

    Raises
    ------
    ValueError
        On bad input.
    FloatingPointError
        If the iterates stop being finite (a step size too large for the problem).
    """
    xa = _check_x(x)
    ya = np.ascontiguousarray(np.asarray(y, dtype=np.float64))
    if ya.ndim == 2 and ya.shape[1] == 1:
        ya = ya[:, 0]
    if ya.ndim != 1 or ya.shape[0] != xa.shape[0]:
        raise ValueError(f"y must have shape ({xa.shape[0]},), got {ya.shape}")
    if not np.isfinite(ya).all():
        raise ValueError("y must be finite")
    for name, count in (("n_hidden", n_hidden), ("rank", rank), ("n_epochs", n_epochs),
                        ("batch_size", batch_size), ("n_mc_samples", n_mc_samples)):
        _check_count(name, count)
    for name, value in (("prior_precision", prior_precision), ("noise_precision", noise_precision),
                        ("learning_rate", learning_rate), ("init_precision", init_precision)):
        _check_positive(name, value)
    if bias_prior_precision is not None:
        _check_positive("bias_prior_precision", bias_prior_precision)
    beta_value = learning_rate if beta is None else beta
    if not (isinstance(beta_value, (int, float)) and 0.0 < beta_value <= 1.0):
        raise ValueError(f"beta must lie in (0, 1], got {beta_value!r}")
    if not (isinstance(momentum, (int, float)) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must lie in [0, 1), got {momentum!r}")

    n_data, n_inputs = xa.shape
    dim = n_parameters(n_inputs, n_hidden)
    net = _Net(n_inputs, n_hidden)
    init = _network(n_inputs, n_hidden, int(seed))
    mean0 = torch.cat([init.state_dict()[name].reshape(-1) for name, _ in net.shapes]).to(_DTYPE)
    prior = torch.full((dim,), float(prior_precision), dtype=_DTYPE)
    if bias_prior_precision is not None:
        prior[_bias_mask(n_inputs, n_hidden)] = float(bias_prior_precision)
    state = _State(mean=mean0, factor=torch.zeros(dim, rank, dtype=_DTYPE),
                   diag=torch.full((dim,), float(init_precision), dtype=_DTYPE),
                   grad_average=torch.zeros(dim, dtype=_DTYPE))

    generator = torch.Generator().manual_seed(int(seed))
    xt, yt = torch.from_numpy(xa), torch.from_numpy(ya)
    for _ in range(n_epochs):
        order = torch.randperm(n_data, generator=generator)
        for start in range(0, n_data, batch_size):
            batch = order[start:start + batch_size]
            eps = torch.randn(n_mc_samples, dim, generator=generator, dtype=_DTYPE)
            thetas = _sample(state.mean, state.factor, state.diag, eps)
            grads = net.per_example_grads(thetas, xt[batch], yt[batch], float(noise_precision))
            state = _update(state, grads, n_data=n_data, learning_rate=float(learning_rate),
                            beta=float(beta_value), momentum=float(momentum), prior=prior)
        if not (torch.isfinite(state.mean).all() and torch.isfinite(state.factor).all()
                and torch.isfinite(state.diag).all()):
            raise FloatingPointError("SLANG diverged (non-finite mean or precision); reduce learning_rate")
    return SlangPosterior(mean=state.mean.numpy().copy(), precision_factor=state.factor.numpy().copy(),
                          precision_diag=state.diag.numpy().copy(), n_inputs=n_inputs, n_hidden=n_hidden)
