"""ShardedOnlineEM and ShardedOnlineSGA: the streaming models with their D rows split across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._core import NumericalBreakdownError
from ..streaming import OnlineEM, OnlineSGA
from ._comm import AllReduce, Communicator, exchange
from ..errors import ShardCommunicationError
from ._layout import build_local_model
from ._rows import RowStore, shard_rows
from ._shared import ShardedGaussianMixin

FloatArray = NDArray[np.float64]


class _ShardedStreaming(ShardedGaussianMixin):
    """A streaming model whose rows are split across ranks; one collective per sample. The same loop drives
    every row store (:mod:`._rows`): the Rust core's rows, or torch tensors on a device (``device=``)."""

    _local_class: type[OnlineEM] | type[OnlineSGA]
    _local: Any  #: OnlineEM or OnlineSGA, on the Rust core or on a device

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, device: Any = None, **options: Any) -> None:
        self._comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        self._n_components = int(n_components)
        local_class = self._local_class
        # the device is this rank's own: it is left out of the options every rank must agree on
        self._layout, self._local = build_local_model(
            self._comm, local_class.__name__, n_features, n_components, init, seed, options,
            lambda n_local, k, rows, _seed, _layout: local_class(n_local, k, init=rows, device=device, **options),
            strictly_more_rows=True)

    def _local_engine(self) -> Any:
        return shard_rows(self._local).query_engine(self.rank)

    def _refresh_report_map(self, rows: RowStore) -> None:
        """After the state changed (collective): the K×K map of the spiked-model shrinkage (``shrink``) from the
        Gram Fᵀ Ψ⁻¹ F summed over every rank's rows, kept on the local model for its queries."""
        if not rows.reports_map():  # alike on every rank
            return
        k = self._n_components
        failure: BaseException | None = None
        gram: FloatArray | None = None
        n_seen, n_samples = 0, 0.0
        try:
            gram, n_seen, n_samples = rows.gram()
        except Exception as err:
            failure = err
        total, _ = exchange(self._comm, failure, gram, k * k, what="the reporting map")
        rows.set_map(n_seen, _core.spiked_transform(total.reshape(k, k), self.n_features_total, n_samples))

    def _after_load(self) -> None:
        self._refresh_report_map(shard_rows(self._local))

    @classmethod
    def _load_local(cls, file: Any, device: Any) -> Any:
        return cls._local_class.load(file, device=device)

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
            This rank's slice of each sample. Rows on the Rust core: NumPy, or a torch tensor on any device
            (moved to host once; a contiguous CPU tensor is read in place). Rows on a device: a tensor (moved to
            that device) or an array.

        Raises
        ------
        ValueError, TypeError
            Invalid input on any rank (every rank raises; no rank applies anything).
        NumericalBreakdownError
            A numerical breakdown; every rank raises and keeps the same state (as the single-process model).
        ShardCommunicationError
            A collective failed (a peer died or the process group's timeout passed), whichever collective of the
            call it was. The call is atomic on every surviving rank: its model is restored to its state before
            the call (from a copy of the rank's state, see :meth:`_keeps_backup`; above that copy's size bound
            the samples before the failure stay applied, and the message says so).
        """
        rows = shard_rows(self._local)
        with rows.lock():
            return self._update(rows, X)

    def _update(self, rows: RowStore, X: ArrayLike) -> "_ShardedStreaming":
        failure: BaseException | None = None
        batch: Any = None
        try:
            batch = rows.checked(X)
        except Exception as err:
            failure = err
        n_rows = 0 if batch is None else int(batch.shape[0])
        backup = rows.backup() if self._keeps_backup() else None
        applied = 0
        try:
            if not rows.sums_keep_state:
                _, counts = exchange(self._comm, failure, None, 0, rows=n_rows, what="update")
                self._check_rows(counts)
            for i in range(max(n_rows, 1)):
                sums = None
                if failure is None and batch is not None and i < n_rows:
                    try:
                        sums = rows.sums(batch[i])
                        if not np.all(np.isfinite(sums)):
                            raise NumericalBreakdownError(
                                f"the E-step sums of sample {i} over this rank's rows are not finite")
                    except Exception as err:
                        failure = err
                total, counts = exchange(self._comm, failure, sums, self._sums_length(), rows=n_rows,
                                         what="update")
                if i == 0:
                    self._check_rows(counts)
                if n_rows == 0:
                    return self
                rows.apply(total, self._n_components, self.n_features_total)
                applied = i + 1
            self._refresh_report_map(rows)  # a collective too: a peer lost here must leave the model as it was
        except ShardCommunicationError as err:
            restored = self._restore(rows, backup)
            raise ShardCommunicationError(
                f"{err}; this rank's model " + (
                    "was restored to its state before the call" if restored else
                    f"keeps the {applied} sample(s) of the call applied before the failure (no copy of its state "
                    "was kept: the largest shard's D_local·K is above onlinefa._core.snapshot_max_elements())"
                )
            ) from err
        except BaseException:
            self._restore(rows, backup)
            raise
        return self

    def _sums_length(self) -> int:
        k = self._n_components
        return k * k + k + 1

    def _check_rows(self, rows: NDArray[np.int64]) -> None:
        if np.any(rows != rows[0]):
            raise ValueError(
                f"rank {self.rank}: every rank must pass the same number of samples; got {rows.tolist()} by rank"
            )

    def _keeps_backup(self) -> bool:
        """Whether a call keeps a copy of this rank's state to put back after a failure.

        The copy is about one more copy of the rank's model (D_local·K + 4·D_local + K² + K numbers) for the
        duration of the call. It is kept when the largest shard's D_local·K is at most
        ``onlinefa._core.snapshot_max_elements()`` (2¹⁸), the bound of the single-process models, so that every
        rank makes the same choice (the shard sizes are known on every rank). Above the bound no copy is made,
        and a failed call leaves the samples before the failing one applied, on every rank alike.
        """
        return max(self._layout.sizes) * self._n_components <= _core.snapshot_max_elements()

    @staticmethod
    def _restore(rows: RowStore, backup: Any) -> bool:
        """Put back the state from before the batch, if it was kept (returns whether it was); otherwise the
        samples before the failing one stay applied (as in the single-process model)."""
        if backup is None:
            return False
        rows.restore(backup)
        return True

    # -- local accessors -------------------------------------------------------------------------------
    @property
    def n_seen(self) -> int:
        """Samples applied so far (the same on every rank)."""
        return int(self._local.n_seen)

    @property
    def n_warmup(self) -> int:
        """Warm-up length."""
        return int(self._local.n_warmup)

    @property
    def is_fitted(self) -> bool:
        """Whether warm-up is over."""
        return bool(self._local.is_fitted)

    @property
    def dtype(self) -> str:
        """Storage dtype of the state ("float64" or "float32", whichever store holds the rows)."""
        return str(self._local.dtype).removeprefix("torch.")

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


class ShardedOnlineSGA(_ShardedStreaming):
    """:class:`onlinefa.OnlineSGA` with its D rows split across processes (exact).

    Same parameters as :class:`ShardedOnlineEM` (``device`` included), with the options of
    :class:`onlinefa.OnlineSGA`. On the Rust core its pass updates the running mean in place, so a batch first
    agrees that every rank's input is valid (one tiny collective per call), then takes one collective per sample.
    """

    _local_class = OnlineSGA
