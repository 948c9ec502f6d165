"""Shared by the parity tests of the torch models against the Rust core: a test stream, the relative error, and a
tiny network trained with a SnapshotCollector feeding a posterior."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def stream(n: int, d: int, seed: int, scale: float = 1e-2) -> np.ndarray:
    """Correlated rows on a network-weight scale around a non-zero mean."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((d, d)) / np.sqrt(d)
    return (rng.standard_normal((n, d)) @ mixing + rng.standard_normal(d)) * scale


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference over the largest magnitude of the reference ``b``."""
    return float(np.abs(a - b).max() / np.abs(b).max())


#: Parameters of :func:`trained_by_collector`'s network (4 → 8 → 1).
COLLECTED_FEATURES = 4 * 8 + 8 + 8 + 1


def trained_by_collector(posterior: Any) -> Any:
    """``posterior`` after 40 SGD steps of a float64 4 → 8 → 1 network, one snapshot per step (fixed seeds)."""
    from onlinefa.torch import SnapshotCollector

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with SnapshotCollector(posterior, net, every=1).attach(opt):
        for _ in range(40):
            x = torch.randn(16, 4, generator=g, dtype=torch.float64)
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    return posterior


def state_map(model: Any) -> dict[str, Any]:
    """A copy of a torch model's state map (the Rust core's entries)."""
    return {key: value.copy() if isinstance(value, np.ndarray) else value for key, value in model.get_state().items()}


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The two state maps hold the same entries, bit for bit."""
    assert set(a) == set(b)
    for key, value in a.items():
        assert np.array_equal(value, b[key]) if isinstance(value, np.ndarray) else value == b[key], key
