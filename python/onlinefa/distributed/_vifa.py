"""ShardedVIFA: a VIFA posterior q(θ) = N(c, F Fᵀ + Ψ) whose D rows are split across ranks."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, ContextManager, Protocol

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _core
from ..vifa import VIFA
from ._comm import AllReduce, Communicator, exchange
from ..errors import ShardCommunicationError
from ._layout import ShardLayout, build_local_model
from ._shared import ShardedGaussianMixin, as_local_gradients

FloatArray = NDArray[np.float64]
#: The backup of rows whose local step changes nothing before ``finish``: nothing to put back.
_UNCHANGED = object()


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
    device : str or torch.device, optional
        None (the default): this rank's rows in the Rust core (NumPy in and out). A torch device (e.g.
        ``f"cuda:{rank}"``): this rank's rows in torch tensors there (torch tensors in and out; needs PyTorch).
        The device is each rank's own; it may differ between ranks.
    **options
        The other keyword arguments of :class:`onlinefa.VIFA` (``prior_precision``, ``lr_mean``,
        ``lr_loadings``, ``lr_log_noise``, ``optimizer``, ``n_grad_samples``, ``clip_grad_norm``, ``dtype``),
        identical on every rank.
    """

    _local_class = VIFA
    _local: Any  #: VIFA, on the Rust core or on a device
    #: B = Fᵀ Ψ⁻¹ F of the current parameters summed over every rank (K×K), kept to restore a failed step.
    _gram: FloatArray
    #: Why this rank's model is half-stepped (a failed step above the backup bound), or None.
    _broken: str | None = None

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, init_mean: ArrayLike | None = None,
                 init_noise_variance: ArrayLike | None = None, device: Any = None, **options: Any) -> None:
        comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        # the device is this rank's own: it is left out of the options every rank must agree on
        layout, local = build_local_vifa(comm, n_features, n_components, init, seed, init_mean, init_noise_variance,
                                         options, device)
        k = local.n_components
        self._comm, self._layout, self._local, self._n_components = comm, layout, local, k
        self._sync_precision()

    def _rows(self) -> VifaRowStore:
        if hasattr(self._local, "_core"):
            return CoreVifaRows(self._local)
        from ..torch._sharded_vifa import TensorVifaRows  # a device model exists, so torch is importable

        return TensorVifaRows(self._local)

    def _sync_precision(self) -> None:
        """(I + B)⁻¹ with B = Fᵀ Ψ⁻¹ F summed over every rank's rows (the local model knows only its own)."""
        k, rows = self._n_components, self._rows()
        gram = self._comm.sum(rows.gram(), "B = Fᵀ Ψ⁻¹ F").reshape(k, k)
        rows.finish(None, gram, True)
        self._gram = gram

    def _local_engine(self) -> Any:
        return self._rows().query_engine(self._gram)

    def sample(self, n_samples: int | None = None, seed: int | None = None, *,
               dtype: DTypeLike = np.float64) -> Any:
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
            This rank's entries of ∇θ of the full-data negative log-likelihood at each pending draw (a tensor on
            the model's device for rows on a device).

        Raises
        ------
        ValueError, TypeError, RuntimeError
            Invalid gradients or call order on any rank: every rank raises, none changes.
        NumericalBreakdownError
            The step made a parameter non-finite on some rank: every rank raises (on the Rust core the model
            diverged; on a device every rank keeps its state).
        ShardCommunicationError
            A collective failed (a peer died or the process group's timeout passed). The step is atomic on
            every surviving rank: its parameters and optimiser state are restored to those before the step
            (see :meth:`_backup` for the copy this keeps and what happens above its size bound).
        """
        self._check_usable()
        rows = self._rows()
        with rows.lock():
            return self._step(rows, grad)

    def _step(self, rows: VifaRowStore, grad: ArrayLike) -> "ShardedVIFA":
        failure: BaseException | None = None
        norms, g = None, None
        try:
            g = rows.checked(grad)
            norms = rows.norms(g)
        except Exception as err:
            failure = err
        total, _ = exchange(self._comm, failure, None if norms is None else np.asarray(norms), 3, what="step")
        k = self._n_components
        # Nothing has changed yet on any rank; the Rust core's local step below changes c, F, β and the
        # optimiser state before the second collective, so keep a copy to put back if that collective (or the
        # step) fails. A device's local step changes nothing until ``finish``.
        backup = self._backup(rows)
        failure, payload, pending = None, np.zeros(k * k + 1), None
        try:
            assert g is not None  # every rank's gradients passed the check above
            pending, gram, finite = rows.local_step(g, [float(v) for v in total] if norms is not None else None)
            payload[: k * k] = gram
            payload[k * k] = 0.0 if finite else 1.0
        except Exception as err:
            failure = err
        try:
            summed, _ = exchange(self._comm, failure, payload, k * k + 1, what="step (B = Fᵀ Ψ⁻¹ F)")
        except ShardCommunicationError as err:
            restored = self._restore(rows, backup)
            if not restored:
                self._broken = f"{err}"
            raise ShardCommunicationError(
                f"{err}; this rank's model " + (
                    "was restored to its state before the step" if restored else
                    "is left half-stepped (no copy of its state was kept: the largest shard's D_local·K is above "
                    "onlinefa._core.snapshot_max_elements()); load a checkpoint"
                )
            ) from err
        except BaseException:
            if not self._restore(rows, backup):
                self._broken = "a step failed on another rank after this rank had applied its part"
            raise
        gram = summed[: k * k].reshape(k, k).copy()
        rows.finish(pending, gram, bool(summed[k * k] == 0.0))
        self._gram = gram
        return self

    def _backup(self, rows: VifaRowStore) -> Any:
        """A copy of this rank's state before a step, or None.

        On the Rust core the copy is ``get_state`` of the local core (c, F, log ψ and the optimiser's moments:
        about D_local·(K + 2) numbers, times 3 with Adam, i.e. one more copy of the rank's model during the
        step), with the row offset and the summed B = Fᵀ Ψ⁻¹ F of the current parameters (K×K, which the core's
        state does not hold: it is a sum over every rank's rows). It is kept when the largest shard's D_local·K
        is at most ``onlinefa._core.snapshot_max_elements()`` (2¹⁸; the same choice on every rank). Above the
        bound a step that fails after the local part leaves this rank half-stepped; every later call then raises
        a ``ShardCommunicationError`` saying so (load a checkpoint). A device's rows need no copy.
        """
        if not rows.local_step_changes_state:
            return _UNCHANGED
        if max(self._layout.sizes) * self._n_components > _core.snapshot_max_elements():
            return None
        return rows.backup(), self._gram.copy()

    def _restore(self, rows: VifaRowStore, backup: Any) -> bool:
        """Put back the state kept by :meth:`_backup` (returns whether there was one). Rebuilding the core
        from its state and finishing it with the kept B is what :meth:`load` does, so the restored model is
        the pre-step model bit for bit."""
        if backup is None:
            return False
        if backup is _UNCHANGED:
            return True
        state, gram = backup
        rows.restore(state)
        rows.finish(None, gram, True)
        self._gram = gram
        return True

    def _check_usable(self) -> None:
        broken = self._broken
        if broken is not None:
            raise ShardCommunicationError(
                f"rank {self.rank}: a step failed half-way on this rank ({broken}) and its state could not be "
                "restored; load a checkpoint"
            )

    # -- local accessors ---------------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        """Optimiser steps applied (the same on every rank)."""
        return int(self._local.n_steps)

    @property
    def n_grad_samples(self) -> int:
        """L, draws per step."""
        return int(self._local.n_grad_samples)

    def _check_loaded(self, file: Path) -> None:
        if self._rows().row_offset() != self.row_range[0]:
            raise ValueError(f"{os.fspath(file)!r} does not hold rank {self.rank}'s rows of the manifest")

    @classmethod
    def _load_local(cls, file: Path, device: Any) -> Any:
        return VIFA.load(file, device=device)

    def _after_load(self) -> None:
        self._sync_precision()


def build_local_vifa(comm: Communicator, n_features: int, n_components: int, init: ArrayLike | None,
                     seed: int | None, init_mean: ArrayLike | None, init_noise_variance: ArrayLike | None,
                     options: dict[str, Any], device: Any = None) -> tuple[ShardLayout, Any]:
    """Agree on the layout and options (collective), draw this rank's rows of the single-process model's
    initial loadings, and build this rank's :class:`onlinefa.VIFA` (noise keyed by its first global row), its
    rows on ``device`` (None: the Rust core)."""

    def build(n_local: int, k: int, rows: FloatArray, agreed_seed: int, layout: ShardLayout) -> Any:
        local = VIFA(n_local, k, init=rows, seed=agreed_seed, init_mean=init_mean,
                     init_noise_variance=init_noise_variance, **options)
        local._core.row_offset = layout.row_range[0]
        return local if device is None else local.to(device)

    settings = {"init_mean": init_mean is None, "init_noise_variance": init_noise_variance is None, **options}
    return build_local_model(comm, "VIFA", n_features, n_components, init, seed, settings, build,
                             strictly_more_rows=False)


class VifaRowStore(Protocol):
    """One rank's rows of a sharded VIFA, as the sharded step drives them."""

    #: Whether :meth:`local_step` changes the rows before :meth:`finish` (then a failed step needs a copy).
    local_step_changes_state: bool

    def lock(self) -> ContextManager[Any]:
        """Held for a whole step."""

    def checked(self, grad: Any) -> Any:
        """The (L, D_local) gradients the rows read; ValueError/TypeError/RuntimeError for bad ones or order."""

    def norms(self, grads: Any) -> list[float] | None:
        """This rank's share of ‖∇c‖², ‖∇F‖², ‖∇β‖² when clipping is on (else None); changes nothing."""

    def local_step(self, grads: Any, sq_norms: list[float] | None) -> tuple[Any, FloatArray, bool]:
        """(what :meth:`finish` adopts, this rank's B = Fᵀ Ψ⁻¹ F of the new parameters flat, whether finite)."""

    def finish(self, pending: Any, gram: FloatArray, finite: bool) -> None:
        """(I + B)⁻¹ from the whole model's B; adopt ``pending`` (None: the rows are already stepped)."""

    def gram(self) -> FloatArray:
        """This rank's B = Fᵀ Ψ⁻¹ F of the current parameters, flat."""

    def backup(self) -> Any:
        """A copy of the state (:attr:`local_step_changes_state` stores only)."""

    def restore(self, backup: Any) -> None:
        """Put back the state of :meth:`backup`."""

    def row_offset(self) -> int:
        """The first global row of these rows (keys the noise of the training draws)."""

    def query_engine(self, gram: FloatArray) -> Any:
        """The Rust engine that answers the collective queries, with (I + B)⁻¹ of the whole model's B."""


class CoreVifaRows:
    """The rows of a Rust-core VIFA: its local step changes them at once."""

    local_step_changes_state = True

    def __init__(self, local: VIFA) -> None:
        self._local = local

    def lock(self) -> ContextManager[Any]:
        return contextlib.nullcontext()  # each core call holds the core's own lock

    def checked(self, grad: Any) -> NDArray[Any]:
        return as_local_gradients(grad, self._local.n_grad_samples, self._local.n_features)

    def norms(self, grads: NDArray[Any]) -> list[float] | None:
        norms = self._local._core.local_gradient_norms(grads)
        return None if norms is None else [float(v) for v in norms]

    def local_step(self, grads: NDArray[Any], sq_norms: list[float] | None) -> tuple[Any, FloatArray, bool]:
        gram, finite = self._local._core.local_step(grads, sq_norms)
        return None, np.asarray(gram, dtype=np.float64).ravel(), bool(finite)

    def finish(self, pending: Any, gram: FloatArray, finite: bool) -> None:
        self._local._core.finish_step(gram, finite)

    def gram(self) -> FloatArray:
        # The core's own sum, bit for bit the B its step returns (a NumPy product rounds differently).
        return np.asarray(self._local._core.local_gram(), dtype=np.float64).ravel()

    def backup(self) -> Any:
        return self._local._core.get_state(), int(self._local._core.row_offset)

    def restore(self, backup: Any) -> None:
        state, offset = backup
        self._local._restore(state)
        self._local._core.row_offset = offset

    def row_offset(self) -> int:
        return int(self._local._core.row_offset)

    def query_engine(self, gram: FloatArray) -> Any:
        return self._local._core
