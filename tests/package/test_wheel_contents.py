"""The installed package is the library only: no experiment, benchmark or result file.

maturin packs every file under ``python/onlinefa`` beside the compiled extension, so the source tree is
checked here on every run; CI also builds the abi3 wheel and runs this file with ``ONLINEFA_WHEEL`` naming
it, which lists the wheel itself.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path, PurePosixPath

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "onlinefa"

#: The one data folder the library ships: the four small UCI sets behind ``onlinefa.datasets.load_uci`` and
#: the demo (text files and their README).
DATA = PurePosixPath("onlinefa/data/uci")
#: Folder names that hold research code or results, never the library.
RESEARCH = {"experiments", "onlinefa_experiments", "benches", "results"}


def not_library(name: str) -> str | None:
    """Why the wheel member ``name`` (a POSIX path inside the wheel) is no part of the library, or ``None``."""
    path = PurePosixPath(name)
    if path.parts[0].endswith((".dist-info", ".data")):
        return None
    if path.parts[0] != "onlinefa":
        return "outside the onlinefa package"
    if RESEARCH & set(path.parts):
        return "in a research folder"
    if path.is_relative_to(DATA):
        return None if path.suffix in {".txt", ".md"} else "an unexpected data file"
    if path.suffix in {".py", ".pyi", ".so", ".pyd"} or path.name == "py.typed":
        return None
    return "neither code, stubs nor the library's data"


def test_the_rule_refuses_research_and_result_files() -> None:
    assert not_library("onlinefa/streaming.py") is None
    assert not_library("onlinefa/_core.abi3.so") is None
    assert not_library("onlinefa/data/uci/yacht/data.txt") is None
    assert not_library("onlinefa-0.1.0.dist-info/RECORD") is None
    assert not_library("onlinefa/experiments/swag.py") == "in a research folder"
    assert not_library("onlinefa/data/uci/yacht/results.csv") == "an unexpected data file"
    assert not_library("onlinefa/calibration.png") == "neither code, stubs nor the library's data"
    assert not_library("onlinefa_experiments/__init__.py") == "outside the onlinefa package"


def test_the_package_source_holds_only_the_library() -> None:
    names = [f"onlinefa/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert len(names) > 50  # the tree was really walked
    offenders = {name: why for name in names if (why := not_library(name))}
    assert offenders == {}


@pytest.mark.skipif("ONLINEFA_WHEEL" not in os.environ, reason="CI builds the wheel and names it in ONLINEFA_WHEEL")
def test_the_built_wheel_holds_only_the_library() -> None:
    with zipfile.ZipFile(os.environ["ONLINEFA_WHEEL"]) as wheel:
        names = [info.filename for info in wheel.infolist() if not info.is_dir()]
    assert any(name.startswith("onlinefa/_core") for name in names)
    offenders = {name: why for name in names if (why := not_library(name))}
    assert offenders == {}
