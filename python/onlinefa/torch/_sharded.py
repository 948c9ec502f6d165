"""``onlinefa.distributed.ShardedOnlineEM`` and ``ShardedOnlineSGA`` with ``device=``: the device models with their D
rows split across processes."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import numpy as np
import torch
from numpy.typing import ArrayLike

from .. import _core, distributed
from ..distributed._comm import AllReduce, Communicator, exchange
from ..distributed._layout import ShardLayout, build_local_model
from ..errors import NotFittedError, NumericalBreakdownError
from ._online_em import OnlineEM
from ._online_sga import OnlineSGA
from ._torch_model import SNAPSHOT_MAX_ELEMENTS, TorchStreamingModel, factor_gram

Sharded = TypeVar("Sharded", bound="ShardedTorchModel")


class ShardedTorchModel:
    """A torch streaming model with its D rows split across processes: one collective of K² + K + 1 numbers per
    sample (the E-step sums over every rank's rows). Subclasses set ``_local_class``."""

    _local_class: type[OnlineEM] | type[OnlineSGA]

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, device: str | torch.device = "cpu", **options: Any) -> None:
        self._comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        self._k = int(n_components)
        # the device is this rank's own: it is left out of the options every rank must agree on
        base = self._local_class
        self._layout, local = build_local_model(
            self._comm, base.__name__, n_features, n_components, init, seed, options,
            lambda n_local, k, rows, _seed, _layout: base(n_local, k, init=rows, device=device, **options),
            strictly_more_rows=True)
        self._local: TorchStreamingModel = local

    @property
    def layout(self) -> ShardLayout:
        """Row ranges of every rank."""
        return self._layout

    @property
    def local_model(self) -> TorchStreamingModel:
        """This rank's rows as a single-process model (its K×K state is the whole model's)."""
        return self._local

    @property
    def n_seen(self) -> int:
        """Samples applied so far (the same on every rank)."""
        return self._local.n_seen

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's rows of the fitted Gaussian (c, F, ψ) on its device (see the local model's ``snapshot``)."""
        return self._local.snapshot()

    @property
    def mean(self) -> torch.Tensor:
        """This rank's entries of the mean c."""
        return self.snapshot()[0]

    @property
    def loadings(self) -> torch.Tensor:
        """This rank's rows of F, shape (n_features, K)."""
        return self.snapshot()[1]

    @property
    def noise_variance(self) -> torch.Tensor:
        """This rank's entries of ψ."""
        return self.snapshot()[2]

    def update(self: Sharded, X: Any) -> Sharded:
        """Apply one sample or a batch, given this rank's features of each (a tensor on any device; collective).

        Every rank passes the same number of samples. Invalid input on any rank raises on every rank before
        any sample is applied; a numerical breakdown, or a peer that dies at any collective of the call (the
        reporting map's included), raises on every surviving rank, and a model of at most
        ``SNAPSHOT_MAX_ELEMENTS`` values per shard is then as it was before the call.
        """
        with self._local._lock:
            return self._update_locked(X)

    def _update_locked(self: Sharded, X: Any) -> Sharded:
        local, k = self._local, self._k
        failure: BaseException | None = None
        batch: torch.Tensor | None = None
        try:
            batch = local._checked_batch(X)
        except Exception as err:
            failure = err
        n_rows = 0 if batch is None else batch.shape[0]
        keep = max(self._layout.sizes) * k <= SNAPSHOT_MAX_ELEMENTS  # the same choice on every rank
        backup = copy.deepcopy(local._engine) if keep else None
        map_before = local._fixed_map
        try:
            for i in range(max(n_rows, 1)):
                sums = None
                if failure is None and batch is not None and i < n_rows:
                    try:
                        s, u, dsq = local._engine.local_sums(batch[i])
                        sums = np.concatenate([s.numpy().ravel(), u.numpy(), [dsq]])
                        if not np.all(np.isfinite(sums)):
                            raise NumericalBreakdownError(f"the E-step sums of sample {i} over this rank's rows "
                                                          "are not finite")
                    except Exception as err:
                        failure = err
                total, rows = exchange(self._comm, failure, sums, k * k + k + 1, rows=n_rows, what="update")
                if np.any(rows != rows[0]):
                    raise ValueError(f"rank {self._comm.rank}: every rank must pass the same number of samples; "
                                     f"got {rows.tolist()} by rank")
                if n_rows == 0:
                    return self
                local._engine.apply_sums(torch.as_tensor(total[: k * k].reshape(k, k)),
                                         torch.as_tensor(total[k * k: k * k + k]), float(total[-1]),
                                         self._layout.n_features_total)
            self._refresh_report_map()  # a collective too: a peer lost here must leave the model as it was
        except BaseException:
            if backup is not None:
                local._engine = backup
                local._fixed_map = map_before
            raise
        return self

    def _refresh_report_map(self) -> None:
        """After the state changed (collective): the K×K map of the spiked-model shrinkage (``shrink``) from the
        Gram Fᵀ Ψ⁻¹ F summed over every rank's rows, kept on the local model for its snapshots."""
        local, k = self._local, self._k
        if not isinstance(local, OnlineEM) or not local._engine.settings.shrink:
            return
        try:  # the engine that answers: the model's, or during warm-up its copy ended at the last sample
            engine = local._answering()
        except NotFittedError:  # decided by the shared state: the same on every rank
            return
        failure: BaseException | None = None
        gram: np.ndarray | None = None
        try:
            f, psi = engine.fitted_rows(engine.applied_a_bar())
            gram = factor_gram(f, psi).ravel()
        except Exception as err:
            failure = err
        total, _ = exchange(self._comm, failure, gram, k * k, what="the reporting map")
        transform = _core.spiked_transform(total.reshape(k, k), self._layout.n_features_total,
                                           engine.effective_samples())
        local._fixed_map = (engine.n_seen, transform)


class ShardedOnlineEM(ShardedTorchModel):
    """:class:`onlinefa.OnlineEM` (``device=``) with its D rows split across processes, each shard on its own device
    (e.g. ``device=f"cuda:{rank}"``): exact, one collective of K² + K + 1 numbers per sample (and, with ``shrink``,
    one of K² numbers per ``update`` call for the reported Gaussian).

    The parameters are those of :class:`onlinefa.distributed.ShardedOnlineEM` (``n_features`` is this rank's
    number of rows; ``group`` or ``allreduce`` with ``rank``/``world_size``; ``seed`` draws the single-process
    model's initial loadings across ranks; every other option of :class:`onlinefa.OnlineEM` must be the
    same on every rank), plus ``device``, which may differ between ranks. Every rank raises when any rank's
    input or step fails, and keeps the same state.
    """

    _local_class = OnlineEM


class ShardedOnlineSGA(ShardedTorchModel):
    """:class:`onlinefa.OnlineSGA` (``device=``) with its D rows split across processes, each shard on its own device:
    exact, one collective of K² + K + 1 numbers per sample.

    The parameters are those of :class:`onlinefa.distributed.ShardedOnlineSGA` plus ``device``, as for
    :class:`ShardedOnlineEM`. Every rank raises when any rank's input or step fails (a diverged step on one
    rank's rows included), and keeps the same state.
    """

    _local_class = OnlineSGA


# ``onlinefa.distributed.ShardedOnlineEM(..., device=...)`` builds these classes; they are those to ``isinstance``.
distributed.ShardedOnlineEM.register(ShardedOnlineEM)
distributed.ShardedOnlineSGA.register(ShardedOnlineSGA)
