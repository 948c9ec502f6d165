"""ShardedOnlineEM and ShardedOnlineSGA: the streaming models with their D rows split across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._core import NumericalBreakdownError
from ..streaming import OnlineEM, OnlineSGA, MappedCore
from ._comm import AllReduce, Communicator, exchange
from ..errors import ShardCommunicationError
from ._layout import build_local_model
from ._shared import ShardedGaussianMixin, local_matrix

FloatArray = NDArray[np.float64]


class _ShardedStreaming(ShardedGaussianMixin):
    """A streaming model whose rows are split across ranks; one collective per sample."""

    _local_class: type[OnlineEM] | type[OnlineSGA]
    #: Whether ``local_sums`` leaves the model unchanged (then a batch needs no separate agreement).
    _sums_keep_state: bool
    _local: OnlineEM | OnlineSGA

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, device: Any = None, **options: Any) -> None:
        self._comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        self._n_components = int(n_components)
        local_class = self._local_class
        self._layout, self._local = build_local_model(
            self._comm, local_class.__name__, n_features, n_components, init, seed, options,
            lambda n_local, k, rows, _seed, _layout: local_class(n_local, k, init=rows, **options),
            strictly_more_rows=True)

    def _local_engine(self) -> Any:
        local = self._local
        local._require_fitted()
        core = local._core
        if not local._settings.get("shrink", False) or not core.is_fitted:
            return core
        fixed = local._fixed_map
        if fixed is None or fixed[0] != core.n_seen:
            raise RuntimeError(
                f"rank {self.rank}: the reporting map of the sharded model is out of date (a collective failed "
                "after the last samples were applied); call update again (with the next samples) on every rank")
        return MappedCore(core, fixed[1])

    def _refresh_report_map(self) -> None:
        """After the state changed (collective): the K×K map of the spiked-model shrinkage (``shrink``) from the
        Gram Fᵀ Ψ⁻¹ F summed over every rank's rows, kept on the local model for its queries."""
        local, k = self._local, self._n_components
        core = local._core
        if not isinstance(core, _core.OnlineEMCore) or not core.shrink or not core.is_fitted:  # alike on every rank
            return
        failure: BaseException | None = None
        gram: FloatArray | None = None
        try:
            gram = np.ascontiguousarray(core.gram(), dtype=np.float64).ravel()
        except Exception as err:
            failure = err
        total, _ = exchange(self._comm, failure, gram, k * k, what="the reporting map")
        transform = _core.spiked_transform(total.reshape(k, k), self.n_features_total, core.effective_samples)
        local._fixed_map = (core.n_seen, transform)

    def _after_load(self) -> None:
        self._refresh_report_map()

    # -- updates ----------------------------------------------------------------------------------------
    def update(self, X: ArrayLike) -> "_ShardedStreaming":
        """Apply one sample or a batch, given this rank's features of each (collective).

        Every rank must call it with the same number of samples. One collective per sample carries the K×K
        and K sums of the E-step (4.23); every rank then applies the same step, so the concatenated model
        is the single-process model's (to rounding in the order of the sums over rows). With OnlineEM's
        ``shrink`` (the default) one more collective per call, once the model is fitted, sums the K×K Gram
        Fᵀ Ψ⁻¹ F over ranks for the reported Gaussian.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_features,)
            This rank's slice of each sample: NumPy, or a torch tensor on any device (moved to host once;
            a contiguous CPU tensor is read in place).

        Raises
        ------
        ValueError, TypeError
            Invalid input on any rank (every rank raises; no rank applies anything).
        NumericalBreakdownError
            A numerical breakdown; every rank raises and keeps the same state (as the single-process model).
        ShardCommunicationError
            A collective failed (a peer died or the process group's timeout passed). The call is atomic on
            every surviving rank: its model is restored to its state before the call (from a copy of the
            rank's state, see :meth:`_backup`; above that copy's size bound the samples before the failure
            stay applied, and the message says so).
        """
        core = self._local._core
        failure: BaseException | None = None
        x: NDArray[Any] | None = None
        try:
            x = local_matrix(X, self._local.n_features)
            core.check_batch(x)
        except Exception as err:
            failure = err
        n_rows = 0 if x is None else x.shape[0]
        backup = self._backup()
        self._local._cache = None
        if not self._sums_keep_state:
            _, rows = exchange(self._comm, failure, None, 0, rows=n_rows, what="update")
            self._check_rows(rows)
        k = self._n_components
        for i in range(max(n_rows, 1)):
            sums = None
            if failure is None and x is not None and i < n_rows:
                try:
                    s, u, dsq = core.local_sums(x[i])
                    sums = np.concatenate([s.ravel(), u, [dsq]])
                    if not np.all(np.isfinite(sums)):
                        raise NumericalBreakdownError(
                            f"the E-step sums of sample {i} over this rank's rows are not finite"
                        )
                except Exception as err:
                    failure = err
            try:
                total, rows = exchange(self._comm, failure, sums, k * k + k + 1, rows=n_rows, what="update")
                if i == 0:
                    self._check_rows(rows)
                if n_rows == 0:
                    return self
                core.apply_sums(total[: k * k].reshape(k, k), total[k * k: k * k + k], float(total[-1]),
                                self.n_features_total)
            except ShardCommunicationError as err:
                # A peer died (or the timeout passed) between two samples: the samples before it were applied
                # on this rank. Put back the state from before the call and say so.
                restored = self._restore(backup)
                raise ShardCommunicationError(
                    f"{err}; this rank's model " + (
                        "was restored to its state before the call" if restored else
                        f"keeps the {i} sample(s) of the call applied before the failure (no copy of its state "
                        "was kept: the largest shard's D_local·K is above onlinefa._core.snapshot_max_elements())"
                    )
                ) from err
            except BaseException:
                self._restore(backup)
                raise
        self._refresh_report_map()
        return self

    def _check_rows(self, rows: NDArray[np.int64]) -> None:
        if np.any(rows != rows[0]):
            raise ValueError(
                f"rank {self.rank}: every rank must pass the same number of samples; got {rows.tolist()} by rank"
            )

    def _backup(self) -> dict[str, Any] | None:
        """The state to restore after a failed batch, or None.

        A copy of this rank's state (``get_state`` of the local core: D_local·K + 4·D_local + K² + K numbers
        in the storage dtype, i.e. about one more copy of the rank's model for the duration of the call). It
        is kept when the largest shard's D_local·K is at most ``onlinefa._core.snapshot_max_elements()``
        (2¹⁸), the bound of the single-process models, so that every rank makes the same choice (the shard
        sizes are known on every rank). Above the bound no copy is made, and a failed call leaves the samples
        before the failing one applied, on every rank alike.
        """
        if max(self._layout.sizes) * self._n_components <= _core.snapshot_max_elements():
            state: dict[str, Any] = self._local._core.get_state()
            return state
        return None

    def _restore(self, backup: dict[str, Any] | None) -> bool:
        """Put back the state from before the batch, if it was kept (returns whether it was); otherwise the
        samples before the failing one stay applied (as in the single-process model)."""
        if backup is None:
            return False
        self._local._restore(backup)
        return True

    # -- local accessors -------------------------------------------------------------------------------
    @property
    def n_seen(self) -> int:
        """Samples applied so far (the same on every rank)."""
        return self._local.n_seen

    @property
    def n_warmup(self) -> int:
        """Warm-up length."""
        return self._local.n_warmup

    @property
    def is_fitted(self) -> bool:
        """Whether warm-up is over."""
        return self._local.is_fitted

    @property
    def dtype(self) -> str:
        """Storage dtype of the state."""
        return self._local.dtype

    def __repr__(self) -> str:
        start, stop = self.row_range
        return (f"{type(self).__name__}(rank={self.rank}/{self.world_size}, rows={start}:{stop} of "
                f"{self.n_features_total}, local={self._local!r})")


class ShardedOnlineEM(_ShardedStreaming):
    """:class:`onlinefa.OnlineEM` with its D rows split across processes (exact; one collective per sample).

    Parameters
    ----------
    n_features : int
        This rank's number of rows (features); shards may be uneven, each needs more than K rows. Rows are
        split contiguously in rank order.
    n_components : int
        K, the same on every rank.
    group : torch.distributed.ProcessGroup, optional
        Process group of the default communicator (default: the world group).
    allreduce : callable, optional
        A sum of a small 1-D float64 NumPy array over ranks (identical bits on every rank), to use MPI or
        another engine instead of torch; needs ``rank`` and ``world_size``.
    rank, world_size : int, optional
        With ``allreduce``.
    init : array-like of shape (n_features, K), optional
        This rank's rows of the initial loadings.
    seed : int, optional
        Without ``init``: the ranks together draw the single-process model's initial loadings for this seed
        (None: rank 0 draws one for all).
    device : str or torch.device, optional
        None (the default): this rank's rows in the Rust core (NumPy in and out). A torch device (e.g.
        ``f"cuda:{rank}"``): this rank's rows in torch tensors there (torch tensors in and out; needs PyTorch).
        The device is each rank's own; it may differ between ranks.
    **options
        The other keyword arguments of :class:`onlinefa.OnlineEM` (``n_warmup``, ``whiten``, ``schedule``,
        ``dtype``, ...), identical on every rank (checked at construction).
    """

    _local_class = OnlineEM
    _device_impl = "onlinefa.torch._sharded:ShardedOnlineEM"
    _sums_keep_state = True


class ShardedOnlineSGA(_ShardedStreaming):
    """:class:`onlinefa.OnlineSGA` with its D rows split across processes (exact).

    Same parameters as :class:`ShardedOnlineEM` (``device`` included), with the options of :class:`onlinefa.OnlineSGA`. Its pass
    updates the running mean in place, so a batch first agrees that every rank's input is valid (one tiny
    collective per call), then takes one collective per sample.
    """

    _local_class = OnlineSGA
    _device_impl = "onlinefa.torch._sharded:ShardedOnlineSGA"
    _sums_keep_state = False
