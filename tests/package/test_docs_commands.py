"""Every command and example in README.md and docs/*.md runs (or is on an explicit, reasoned skip-list).

Fenced ``python`` blocks are executed page by page in one namespace (a page's later blocks use the names
its earlier blocks made), in a temporary directory, after a *prelude* that defines the placeholders the
text leaves to the reader (``X``, ``stream``, ``D``, ...) with small sizes. Fenced shell blocks are split
into commands: cheap ``onlinefa`` commands run through the real entry point; the demo, which takes minutes,
is parsed by the real command-line parser with its handler replaced (so a wrong option still fails here);
``onlinefa experiment`` commands belong to the separate experiments package, whose own suite parses them
the same way (experiments/tests/test_documented_commands.py); the rest is skipped with the reason given in
:data:`SKIPPED_COMMANDS`. Inline ``onlinefa ...`` spans in the prose go through the same dispatcher.

A new block or command that fits none of these rules fails :func:`test_every_block_is_run_or_listed`:
run it, or list it below with its reason.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import _cli_demo
from onlinefa.cli import main

from doc_blocks import Block, fenced_blocks

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "console", "shell", ""}


def inline_commands(path: Path) -> list[str]:
    """``onlinefa ...`` code spans of the prose (fenced blocks removed)."""
    prose = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith("onlinefa ")]


# --- what is not run, and why --------------------------------------------------------------------------

#: Fenced blocks that are not executed: (file, a string only that block contains) -> reason.
SKIPPED_BLOCKS: dict[tuple[str, str], str] = {
    ("swag.md", "train(net, opt, epochs=100)"): (
        "recipe skeleton: `net`, `train`, `steps_per_epoch` and `test_loader` stand for the reader's own "
        "training code; tests/torch/test_swag_recipe.py runs this block as written with small stand-ins for them "
        "(loaders of 1-7 batches)"
    ),
    ("usage.md", "import jax, jax.numpy as jnp"): "JAX is not a dependency of onlinefa or of any of its extras",
    ("usage.md", "from jax.flatten_util import ravel_pytree"): (
        "JAX is not a dependency of onlinefa or of any of its extras"
    ),
    ("distributed.md", "fully_shard(model"): (
        "needs a process group of several ranks (torchrun, NCCL or gloo) and the reader's FSDP model and loader; "
        "tests/distributed/test_distributed_torch.py runs this recipe on spawned gloo ranks"
    ),
    ("distributed.md", "shard_range(n_params"): (
        "needs a process group of several ranks (`dist.get_rank()`); tests/distributed/test_distributed_torch.py runs "
        "shard_range with DDP on spawned gloo ranks"
    ),
    ("usage.md", "net = ...  "): (
        "schematic training loop: `net = ...`, `loader`, `opt` and `loss_fn` are the reader's; the zero-copy "
        "`np.from_dlpack` input it shows is tested in tests/streaming/test_input_layouts.py"
    ),
}

#: Shell commands (by their first words) that are not run, and why.
SKIPPED_COMMANDS: dict[str, str] = {
    "python -m venv": "creates the virtualenv of an install command (CI's fresh virtualenv does this)",
    ". .venv/bin/activate": "part of an install command",
    "pip install": "install command: CI installs the package this way (.ci/run) and the wheel smoke test "
    "installs the built wheel into a fresh virtualenv",
    "pytest": "the test suite itself (run by CI)",
    "maturin build --release": "the fat-LTO release build takes minutes; CI builds this wheel (pip wheel, same "
    "backend and profile) and smoke-tests it in fresh virtualenvs (.ci/run, .ci/wheel_smoke.py)",
    "python -m sphinx": "CI builds the API reference with -W (.ci/run); about a minute",
    "mkdir -p results/": "merges the CSVs of two full experiment runs (hours), which the test suite cannot make",
    "(cat results/": "merges the CSVs of two full experiment runs (hours), which the test suite cannot make",
    "onlinefa experiment": "the experiments are a separate package (experiments/); its suite parses every "
    "documented experiment command with the real parser (experiments/tests/test_documented_commands.py)",
}

#: ``onlinefa`` sub-commands that take minutes: parsed by the real parser, handler not called.
PARSED_ONLY = {
    "demo": "about 30 s at D = 1000; tests/cli/test_cli_demo.py runs it at D = 60",
}

#: Inline spans that are templates (placeholders in capitals or [optional] parts), not commands.
TEMPLATE = re.compile(r"\b[A-Z]{1,}\b|\[")


# --- placeholders for the python blocks ----------------------------------------------------------------

def _factor_rows(n_rows: int, n_features: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((n_features, 3))
    return rng.standard_normal((n_rows, 3)) @ loadings.T + 0.5 * rng.standard_normal((n_rows, n_features))


def _usage_prelude() -> dict[str, Any]:
    X = _factor_rows(300, 24)
    return {"D": 24, "K": 3, "X": X, "stream": list(np.array_split(X, 6))}


def _readme_prelude() -> dict[str, Any]:
    def sgd_iterates() -> Iterator[np.ndarray]:
        rng = np.random.default_rng(0)
        theta = rng.standard_normal(100_000)
        for _ in range(20):
            theta = theta + 0.01 * rng.standard_normal(100_000)
            yield theta

    X = _factor_rows(150, 30)
    X[np.random.default_rng(1).random(X.shape) < 0.05] = np.nan
    return {"sgd_iterates": sgd_iterates, "X_with_nans": X}


def _gfa_prelude() -> dict[str, Any]:
    X = _factor_rows(120, 64)
    labels = ["top"] * 32 + ["bottom"] * 32
    return {"X": X, "X_top": X[:10, :32], "labels": labels, "stream": np.array_split(X, 4)}


def _vbfa_prelude() -> dict[str, Any]:
    X = _factor_rows(120, 30)
    return {"X": X, "batches": np.array_split(X, 4)}


def _vifa_prelude() -> dict[str, Any]:
    X = _factor_rows(200, 12)

    def mean_gradient_of_nll(theta: np.ndarray, batch: np.ndarray) -> np.ndarray:
        # Gaussian likelihood with unit variance around θ: ∇θ of the mean NLL is θ − mean(batch).
        return theta - batch.mean(axis=0)

    return {"D": 12, "K": 2, "alpha": 1.0, "N": len(X), "X": X, "batches": np.array_split(X, 20),
            "mean_gradient_of_nll": mean_gradient_of_nll}


def _usage_interop_prelude(namespace: dict[str, Any]) -> None:
    """``net`` of the to_torch block: any module with D = em.n_features parameters."""
    import torch

    net = torch.nn.Module()
    net.theta = torch.nn.Parameter(torch.zeros(namespace["em"].n_features))
    namespace["net"] = net


def _usage_lightning_prelude(namespace: dict[str, Any]) -> None:
    """``model``, ``train_loader`` and ``test_loader`` of the trainer-callback block: a tiny regression run."""
    import warnings

    import lightning
    import torch

    class Regressor(lightning.pytorch.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def forward(self, x: Any) -> Any:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(64, 3)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    namespace.update(model=Regressor(), train_loader=torch.utils.data.DataLoader(data, batch_size=16),
                     test_loader=[x[:16]])
    # Lightning's advice for tiny runs (data-loader workers, no GPU) is not what the example shows.
    warnings.filterwarnings("ignore", module="lightning")


PRELUDES: dict[str, Any] = {
    "README.md": _readme_prelude,
    "usage.md": _usage_prelude,
    "gfa.md": _gfa_prelude,
    "vbfa.md": _vbfa_prelude,
    "vifa.md": _vifa_prelude,
    "whitening.md": lambda: {"D": 20, "K": 3, "onlinefa": onlinefa},
}

#: Extra set-up right before one block, by (file, marker), given the page's namespace so far.
BLOCK_SETUP: dict[tuple[str, str], Any] = {
    ("usage.md", "params = to_torch_low_rank(em)"): _usage_interop_prelude,
    # The checkpoint block uses `pickle` as the prose around it does, without importing it.
    ("usage.md", "blob = pickle.dumps(em)"): lambda namespace: namespace.update(pickle=__import__("pickle")),
    ("usage.md", "swag = PosteriorCallback("): _usage_lightning_prelude,
}

#: Blocks that need an optional package (of the ``test`` extra): (file, marker) -> module.
NEEDS: dict[tuple[str, str], str] = {
    ("usage.md", "params = to_torch_low_rank(em)"): "torch",
    ("usage.md", "SnapshotCollector(posterior"): "torch",
    ("usage.md", "chosen = select_scale(linearized_predictions(net, posterior, val"): "torch",
    ("usage.md", "reg_posterior = onlinefa.OnlineEM("): "torch",
    ("usage.md", "to_scipy(em)"): "scipy",
    ("vifa.md", "vifa_regression_step(vi, net"): "torch",
    ("usage.md", "swag = PosteriorCallback("): "lightning",
}


def skip_reason(block: Block) -> str | None:
    reason: str | None = block.lookup(SKIPPED_BLOCKS)
    return reason


# --- shell commands --------------------------------------------------------------------------------------

def shell_commands(block: Block) -> list[str]:
    """The commands of a shell block: one per line, ``&&`` chains split, comments dropped."""
    commands = []
    for line in block.code.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        commands.extend(part.strip() for part in line.split("&&") if part.strip())
    return commands


def command_skip_reason(command: str) -> str | None:
    for prefix, reason in SKIPPED_COMMANDS.items():
        if command.startswith(prefix):
            return reason
    return None


def run_onlinefa(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run (or, for :data:`PARSED_ONLY` sub-commands, parse) one ``onlinefa`` command line."""
    argv = shlex.split(command)[1:]
    called: list[str] = []
    if argv and argv[0] in PARSED_ONLY and "--help" not in argv:
        monkeypatch.setattr(_cli_demo, "run", lambda args: called.append("demo") or 0)
    try:
        code = main(argv)
    except SystemExit as exit_:  # --help / --version, or an argparse error (code 2)
        code = int(exit_.code or 0)
    assert code == 0, f"`{command}` exited with {code}"
    if argv and argv[0] in PARSED_ONLY and "--help" not in argv:
        assert called, f"`{command}` did not reach its handler"


@pytest.fixture
def doc_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory with the files the documented commands name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    np.save(tmp_path / "samples.npy", _factor_rows(200, 16))
    return tmp_path


SHELL_BLOCKS = [b for path in DOC_FILES for b in fenced_blocks(path) if b.language in SHELL_LANGUAGES]
PYTHON_PAGES = sorted({b.path for path in DOC_FILES for b in fenced_blocks(path) if b.language == "python"})


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: f"{b.path.name}:{b.line}")
def test_shell_block_runs(block: Block, doc_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for command in shell_commands(block):
        if command_skip_reason(command) is not None:
            continue
        assert command.startswith("onlinefa "), f"{block.path.name}:{block.line}: no rule for `{command}`"
        run_onlinefa(command, monkeypatch)
    for command in shell_commands(block):
        if command.startswith("onlinefa fit") and "-o" in shlex.split(command):
            output = shlex.split(command)[shlex.split(command).index("-o") + 1]
            assert onlinefa.load(output).n_seen == 200  # the checkpoint the docs promise reads back


#: The inline commands (``onlinefa experiment`` spans are parsed by the experiments package's suite instead).
INLINE = sorted({(path.name, span) for path in DOC_FILES for span in inline_commands(path)
                 if not span.startswith("onlinefa experiment")})


@pytest.mark.parametrize(("page", "span"), INLINE, ids=[f"{p}:{s}" for p, s in INLINE])
def test_inline_command_runs(page: str, span: str, doc_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if TEMPLATE.search(span.removeprefix("onlinefa ")):
        pytest.skip("a template with placeholders (NAME, K, MODEL, [options]); its concrete uses are run")
    if span.split()[1:2] == ["fit"] and not any(word.endswith(".npy") for word in span.split()):
        pytest.skip("names the sub-command or one of its options; `onlinefa fit` runs in the usage.md block")
    run_onlinefa(span, monkeypatch)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch single-threaded meanwhile: the tiny networks of the examples only lose time to thread
    start-up and spinning on a loaded 2-core machine (12 s instead of 2.5 s)."""
    if "torch" not in installed_optional_modules():
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def installed_optional_modules() -> set[str]:
    """Optional modules the runnable examples need and that are installed."""
    import importlib.util

    return {name for name in set(NEEDS.values()) if importlib.util.find_spec(name) is not None}


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, doc_workdir: Path, one_torch_thread: None) -> None:
    prelude = PRELUDES.get(page.name)
    namespace: dict[str, Any] = {"__name__": "__docs__", **(prelude() if prelude else {})}
    for block in fenced_blocks(page):
        if block.language != "python" or skip_reason(block) is not None:
            continue
        module = block.lookup(NEEDS)
        if module is not None:
            pytest.importorskip(module)
        setup = block.lookup(BLOCK_SETUP)
        if setup is not None:
            setup(namespace)
        code = compile(block.code, f"{page.name}:{block.line}", "exec")
        exec(code, namespace)  # noqa: S102 - the documentation's own examples


@pytest.mark.parametrize("table", [SKIPPED_BLOCKS, BLOCK_SETUP, NEEDS], ids=["skipped", "setup", "needs"])
def test_table_entries_name_one_block_each(table: dict[tuple[str, str], Any]) -> None:
    """No stale or ambiguous entry: each (file, marker) matches exactly one fenced block."""
    blocks = [b for path in DOC_FILES for b in fenced_blocks(path)]
    for (name, marker), value in table.items():
        matches = [b for b in blocks if b.path.name == name and marker in b.code]
        assert len(matches) == 1, f"{(name, marker)} matches {len(matches)} blocks"
        assert value


def test_every_skipped_command_prefix_is_used() -> None:
    commands = [c for block in SHELL_BLOCKS for c in shell_commands(block)]
    for prefix in SKIPPED_COMMANDS:
        assert any(c.startswith(prefix) for c in commands), f"stale entry {prefix!r}"


def test_every_block_has_a_rule() -> None:
    """A block in another language (no rule to run it) must be added to the rules above."""
    for path in DOC_FILES:
        for block in fenced_blocks(path):
            assert block.language in SHELL_LANGUAGES | {"python"}, f"{block.path.name}:{block.line}"


def package_modules() -> list[str]:
    """The modules of onlinefa with ``>>>`` examples, outside ``onlinefa.torch`` (tests/torch/test_torch.py runs
    those); found from the source files, without importing."""
    package = Path(onlinefa.__file__).parent
    names = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
        if relative.parts[1:2] != ("torch",) and ">>>" in path.read_text(encoding="utf-8"):
            names.append(".".join(relative.parts).removesuffix(".__init__"))
    return names


@pytest.mark.parametrize("module_name", package_modules())
def test_docstring_examples_run(module_name: str, doc_workdir: Path) -> None:
    """The ``>>>`` examples of the docstrings (the API reference shows them) give the output they show."""
    import doctest
    import importlib

    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
