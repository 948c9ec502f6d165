"""Exceptions of onlinefa that are not Python built-ins (a leaf module: it imports only the Rust core).

Errors by kind, for every model: invalid input or hyper-parameters raise ``ValueError``/``TypeError``, a
call in the wrong order ``RuntimeError`` (or ``NotFittedError`` for a query before fitting), a numerical
breakdown of the algorithm :class:`NumericalBreakdownError` (an ``ArithmeticError``), and a state that
cannot be allocated ``MemoryError``. Whatever the kind, the model is left as it was. The sharded models of
:mod:`onlinefa.distributed` add ``ShardCommunicationError`` (a collective failed: a peer died or the process
group's timeout passed); each surviving rank's model is then left as it was before the call, within the size
bound of the state copy documented on each sharded model's ``update``/``step``.
"""

from __future__ import annotations

from ._core import NumericalBreakdownError

__all__ = [
    "CommandError", "ConvergenceWarning", "ModelHeldAtForkError", "NotFittedError", "NumericalBreakdownError",
    "PosteriorResumeError", "ShardCommunicationError", "SlowCollectionWarning",
]


class CommandError(Exception):
    """A user-facing failure of the ``onlinefa`` command: printed as one line, exit code 2, no traceback."""


class ConvergenceWarning(UserWarning):
    """A fit stopped at its iteration limit before its stopping rule was met (the result is usable but not
    converged). With scikit-learn installed the estimators raise a subclass that is also scikit-learn's
    ``ConvergenceWarning``, so either class filters it."""


class NotFittedError(ValueError, AttributeError):
    """A model was asked for its fitted Gaussian before warm-up ended.

    Subclasses both ``ValueError`` and ``AttributeError``, like scikit-learn's ``NotFittedError``.
    """


class ModelHeldAtForkError(RuntimeError):
    """A model's lock was held by another thread of the parent when this process was forked."""


class ShardCommunicationError(RuntimeError):
    """A collective between the ranks failed: a peer process died, or the process group's timeout passed."""


class SlowCollectionWarning(UserWarning):
    """A snapshot costs the training loop more than one training step (forward, backward and optimiser step) (see ``SnapshotCollector``)."""


class PosteriorResumeError(RuntimeError):
    """A trainer callback cannot continue its posterior from the checkpoint a run resumes from: the checkpoint
    holds no posterior (``on_missing="warn"`` goes on with an empty one), or one fitted with other settings
    than the callback's (``on_mismatch="reset"`` starts a new one)."""
