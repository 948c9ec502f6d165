"""Sphinx configuration of the onlinefa API reference.

Build (needs ``pip install ".[docs]"`` or the ``docs`` extra's packages next to an installed onlinefa)::

    python -m sphinx -W --keep-going -b html docs/api build/api-html

The reference is generated from the installed package's numpydoc docstrings (autodoc + napoleon);
``-W`` turns every warning, including an unresolvable cross-reference, into an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onlinefa

project = "onlinefa"
author = "the onlinefa developers"
copyright = "the onlinefa developers"  # noqa: A001 - Sphinx's name
version = release = onlinefa.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
exclude_patterns = ["_build", "_generated"]
html_theme = "alabaster"
html_static_path: list[str] = []

# Docstrings are numpydoc; napoleon renders them (Parameters, Returns, Raises, Attributes, Notes, ...).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The estimators inherit scikit-learn's ``get_params``/``set_params``/...: documented by scikit-learn.
autodoc_inherit_docstrings = True

# Napoleon turns every word of a type field ("ndarray of shape (n_samples, n_features)") into a
# cross-reference; words such as ``n_features`` are also attributes of several classes, which Sphinx reports
# as ambiguous. Those links are noise, not errors, so that one category is silenced (``ref.python``);
# every other warning (broken markup, unknown targets, missing modules, bad signatures) fails the build.
suppress_warnings = ["ref.python"]


def _skip_scikit_learn_members(app: object, what: str, name: str, obj: object, skip: bool, options: object) -> bool | None:
    """Leave out members the estimators inherit from scikit-learn (``set_output``, metadata routing, ...).

    scikit-learn documents them, and their docstrings point into scikit-learn's own reference.
    """
    module = getattr(obj, "__module__", None) or ""
    if module.startswith("sklearn."):
        return True
    return None


def setup(app: object) -> None:
    app.connect("autodoc-skip-member", _skip_scikit_learn_members)  # type: ignore[attr-defined]


def _write_cli_help() -> None:
    """Write ``onlinefa [COMMAND] --help`` to ``_generated/`` for the command-line page (``literalinclude``)."""
    out = Path(__file__).parent / "_generated"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, COLUMNS="100")
    for name, args in {
        "onlinefa": [],
        "fit": ["fit"],
        "info": ["info"],
        "demo": ["demo"],
        "experiment": ["experiment"],
    }.items():
        command = [sys.executable, "-m", "onlinefa.cli", *args, "--help"]
        # Without the separate experiments package, `onlinefa experiment --help` says how to install it.
        done = subprocess.run(command, check=name != "experiment", capture_output=True, text=True, env=env)
        text = done.stdout or done.stderr
        (out / f"cli_{name}.txt").write_text(text, encoding="utf-8")


_write_cli_help()
