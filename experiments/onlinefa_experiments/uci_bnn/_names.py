"""The method names of the benchmark, importable without PyTorch (the command line lists them)."""

from __future__ import annotations

#: Methods in table order, with their labels.
METHODS: dict[str, str] = {
    "map": "MAP",
    "swa": "SWA",
    "swag_diag": "SWAG-diagonal",
    "swag": "SWAG",
    "swag_fa": "SWAG-FA (OnlineEM)",
    "online_sga": "OnlineSGA",
    "vifa": "VIFA",
    "vifa_eb": "VIFA (σ², α learned)",
    "multiswag_fa": "MultiSWAG-FA (5)",
    "ensemble": "Deep ensemble (5)",
    "mc_dropout": "MC dropout",
    "swag_fa_dropout": "SWAG-FA on MC dropout's run",
    "swa_dropout": "SWA on MC dropout's run",
    "slang": "SLANG (L=1)",
    "slang_recipe": "SLANG (L=1, published recipe)",
}
