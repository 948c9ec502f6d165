"""The table of model kinds: every model class with a checkpoint is registered once, under its own name and
module, and ``onlinefa.load``, the estimator and ``onlinefa fit`` resolve classes through it."""

from __future__ import annotations

import inspect
import pickle
import pkgutil
import importlib

import numpy as np
import pytest

import onlinefa
from onlinefa import _registry, distributed
from onlinefa._device import device_class


def _package_model_classes() -> dict[str, type]:
    """Every class defined in the package that has ``save`` and ``load``, by ``module:Name`` (the former-module
    shim ``_models`` excluded: it defines nothing)."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(onlinefa.__path__, "onlinefa."):
        if info.name == "onlinefa._models":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and obj.__module__ == info.name and not name.startswith("_")
                    and not name.endswith("Mixin")
                    and callable(getattr(obj, "save", None)) and callable(getattr(obj, "load", None))):
                found[f"{info.name}:{name}"] = obj
    return found


def _device_path(cls: type) -> str | None:
    return cls.__dict__.get("_device_impl") or None


def test_every_class_with_a_checkpoint_is_registered_or_a_form_of_a_registered_one() -> None:
    classes = _package_model_classes()
    registered = {f"{kind.module}:{kind.name}": kind.model_class() for kind in _registry.KINDS}
    for kind in _registry.KINDS:
        assert kind.model_class() is classes[f"{kind.module}:{kind.name}"]
        assert _registry.kind_named(kind.name) is kind
    assert _registry.kind_named("NoSuchModel") is None
    # The sharded models: onlinefa.distributed.Sharded<kind> over a registered kind's class.
    sharded = {f"{cls.__module__}:{name}": cls for name, cls in vars(distributed).items()
               if name.startswith("Sharded") and inspect.isclass(cls) and cls.__name__ == name}
    assert sharded and all(cls._local_class in registered.values() for cls in sharded.values())
    assert {cls.__name__ for cls in sharded.values()} == {f"Sharded{kind.name}" for kind in _registry.KINDS
                                                         if f"Sharded{kind.name}" in vars(distributed)}
    # Device forms (``device=``): named by their public class, and counted as it by isinstance.
    devices: dict[str, type] = {}
    for public in [*registered.values(), *sharded.values()]:
        path = _device_path(public)
        if path is not None:
            device = device_class(path)
            assert issubclass(device, public) and device.__name__ == public.__name__
            if f"{device.__module__}:{device.__name__}" in classes:
                devices[path] = device
    models = {**registered, **sharded, **devices}
    # What is left is a base the models above derive from (the torch models' shared code), never a model.
    bases = {path for path, cls in classes.items() if path not in models
             and any(cls in model.__mro__[1:] for model in models.values())}
    assert set(classes) == set(models) | bases
    assert all(path.startswith("onlinefa.torch.") for path in bases)


def test_streaming_methods_and_inner_models() -> None:
    assert _registry.STREAMING_METHODS == ("em", "sga")
    assert _registry.streaming_class("em") is onlinefa.OnlineEM
    assert _registry.streaming_class("sga") is onlinefa.OnlineSGA
    assert _registry.inner_class("MiniBatchEM") is onlinefa.MiniBatchEM
    assert _registry.inner_class("VIFA") is None  # a checkpoint of the estimator cannot hold it
    for kind in _registry.KINDS:
        if kind.thesis is not None:
            assert callable(getattr(kind.model_class(), kind.thesis))


def test_lazy_public_names_resolve_through_the_table() -> None:
    for name in ("OnlineFactorAnalysis", "VBFA", "OnlineVBFA", "GFA", "OnlineGFA"):
        assert getattr(onlinefa, name) is _registry.kind_named(name).model_class()  # type: ignore[union-attr]
    with pytest.raises(AttributeError):
        onlinefa.NoSuchModel  # type: ignore[attr-defined]  # noqa: B018


def test_load_refuses_a_class_outside_the_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onlinefa.checkpoint import save_state

    path = tmp_path / "unknown.ofa"
    save_state(path, "NoSuchModel", {"x": np.zeros(2)})
    with pytest.raises(ValueError, match="class 'NoSuchModel', which this onlinefa cannot load"):
        onlinefa.load(path)


def test_pickles_naming_the_former_module_still_load() -> None:
    em = onlinefa.OnlineEM(6, 2, seed=0)
    em.update(np.random.default_rng(0).standard_normal((10, 6)))
    data = pickle.dumps(em, protocol=2)  # no frames: the module name can be edited in place
    old = data.replace(b"conlinefa.streaming\nOnlineEM\n", b"conlinefa._models\nOnlineEM\n")
    assert old != data
    restored = pickle.loads(old)
    assert type(restored) is onlinefa.OnlineEM
    np.testing.assert_array_equal(restored.loadings, em.loadings)
