"""onlinefa: online factor analysis of very high-dimensional streams, with a Rust core.

Fits N(c, F Fᵀ + Ψ) (F: D×K loadings, Ψ diagonal) to a stream of vectors — typically the parameter
vectors an SGD run visits (SWAG-style posteriors) — without ever forming a D×D matrix.

Thesis symbols (Brownlie 2021) and their names here:

====================  =====================  =========================================
thesis                attribute              shape
====================  =====================  =========================================
c, θ̄_t, θ_SWA         ``mean``               (D,)
F                     ``loadings``           (D, K)
ψ = diag Ψ            ``noise_variance``     (D,)
t                     ``n_seen``             int
D, K                  ``n_features``, ``n_components``
====================  =====================  =========================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._loader import load
from .errors import NotFittedError, NumericalBreakdownError
from .streaming import OnlineEM, OnlineSGA
from .minibatch import MiniBatchEM, fit_minibatch
from .rotation import canonical_loadings
from .vifa import VIFA

if TYPE_CHECKING:
    from .estimator import OnlineFactorAnalysis
    from .vbfa import VBFA, OnlineVBFA
    from .gfa import GFA
    from .online_gfa import OnlineGFA

try:  # one source of the version: Cargo.toml, which maturin writes into the package's metadata
    from importlib.metadata import version as _distribution_version

    __version__ = _distribution_version("onlinefa")
except Exception:  # pragma: no cover - running from a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "GFA", "MiniBatchEM", "NotFittedError", "NumericalBreakdownError", "OnlineEM", "OnlineFactorAnalysis", "OnlineGFA", "OnlineSGA", "OnlineVBFA", "VBFA", "VIFA", "__version__", "canonical_loadings", "fit_minibatch", "load",
]  # fmt: skip


#: Classes imported on first use: they import scikit-learn when that is installed, and ``import onlinefa``
#: must stay NumPy-only.
_LAZY_CLASSES = ("OnlineFactorAnalysis", "VBFA", "OnlineVBFA", "GFA", "OnlineGFA")


def __getattr__(name: str) -> Any:
    if name in _LAZY_CLASSES:
        from ._registry import kind_named

        kind = kind_named(name)
        assert kind is not None, name  # every lazy class is a registered model kind
        return kind.model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
