"""The recipe of docs/guide/swag.md runs as written, also on a loader with fewer batches than snapshots per epoch.

The code is read from the markdown file itself (the fenced block that pre-trains with
``train(net, opt, epochs=100)``), so a change of the page is what this test runs. The names the recipe
leaves to the reader (``net``, ``train``, ``steps_per_epoch``, ``test_loader``) are given small
stand-ins: a 2-layer classifier and in-memory lists of batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doc_blocks import fenced_blocks

torch = pytest.importorskip("torch")

SWAG_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "swag.md"
#: A string only the recipe block contains.
RECIPE_MARKER = "train(net, opt, epochs=100)"
N_CLASSES = 3


def recipe_code() -> str:
    blocks = [b for b in fenced_blocks(SWAG_PAGE) if b.language == "python" and RECIPE_MARKER in b.code]
    assert len(blocks) == 1, f"docs/guide/swag.md has {len(blocks)} python blocks containing {RECIPE_MARKER!r}"
    return blocks[0].code


def reader_names(n_train_batches: int) -> dict[str, Any]:
    """The reader's own objects the recipe refers to: a network, its training loop and the loaders."""
    torch.manual_seed(0)
    centres = 3.0 * torch.randn(N_CLASSES, 4)

    def batches(n_batches: int, size: int = 8) -> list[tuple[Any, Any]]:
        out = []
        for _ in range(n_batches):
            y = torch.randint(0, N_CLASSES, (size,))
            out.append((centres[y] + torch.randn(size, 4), y))
        return out

    train_loader, test_loader = batches(n_train_batches), batches(2)
    # D = 5·4 + 5 + 3·5 + 3 = 43 > K = 20, the rank the recipe asks for.
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, N_CLASSES))

    def train(net: Any, opt: Any, epochs: int) -> None:
        for _ in range(epochs):
            for x, y in train_loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()

    return {"__name__": "__swag_recipe__", "net": net, "train": train,
            "steps_per_epoch": len(train_loader), "test_loader": test_loader}


@pytest.fixture
def one_torch_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("n_train_batches", [1, 3, 4, 7])
def test_recipe_runs_as_written_on_a_small_loader(n_train_batches: int, one_torch_thread: None) -> None:
    namespace = reader_names(n_train_batches)
    exec(compile(recipe_code(), f"{SWAG_PAGE.name}:recipe", "exec"), namespace)  # noqa: S102 - the page's own code

    steps_per_epoch = namespace["steps_per_epoch"]
    every = max(1, steps_per_epoch // 5)
    expected_snapshots = 50 * steps_per_epoch // every  # the recipe collects during 50 epochs
    for collector in namespace["collectors"]:
        assert collector.every == every and not collector.attached
        assert collector.n_snapshots == expected_snapshots
    assert namespace["em"].n_seen == expected_snapshots
    n_test = sum(len(y) for _, y in namespace["test_loader"])
    for name in ("p_em", "p_swag", "p_diag"):
        probabilities = namespace[name]
        assert probabilities.shape == (n_test, N_CLASSES)
        assert bool(torch.isfinite(probabilities).all())
        torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(n_test), rtol=0, atol=1e-6)
