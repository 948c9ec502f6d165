"""Chunked posterior draws θ ~ N(c, scale·(F Fᵀ + diag ψ)) as tensors: :func:`sample_parameters`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from .._gaussian import FactorGaussianMixin
from .._validation import SeedLike, check_int, check_positive_float, check_seed
from ._params import check_float_dtype
from ._posterior import MultiSWAG, gaussian_for_draws

__all__ = ["sample_parameters"]

#: (c float64, F float32 or float64, ψ float64) of one Gaussian to draw from.
Gaussian = tuple[NDArray[np.float64], NDArray[Any], NDArray[np.float64]]


def check_scale(scale: object) -> float:
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    value = float(scale)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"scale must be finite and >= 0, got {scale}")
    return value


def check_temperature(temperature: object) -> float:
    """A softmax temperature: a real number, finite and > 0."""
    return check_positive_float(temperature, "temperature")


def component_seeds(seed: int | None, n_components: int) -> list[int | None]:
    """Independent seeds of the mixture components, derived from ``seed`` by ``numpy.random.SeedSequence``."""
    if seed is None:
        return [None] * n_components
    children = np.random.SeedSequence(seed).spawn(n_components)
    return [int(child.generate_state(1, np.uint64)[0]) for child in children]


def _draw_engine(posterior: object) -> Any:
    """The Rust engine that draws from ``posterior`` in place while streaming over its state (so no copy of F
    is made), or None for models without one (those are drawn from their (c, F, ψ) arrays)."""
    if not isinstance(posterior, FactorGaussianMixin):
        return None
    return posterior._query_engine()  # raises NotFittedError for a model that cannot answer yet


def _state_version(posterior: object) -> int | None:
    """A counter that changes whenever the model's Gaussian does (samples seen, or optimiser steps)."""
    for name in ("n_seen", "n_steps"):
        value = getattr(posterior, name, None)
        if isinstance(value, int):
            return value
    return None


class _Plan:
    """What to draw: (posterior, number of draws, seed) per mixture component, Gaussians read lazily."""

    def __init__(self, posterior: object, n_samples: int, seed: int | None, loadings_dtype: Any,
                 on_host: bool) -> None:
        self.loadings_dtype = loadings_dtype  #: np.float32 or np.float64: F is read in the draws' compute dtype
        self.on_host = on_host  #: draws onto the CPU, where a model's engine can write them
        self.first: Gaussian | None = None
        if isinstance(posterior, MultiSWAG):
            counts = posterior.split(n_samples)
            self.parts = list(zip(posterior.components, counts, component_seeds(seed, len(posterior))))
        else:
            if not on_host or _draw_engine(posterior) is None:  # fail now, not at the first next()
                self.first = gaussian_for_draws(posterior, loadings_dtype)
            self.parts = [(posterior, n_samples, seed)]


def sample_parameters(
    posterior: object,
    n_samples: int,
    *,
    scale: float = 1.0,
    seed: SeedLike = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    chunk_size: int = 8,
) -> Iterator[torch.Tensor]:
    """Draw parameter vectors θ = c + √scale · (F h + ψ^{1/2} ⊙ z), h ~ N(0, I_K), z ~ N(0, I_D), in chunks.

    No D×D matrix and never all draws at once. Draw i uses the i-th block of K + D standard normals of one
    ``torch.Generator``, and the draws are made eight at a time, so for a given seed they are bit-identical
    whatever ``chunk_size``.

    - A model with a Rust engine (``OnlineEM``, ``OnlineSGA``, ``VIFA`` without ``device``) drawn onto the
      CPU writes each block of eight draws in place over its normals, streaming over its own state
      (θ = c + F h + ψ^{1/2} ⊙ z in float64, rounded once to ``dtype``): memory O((chunk_size + 8)·D), no copy
      of F. Its state must not change while the draws are read (flush a ``SnapshotCollector`` first).
    - Other posteriors and other devices read (c, F, ψ) once and draw by a
      matrix product of a fixed shape (eight rows, so a row's rounding never depends on the chunking):
      memory O((chunk_size + 8)·D + D·K).

    Parameters
    ----------
    posterior : model or MultiSWAG
        Any onlinefa model with a Gaussian (OnlineEM, OnlineSGA, VIFA, VBFA, OnlineVBFA,
        OnlineFactorAnalysis, SWAG), or a :class:`MultiSWAG` mixture, whose draws are split evenly across
        its components (component m gets ``n // M`` draws, one more if ``m < n % M``; component 0's first;
        component seeds derived from ``seed`` by ``numpy.random.SeedSequence.spawn``).
    n_samples : int
        Number of draws (>= 0).
    scale : float, default=1.0
        Multiplies the covariance (>= 0); SWAG's sampling "scale = 0.5" is ``scale=0.5``.
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
        Seed in [0, 2**64) of the draws (a Generator gives one integer draw, a SeedSequence its first
        64-bit word); None: fresh entropy.
    dtype : torch.dtype, default=torch.float32
        Dtype of the draws (computed in float64 when ``dtype`` is float64, else in float32).
    device : str or torch.device, default="cpu"
        Where the generator, the Gaussian and the draws live (the draws depend on the device's generator).
    chunk_size : int, default=8
        Largest number of rows per yielded tensor (>= 1).

    Yields
    ------
    torch.Tensor of shape (m, D), m <= chunk_size
        Fresh tensors (never reused); a mixture yields each component's chunks separately.

    Raises
    ------
    TypeError, ValueError
        Invalid arguments or a posterior without a usable Gaussian (raised by this call, not by the
        iteration).
    RuntimeError
        From the iteration: a model drawn by its engine was updated between two blocks of draws.

    Examples
    --------
    >>> import numpy as np, onlinefa, torch
    >>> em = onlinefa.OnlineEM(5, 2, seed=0).update(np.random.default_rng(0).standard_normal((200, 5)))
    >>> draws = torch.cat(list(sample_parameters(em, 10, seed=1, chunk_size=3)))
    >>> draws.shape
    torch.Size([10, 5])
    >>> bool(torch.equal(draws, torch.cat(list(sample_parameters(em, 10, seed=1, chunk_size=10)))))
    True
    """
    n = check_int(n_samples, "n_samples", 0)
    draw_dtype = check_float_dtype(dtype)
    target = torch.device(device)
    plan = _Plan(posterior, n, check_seed(seed), np.float64 if draw_dtype == torch.float64 else np.float32,
                 target.type == "cpu")
    return _draw_plan(
        plan,
        scale=check_scale(scale),
        dtype=draw_dtype,
        device=target,
        chunk_size=check_int(chunk_size, "chunk_size", 1),
    )


def _draw_plan(
    plan: _Plan, *, scale: float, dtype: torch.dtype, device: torch.device, chunk_size: int
) -> Iterator[torch.Tensor]:
    for posterior, count, seed in plan.parts:
        if count == 0:
            continue
        engine = _draw_engine(posterior) if plan.first is None and plan.on_host else None
        if engine is not None:
            yield from _rechunk(_engine_blocks(posterior, engine, count, seed, scale, dtype), count, chunk_size, dtype)
            continue
        gaussian = plan.first if plan.first is not None else gaussian_for_draws(posterior, plan.loadings_dtype)
        plan.first = None  # release the arrays once they are on the device
        yield from _draw_gaussian(gaussian, count, seed, scale, dtype, device, chunk_size)


#: Draws per product with F: every product has this fixed shape (the last block is padded with zero rows),
#: so a draw's rounding never depends on how many draws share its product. A BLAS rounds a row of
#: ``addmm`` differently for different row counts, so chunks of varying size would differ in the last bit.
_PRODUCT_ROWS = 8


def _engine_blocks(posterior: object, engine: Any, n_samples: int, seed: int | None, scale: float,
                   dtype: torch.dtype) -> Iterator[torch.Tensor]:
    """The draws of :func:`_draw_blocks` (the same normals of the same generator), each block of
    ``_PRODUCT_ROWS`` written in place over its noise by the model's engine in one pass over its state
    (θ = c + F h + ψ^{1/2} ⊙ z in float64, rounded once), so no copy of F is made; then
    θ ← c + √scale · (θ − c) in float64 when scale ≠ 1."""
    n_features, n_components = int(getattr(posterior, "n_features")), int(getattr(posterior, "n_components"))
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    written = compute if scale == 1.0 else torch.float64
    mean = None if scale == 1.0 else torch.as_tensor(np.asarray(getattr(posterior, "mean"), dtype=np.float64))
    generator = _generator(seed, torch.device("cpu"))
    version = _state_version(posterior)
    noise = torch.empty(n_components + n_features, dtype=compute)
    for start in range(0, n_samples, _PRODUCT_ROWS):
        rows = min(_PRODUCT_ROWS, n_samples - start)
        latent = np.empty((rows, n_components))
        draws = torch.empty((rows, n_features), dtype=written)
        for row in range(rows):  # one block of K + D normals per draw, as _draw_blocks draws them
            torch.randn(n_components + n_features, generator=generator, out=noise)
            latent[row] = noise[:n_components].numpy()
            draws[row] = noise[n_components:]
        engine.draw_into(latent, draws.numpy())  # one consistent state, read under the model's lock
        if _state_version(posterior) != version:
            raise RuntimeError(f"the {type(posterior).__name__} changed while its draws were read (an update ran "
                               "between two blocks of draws): flush the collector before drawing")
        if mean is not None:
            draws.sub_(mean).mul_(math.sqrt(scale)).add_(mean)
        yield draws
        del draws  # the consumer may keep it; this frame no longer needs it while the next block is made


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _draw_gaussian(
    gaussian: Gaussian,
    n_samples: int,
    seed: int | None,
    scale: float,
    dtype: torch.dtype,
    device: torch.device,
    chunk_size: int,
) -> Iterator[torch.Tensor]:
    blocks = _draw_blocks(gaussian, n_samples, seed, scale, device, dtype)
    yield from _rechunk(blocks, n_samples, chunk_size, dtype)


def _tensor(values: NDArray[Any], compute: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a ``compute`` tensor on ``device``: the array itself on the CPU when it is writable and of that
    dtype, else one converted copy (torch shares no read-only array, such as a model's cached snapshot)."""
    array = np.asarray(values, dtype=np.float64 if compute == torch.float64 else np.float32)
    if not array.flags.writeable:
        array = array.copy()
    return torch.as_tensor(array, device=device)


def _draw_blocks(
    gaussian: Gaussian,
    n_samples: int,
    seed: int | None,
    scale: float,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[torch.Tensor]:
    """Draws in blocks of at most ``_PRODUCT_ROWS`` rows, each computed by one (``_PRODUCT_ROWS``, D) product."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    c, f, psi = gaussian
    mean = _tensor(c, compute, device)
    loadings_t = _tensor(f, compute, device).T  # (K, D)
    noise_sd = _tensor(np.sqrt(psi), compute, device)
    n_components, n_features = loadings_t.shape
    generator = _generator(seed, device)
    root_scale = math.sqrt(scale)
    noise = torch.zeros((_PRODUCT_ROWS, n_components + n_features), dtype=compute, device=device)
    for start in range(0, n_samples, _PRODUCT_ROWS):
        rows = min(_PRODUCT_ROWS, n_samples - start)
        for row in range(rows):  # one block of K + D normals per draw: independent of the chunking
            torch.randn(n_components + n_features, generator=generator, out=noise[row])
        noise[rows:].zero_()
        h, z = noise[:, :n_components], noise[:, n_components:]
        draws = torch.addmm(z * noise_sd, h, loadings_t)  # θ − c = F h + ψ^{1/2} ⊙ z, row by row
        draws.mul_(root_scale).add_(mean)
        yield draws[:rows]


def _rechunk(
    blocks: Iterator[torch.Tensor], n_samples: int, chunk_size: int, dtype: torch.dtype
) -> Iterator[torch.Tensor]:
    """The rows of ``blocks`` regrouped into fresh ``dtype`` tensors of ``chunk_size`` rows (the last shorter)."""
    out: torch.Tensor | None = None
    filled, remaining = 0, n_samples
    for block in blocks:
        if out is None and block.shape[0] == min(chunk_size, remaining):  # the block is the chunk: no copy
            remaining -= block.shape[0]
            chunk = block.to(dtype)
            del block  # not held while the next block is made
            yield chunk
            del chunk
            continue
        taken = 0
        while taken < block.shape[0]:
            if out is None:
                out = torch.empty((min(chunk_size, remaining), block.shape[1]), dtype=dtype, device=block.device)
                filled = 0
            count = min(block.shape[0] - taken, out.shape[0] - filled)
            out[filled : filled + count] = block[taken : taken + count]
            filled, taken = filled + count, taken + count
            if filled == out.shape[0]:
                remaining -= filled
                yield out
                out = None
