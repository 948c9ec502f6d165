"""What the torch streaming models share: batches on the device, atomic updates, queries, checkpoints.

A model wraps an engine (the D-sized state in torch tensors on one device, the K×K state in float64 on the CPU)
with the Rust core's state map, so that a model moves to and from the NumPy-facing class of the same name.

Every method that changes the state (a whole batch of ``update``, a VIFA ``step`` or training draw) and every
method that reads it (``snapshot``, ``sample``, ``get_state`` and so ``save``) holds the model's lock, so a
reader on another thread (the asynchronous ``SnapshotCollector``'s worker updates while the training loop
saves) sees one state the model was in, never a mix of two.
"""

from __future__ import annotations

import copy
import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import torch

from .. import _core
from ._input import as_input_tensor
from ._kk_algebra import MAX_INPUT

#: Up to this many state values (D·K) a failed batch restores the model to its state before the batch (a
#: copy is kept), as the Rust core does; larger models keep the rows before the failing one.
SNAPSHOT_MAX_ELEMENTS = 1 << 18
Model = TypeVar("Model", bound="TorchGaussianModel")
Streaming = TypeVar("Streaming", bound="TorchStreamingModel")
_DTYPES = {"float64": torch.float64, "float32": torch.float32}
_Method = TypeVar("_Method", bound=Callable[..., Any])


def locked(method: _Method) -> _Method:
    """The method, run while holding its model's lock (``self._lock``, re-entrant)."""

    @functools.wraps(method)
    def run_locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_Method, run_locked)


def initial_loadings(args: Mapping[str, Any]) -> torch.Tensor:
    """F₀ of validated common arguments (``common_args``): ``init``, else the seeded orthonormal start of the Rust
    core (``seed`` None: fresh entropy)."""
    if args["init"] is not None:
        return torch.as_tensor(args["init"])
    seed = args["seed"]
    seed = int(np.random.default_rng().integers(2**63)) if seed is None else seed
    return torch.as_tensor(_core.orthonormal_init(args["n_features"], args["n_components"], seed))


def factor_gram(f: torch.Tensor, psi: torch.Tensor) -> np.ndarray:
    """Fᵀ Ψ⁻¹ F (K×K, float64 NumPy) of the rows (F, ψ)."""
    return ((f / psi[:, None]).T @ f).cpu().numpy()


def mapped_rows(f: torch.Tensor, psi: torch.Tensor, transform: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(F R, ψ + ‖F_d‖² − ‖(F R)_d‖²): the loadings mapped by the K×K ``transform`` R with every marginal variance
    kept (the Rust core's ``Reported`` rows), float64 on F's device."""
    mapped = f @ torch.as_tensor(transform, dtype=torch.float64, device=f.device)
    return mapped, psi + (torch.linalg.vecdot(f, f) - torch.linalg.vecdot(mapped, mapped)).clamp(min=0.0)


def state_dtype(dtype: object) -> torch.dtype:
    """The torch dtype of the D-sized state from a name or a torch dtype (float64 or float32)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be float64 or float32 (a name or a torch dtype), got {dtype!r}")
    return _DTYPES[name]


class SnapshotParts:
    """``mean``, ``loadings`` and ``noise_variance`` as the parts of ``snapshot()`` (one consistent state each)."""

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fitted Gaussian (mean c, loadings F, noise variances ψ) as float64 tensors on the device."""
        raise NotImplementedError

    @property
    def mean(self) -> torch.Tensor:
        """c = θ̄ (D,)."""
        return self.snapshot()[0]

    @property
    def loadings(self) -> torch.Tensor:
        """F (D, K)."""
        return self.snapshot()[1]

    @property
    def noise_variance(self) -> torch.Tensor:
        """ψ (D,)."""
        return self.snapshot()[2]


class TorchGaussianModel(SnapshotParts):
    """Base of the torch models (:class:`onlinefa.OnlineEM`, ``OnlineSGA`` and ``VIFA`` with ``device=``): the Gaussian's
    queries and the checkpoints of the NumPy-facing class of the same name.

    Subclasses set ``_engine`` in their constructor (``settings`` with ``n_features`` and ``n_components``,
    ``dtype``, ``device``, ``get_state``, ``from_state``) and define the class attributes below and
    :meth:`snapshot`.
    """

    _engine: Any
    #: Held by every method that reads or changes the state (see the module documentation).
    _lock: threading.RLock

    def __new__(cls: type[Model], *args: Any, **kwargs: Any) -> Model:
        model = super().__new__(cls)
        model._lock = threading.RLock()
        return model

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)  # a lock is not picklable; the copy gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    #: The Rust core class that validates a state map, the engine class that reads one, the NumPy-facing class.
    _core_class: ClassVar[Any]
    _engine_class: ClassVar[Any]
    _numpy_class: ClassVar[Any]

    # -- the model ----------------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        """D."""
        return int(self._engine.settings.n_features)

    @property
    def n_components(self) -> int:
        """K."""
        return int(self._engine.settings.n_components)

    @property
    def device(self) -> torch.device:
        """Where the D-sized state lives."""
        device: torch.device = self._engine.device
        return device

    @property
    def dtype(self) -> torch.dtype:
        """The D-sized state's dtype."""
        dtype: torch.dtype = self._engine.dtype
        return dtype

    #: (n_seen, R): the K×K reporting map of a model whose rows are one shard of a larger model, computed over
    #: all the shards after the last update (see ``onlinefa.distributed.ShardedOnlineEM`` with ``device=``); None: the model's own.
    _fixed_map: tuple[int, np.ndarray] | None = None

    def _report_map(self, n_seen: int, f: torch.Tensor, psi: torch.Tensor, n_samples: float) -> np.ndarray:
        """The K×K map R of the spiked-model shrinkage of the reported loadings (see :class:`onlinefa.OnlineEM`,
        ``shrink``), from the Gram Fᵀ Ψ⁻¹ F of the rows (f, ψ) as fitted."""
        if self._fixed_map is not None and self._fixed_map[0] == n_seen:
            return self._fixed_map[1]
        out: np.ndarray = _core.spiked_transform(factor_gram(f, psi), int(f.shape[0]), n_samples)
        return out

    @locked
    def sample(self, n_samples: int = 1, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draws θ = c + F h + ψ^{1/2} ⊙ z (h, z standard normal) on the device, shape (n_samples, D)."""
        mean, f, psi = self.snapshot()
        h = torch.randn(n_samples, self.n_components, dtype=torch.float64, device=self.device, generator=generator)
        z = torch.randn(n_samples, self.n_features, dtype=torch.float64, device=self.device, generator=generator)
        return mean + h @ f.T + z * psi.sqrt()

    # -- checkpoints --------------------------------------------------------------------------------------
    @locked
    def get_state(self) -> dict[str, Any]:
        """The state map of the NumPy-facing class of the same name (NumPy arrays and scalars): ``to_numpy``
        and ``save`` use it, and it loads into either class."""
        state: dict[str, Any] = self._engine.get_state()
        return state

    @classmethod
    def from_state(cls: type[Model], state: dict[str, Any], *, device: str | torch.device = "cpu") -> Model:
        """The model of a state map of either class; the Rust core validates it first (ValueError)."""
        checked = cls._core_class.from_state(dict(state)).get_state()
        model = cls.__new__(cls)
        model._engine = cls._engine_class.from_state(checked, torch.device(device))
        return model

    def to(self, device: str | torch.device | None) -> Any:
        """The same model with its rows on ``device``: None for the Rust core's host rows (NumPy in and out), a
        torch device for tensors there. ``self`` when the rows are already on that device; otherwise a new model
        (this one unchanged), whose updates continue as this one's would."""
        if device is None:
            return self.to_numpy()
        target = torch.device(device)
        if target == self.device:
            return self
        return type(self).from_state(self.get_state(), device=target)

    def to_numpy(self) -> Any:
        """The same model as the NumPy-facing class (Rust core, host memory); updates continue alike."""
        model = self._numpy_class.__new__(self._numpy_class)
        model.__setstate__({"class": self._numpy_class.__name__, "state": self.get_state()})
        return model

    @classmethod
    def from_numpy(cls: type[Model], model: Any, *, device: str | torch.device = "cpu") -> Model:
        """The same model as a model of the NumPy-facing class, with its state moved to ``device``."""
        if not isinstance(model, cls._numpy_class):
            raise TypeError(f"expected an onlinefa.{cls._numpy_class.__name__}, got {type(model).__name__}")
        if isinstance(model, TorchGaussianModel):
            return cls.from_state(model.get_state(), device=device)
        return cls.from_state(model.__getstate__()["state"], device=device)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a checkpoint that :func:`onlinefa.load` (the NumPy-facing class) and :meth:`load` read."""
        self.to_numpy().save(path)

    @classmethod
    def load(cls: type[Model], path: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> Model:
        """Read a checkpoint of the NumPy-facing class onto ``device``."""
        return cls.from_numpy(cls._numpy_class.load(path), device=device)


class TorchStreamingModel(TorchGaussianModel):
    """Base of the device forms of :class:`onlinefa.OnlineEM` and :class:`onlinefa.OnlineSGA`: validated batches and
    atomic updates; the engine also has ``n_seen``, ``is_fitted`` and ``step``."""

    # -- updates ------------------------------------------------------------------------------------------
    @locked
    def update(self: Streaming, X: Any) -> Streaming:
        """Apply one sample (shape (D,)) or the rows of an (n, D) batch, in order.

        Tensors on another device are moved to the model's. The whole batch is checked first (shape, NaN,
        infinity, magnitude): a bad batch raises ``ValueError`` and changes nothing. A numerical breakdown
        (:class:`onlinefa.NumericalBreakdownError`) or an interruption (``KeyboardInterrupt``) leaves a model of at
        most ``SNAPSHOT_MAX_ELEMENTS`` state values as it was before the batch, and a larger one as it was before
        the failing row. Input that is no real, dense tensor or array, or that requires grad, raises ``TypeError``
        and changes nothing.
        """
        engine = self._engine
        batch = self._checked_batch(X)
        size = engine.settings.n_features * engine.settings.n_components
        backup = copy.deepcopy(engine) if size <= SNAPSHOT_MAX_ELEMENTS else None
        try:
            for row in batch:
                engine.step(row)
        except BaseException:  # KeyboardInterrupt too: a batch is applied whole or not at all
            if backup is not None:
                self._engine = backup
            raise
        return self

    def _checked_batch(self, X: Any) -> torch.Tensor:
        """``X`` as an (n, D) floating tensor on the model's device; ValueError for a wrong shape, NaN, infinity
        or a value beyond the state dtype's range (naming the first bad row)."""
        engine = self._engine
        batch = as_input_tensor(X, "X").to(device=engine.device)
        if batch.ndim == 1:
            batch = batch[None, :]
        d = engine.settings.n_features
        if batch.ndim != 2 or batch.shape[1] != d:
            raise ValueError(f"X must have shape (n_samples, {d}) or ({d},), got {tuple(batch.shape)}")
        if not batch.is_floating_point():
            batch = batch.to(torch.float64)
        finite = torch.isfinite(batch).all(dim=1)
        too_large = (batch.abs() > MAX_INPUT[engine.dtype]).any(dim=1) & finite
        bad = (~finite | too_large).nonzero()
        if bad.numel():
            row = int(bad[0, 0])
            kind = "NaN or infinity" if not bool(finite[row]) else (
                f"a value with |x| > {MAX_INPUT[engine.dtype]:e} (the largest accepted with "
                f"{str(engine.dtype).removeprefix('torch.')} state)")
            raise ValueError(f"row {row} of X holds {kind}; nothing was applied")
        return batch

    @property
    def n_seen(self) -> int:
        """Samples applied so far."""
        return int(self._engine.n_seen)

    @property
    def n_warmup(self) -> int:
        """Warm-up length (see the class documentation)."""
        return int(self._engine.settings.n_warmup)

    @property
    def is_fitted(self) -> bool:
        """Whether warm-up is over."""
        return bool(self._engine.is_fitted)
