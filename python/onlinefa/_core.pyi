"""Type stubs of the Rust extension ``onlinefa._core`` (engines behind the documented Python classes)."""

from typing import Any, final

import numpy as np
from typing_extensions import Self
from numpy.typing import NDArray

__all__ = ["OnlineEMCore", "OnlineSGACore", "orthonormal_init"]

@final
class OnlineEMCore:
    def __new__(
        cls,
        n_features: int,
        n_components: int,
        *,
        init: NDArray[np.float64] | None,
        seed: int | None,
        n_warmup: int,
        noise_floor: float,
        dtype: str,
        schedule: str,
        tau0: float,
        kappa: float,
        rho: float,
        whiten: bool,
    ) -> Self: ...
    def update(self, x: NDArray[np.float32] | NDArray[np.float64]) -> None: ...
    @property
    def n_seen(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    def mean(self) -> NDArray[np.float64]: ...
    def loadings(self) -> NDArray[np.float64]: ...
    def noise_variance(self) -> NDArray[np.float64]: ...
    def get_state(self) -> dict[str, Any]: ...
    @staticmethod
    def from_state(state: dict[str, Any]) -> Self: ...

@final
class OnlineSGACore:
    def __new__(
        cls,
        n_features: int,
        n_components: int,
        *,
        init: NDArray[np.float64] | None,
        seed: int | None,
        lr: float,
        n_warmup: int,
        noise_floor: float,
        dtype: str,
        schedule: str,
        tau0: float,
        kappa: float,
        rho: float,
    ) -> Self: ...
    def update(self, x: NDArray[np.float32] | NDArray[np.float64]) -> None: ...
    @property
    def n_seen(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    def mean(self) -> NDArray[np.float64]: ...
    def loadings(self) -> NDArray[np.float64]: ...
    def noise_variance(self) -> NDArray[np.float64]: ...
    def get_state(self) -> dict[str, Any]: ...
    @staticmethod
    def from_state(state: dict[str, Any]) -> Self: ...

def orthonormal_init(n_features: int, n_components: int, seed: int) -> NDArray[np.float64]: ...
