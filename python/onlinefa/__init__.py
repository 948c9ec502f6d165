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

from ._models import OnlineEM, OnlineSGA

__version__ = "0.1.0"

__all__ = ["OnlineEM", "OnlineSGA", "__version__"]
