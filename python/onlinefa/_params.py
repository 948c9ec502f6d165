"""scikit-learn's ``get_params``/``set_params``/``repr`` conventions, for classes that must work without it."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing_extensions import Self


class ParamsMixin:
    """``get_params``/``set_params``/``repr`` with scikit-learn's conventions (used without scikit-learn).

    ``_param_attributes`` maps a constructor parameter to the attribute that stores it when the two names
    must differ (e.g. a parameter named like a method).
    """

    _param_attributes: ClassVar[dict[str, str]] = {}

    @classmethod
    def _get_param_names(cls) -> list[str]:
        parameters = inspect.signature(cls.__init__).parameters.values()
        return sorted(p.name for p in parameters if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor parameters of this estimator.

        Parameters
        ----------
        deep : bool, default=True
            Ignored (no sub-estimators); kept for scikit-learn compatibility.

        Returns
        -------
        dict
            Parameter name → value.
        """
        return {name: getattr(self, self._param_attributes.get(name, name)) for name in self._get_param_names()}

    def _check_param_names(self, params: dict[str, Any]) -> None:
        """ValueError naming the valid parameters if ``params`` has an unknown one."""
        valid = self._get_param_names()
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(f"Invalid parameter {unknown[0]!r} for {type(self).__name__}; valid: {valid}")

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters; they take effect at the next ``fit`` (or first ``partial_fit``).

        Parameters
        ----------
        **params
            Parameter name → new value.

        Returns
        -------
        self
        """
        self._check_param_names(params)
        for name, value in params.items():
            setattr(self, self._param_attributes.get(name, name), value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={value!r}" for name, value in self.get_params().items())
        return f"{type(self).__name__}({args})"
