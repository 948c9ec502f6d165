"""Agreeing on a sharded model across ranks: row ranges, identical options, one seed, the initial loadings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._validation import check_init, check_int, check_seed
from ._comm import Communicator, exchange, new_tag

#: Seeds drawn for ``seed=None`` are below 2**53, so they travel exactly through a float64 sum.
_SEED_LIMIT = 2**53


@dataclass(frozen=True)
class ShardLayout:
    """Where this rank's rows sit in the whole vector.

    Attributes
    ----------
    rank, world_size : int
        This process and the number of processes.
    sizes : tuple of int
        Number of rows (features) of every rank, in rank order; rows are split contiguously in rank order.
    """

    rank: int
    world_size: int
    sizes: tuple[int, ...]

    @property
    def n_features_total(self) -> int:
        """D of the whole model."""
        return int(sum(self.sizes))

    @property
    def row_range(self) -> tuple[int, int]:
        """This rank's rows [start, stop) in the whole vector."""
        start = int(sum(self.sizes[: self.rank]))
        return start, start + self.sizes[self.rank]


def fingerprint(settings: dict[str, Any]) -> float:
    """A number that differs (with overwhelming probability) when two ranks' settings differ."""
    text = repr(sorted((key, repr(value)) for key, value in settings.items()))
    return float(int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "little"))


def handshake(
    comm: Communicator, n_local: int, failure: BaseException | None, settings: dict[str, Any], seed: int | None
) -> tuple[ShardLayout, int]:
    """One collective: every rank's row count, options and seed. Returns the layout and the shared seed.

    Raises on every rank if any rank's arguments were invalid (``failure``) or if the ranks' settings
    differ (ValueError naming the ranks that disagree with rank 0).
    """
    w = comm.world_size
    payload = np.zeros(2 * w + 2)
    payload[comm.rank] = fingerprint(settings)
    payload[w + comm.rank] = 0.0 if seed is None else 1.0
    if comm.rank == 0 and seed is None:
        payload[2 * w] = float(int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0]) % _SEED_LIMIT)
    if comm.rank == 0:  # the model's tag (see exchange), drawn by rank 0 for every rank
        payload[2 * w + 1] = new_tag()
    total, sizes = exchange(comm, failure, payload, 2 * w + 2, rows=n_local, what="the model's construction")
    comm.tag = int(total[2 * w + 1])
    prints = total[:w]
    differing = [r for r in range(w) if prints[r] != prints[0]]
    if differing:
        raise ValueError(
            f"rank {comm.rank}: the options (n_components, dtype, seed, hyper-parameters) of rank(s) {differing} "
            "differ from rank 0's; every rank must build the model with the same arguments"
        )
    layout = ShardLayout(comm.rank, w, tuple(int(n) for n in sizes))
    return layout, int(total[2 * w]) if seed is None else seed


def orthonormal_rows(comm: Communicator, layout: ShardLayout, n_components: int, seed: int) -> NDArray[np.float64]:
    """This rank's rows of the seeded orthonormal initial loadings of the whole model (thesis §4.4).

    The same standard-normal D×K matrix as the single-process model draws with ``seed``, orthonormalised by
    CholeskyQR2 with the K×K Gram matrix summed over ranks (two small collectives).
    """
    start, stop = layout.row_range
    a = _core.standard_normal_rows(seed, start, stop - start, n_components)
    for round_ in range(2):
        gram = comm.sum((a.T @ a).ravel(), f"the Gram matrix of the initial loadings (round {round_ + 1})").reshape(
            n_components, n_components
        )
        lower = np.linalg.cholesky(gram)
        a = np.linalg.solve(lower, a.T).T
    return np.ascontiguousarray(a)


Model = TypeVar("Model")


def build_local_model(comm: Communicator, name: str, n_features: int, n_components: int, init: ArrayLike | None,
                      seed: int | None, settings: dict[str, Any],
                      build: Callable[[int, int, NDArray[np.float64], int, ShardLayout], Model],
                      *, strictly_more_rows: bool) -> tuple[ShardLayout, Model]:
    """Agree on the layout and the settings every rank must share (collective), take this rank's rows of the
    single-process model's initial loadings, and build this rank's model with
    ``build(n_local, K, init_rows, seed, layout)``. A failure on any rank raises on every rank.

    Parameters
    ----------
    name : str
        The model class's name (part of the agreed settings).
    settings : dict
        Options every rank must agree on, besides the class, K, the seed and whether ``init`` was given.
    strictly_more_rows : bool
        Whether each shard needs more than K rows (the streaming models) or at least K (VIFA).
    """
    failure: BaseException | None = None
    n_local, k, init_rows = 0, 0, None
    try:
        n_local = check_int(n_features, "n_features", 1)
        k = check_int(n_components, "n_components", 1)
        seed = check_seed(seed)
        if n_local < k + int(strictly_more_rows):
            need = "more than" if strictly_more_rows else "at least"
            raise ValueError(f"this rank's shard has n_features = {n_local} rows; each shard needs {need} K = {k}")
        init_rows = None if init is None else check_init(init, n_local, k)
    except Exception as err:
        failure = err
    agreed = {"class": name, "n_components": n_components, "init": init is None, "seed": seed, **settings}
    layout, seed = handshake(comm, n_local, failure, agreed, seed)
    if init_rows is None:
        init_rows = orthonormal_rows(comm, layout, k, seed)
    failure, model = None, None
    try:
        model = build(n_local, k, init_rows, seed, layout)
    except Exception as err:
        failure = err
    exchange(comm, failure, None, 0, what="building the local models")
    assert model is not None
    return layout, model
