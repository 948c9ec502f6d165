"""ShardedVIFA: a VIFA posterior q(θ) = N(c, F Fᵀ + Ψ) whose D rows are split across ranks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .._validation import check_init, check_int, check_seed
from ..vifa import VIFA
from ._comm import AllReduce, Communicator, exchange
from ._layout import handshake, orthonormal_rows
from ._shared import ShardedGaussianMixin, as_local_gradients

FloatArray = NDArray[np.float64]


class ShardedVIFA(ShardedGaussianMixin):
    """:class:`onlinefa.VIFA` with its D rows split across processes (exact).

    Training draws (:meth:`sample` without arguments) need no communication: the latent h of draw j comes
    from the shared seed and the noise of feature d is keyed by d's index in the whole vector, so the
    concatenated draws are the single-process model's. :meth:`step` takes two small collectives: one that
    checks every rank's gradients (and sums the squared norms when ``clip_grad_norm`` is set), and one that
    sums B = Fᵀ Ψ⁻¹ F of the new parameters (K×K).

    Parameters
    ----------
    n_features : int
        This rank's number of rows; shards may be uneven, each needs at least K rows.
    n_components : int
        K.
    group, allreduce, rank, world_size
        The communicator, as in :class:`ShardedOnlineEM`.
    init : array-like of shape (n_features, K), optional
        This rank's rows of the initial loadings (default: the single-process model's seeded loadings).
    seed : int, optional
        Key of the training draws and of the default initialisation (None: rank 0 draws one for all).
    init_mean, init_noise_variance : array-like of shape (n_features,), optional
        This rank's entries of c₀ and ψ₀.
    **options
        The other keyword arguments of :class:`onlinefa.VIFA` (``prior_precision``, ``lr_mean``,
        ``lr_loadings``, ``lr_log_noise``, ``optimizer``, ``n_grad_samples``, ``clip_grad_norm``, ``dtype``),
        identical on every rank.
    """

    _local_class = VIFA
    _local: VIFA

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, init_mean: ArrayLike | None = None,
                 init_noise_variance: ArrayLike | None = None, **options: Any) -> None:
        comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        failure: BaseException | None = None
        n_local, k, init_rows = 0, 0, None
        try:
            n_local = check_int(n_features, "n_features", 1)
            k = check_int(n_components, "n_components", 1)
            seed = check_seed(seed)
            if n_local < k:
                raise ValueError(f"this rank's shard has n_features = {n_local} rows; each shard needs at least K = {k}")
            init_rows = None if init is None else check_init(init, n_local, k)
        except Exception as err:
            failure = err
        settings = {"class": "VIFA", "n_components": n_components, "init": init is None, "seed": seed,
                    "init_mean": init_mean is None, "init_noise_variance": init_noise_variance is None, **options}
        layout, seed = handshake(comm, n_local, failure, settings, seed)
        if init_rows is None:
            init_rows = orthonormal_rows(comm, layout, k, seed)
        failure, local = None, None
        try:
            local = VIFA(n_local, k, init=init_rows, seed=seed, init_mean=init_mean,
                         init_noise_variance=init_noise_variance, **options)
            local._core.row_offset = layout.row_range[0]
        except Exception as err:
            failure = err
        exchange(comm, failure, None, 0, what="building the local models")
        assert local is not None
        self._comm, self._layout, self._local, self._n_components = comm, layout, local, k
        self._sync_precision()

    def _sync_precision(self) -> None:
        """(I + B)⁻¹ with B = Fᵀ Ψ⁻¹ F summed over every rank's rows (the local model knows only its own)."""
        f, psi = self._local.loadings, self._local.noise_variance
        k = self._n_components
        gram = self._comm.sum((f.T @ (f / psi[:, None])).ravel(), "B = Fᵀ Ψ⁻¹ F")
        self._local._core.finish_step(gram.reshape(k, k), True)

    def _local_engine(self) -> Any:
        return self._local._core

    def sample(self, n_samples: int | None = None, seed: int | None = None, *,
               dtype: DTypeLike = np.float64) -> NDArray[Any]:
        """Training draw of this rank's rows (no arguments; local), or this rank's slice of ``n_samples``
        model draws (any argument; collective, see :meth:`ShardedGaussianMixin.sample`)."""
        if n_samples is None and seed is None:
            return self._local.sample()
        return super().sample(1 if n_samples is None else n_samples, seed, dtype=dtype)

    def step(self, grad: ArrayLike) -> "ShardedVIFA":
        """One optimiser step from this rank's slice of the gradients at the pending draws (collective).

        Parameters
        ----------
        grad : array-like of shape (n_features,) or (n_grad_samples, n_features)
            This rank's entries of ∇θ of the full-data negative log-likelihood at each pending draw.

        Raises
        ------
        ValueError, TypeError, RuntimeError
            Invalid gradients or call order on any rank: every rank raises, none changes.
        NumericalBreakdownError
            The step made a parameter non-finite on some rank: every rank raises (the model diverged).
        """
        core = self._local._core
        failure: BaseException | None = None
        norms, g = None, None
        try:
            g = as_local_gradients(grad, self._local.n_grad_samples, self._local.n_features)
            norms = core.local_gradient_norms(g)
        except Exception as err:
            failure = err
        clip = self._local.clip_grad_norm is not None
        total, _ = exchange(self._comm, failure, None if norms is None else np.asarray(norms), 3, what="step")
        k = self._n_components
        failure, payload = None, np.zeros(k * k + 1)
        try:
            assert g is not None  # every rank's gradients passed the check above
            gram, finite = core.local_step(g, [float(v) for v in total] if clip else None)
            payload[: k * k] = gram.ravel()
            payload[k * k] = 0.0 if finite else 1.0
        except Exception as err:
            failure = err
        summed, _ = exchange(self._comm, failure, payload, k * k + 1, what="step (B = Fᵀ Ψ⁻¹ F)")
        core.finish_step(summed[: k * k].reshape(k, k), bool(summed[k * k] == 0.0))
        return self

    # -- local accessors ---------------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        """Optimiser steps applied (the same on every rank)."""
        return self._local.n_steps

    @property
    def n_grad_samples(self) -> int:
        """L, draws per step."""
        return self._local.n_grad_samples

    def _check_loaded(self, file: Path) -> None:
        if self._local._core.row_offset != self.row_range[0]:
            raise ValueError(f"{os.fspath(file)!r} does not hold rank {self.rank}'s rows of the manifest")

    def _after_load(self) -> None:
        self._sync_precision()
