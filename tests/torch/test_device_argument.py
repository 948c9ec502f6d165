"""One public class per algorithm: ``device=`` on onlinefa.OnlineEM, OnlineSGA, VIFA and the sharded models.

A device model is the library's class to ``isinstance``, takes and gives torch tensors on its device, moves to
and from the Rust core with ``to`` (the same model: continued updates agree with the model that never moved),
and loads any checkpoint onto a device. The old ``onlinefa.torch`` names say where the classes went.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
import onlinefa.torch  # noqa: E402
from onlinefa import distributed  # noqa: E402
from device_parity import relative, stream  # noqa: E402

D, K = 12, 3
VIFA_OPTIONS: dict[str, Any] = {"prior_precision": 1.0, "lr_mean": 1e-2, "lr_loadings": 1e-2,
                                "lr_log_noise": 1e-2, "optimizer": "adam", "seed": 3}


def host(values: Any) -> np.ndarray:
    return np.asarray(values.cpu().numpy() if isinstance(values, torch.Tensor) else values, dtype=np.float64)


def streaming_model(name: str, device: Any) -> Any:
    return getattr(onlinefa, name)(D, K, seed=0, device=device)


@pytest.mark.parametrize("name", ["OnlineEM", "OnlineSGA"])
def test_a_device_model_is_the_public_class_with_tensors_in_and_out(name: str) -> None:
    public = getattr(onlinefa, name)
    rows = stream(60, D, seed=1)
    on_device = streaming_model(name, "cpu").update(torch.as_tensor(rows))
    on_core = streaming_model(name, None).update(rows)
    assert isinstance(on_device, public) and isinstance(on_core, public)
    assert type(on_core) is public and type(on_device) is not public
    assert isinstance(on_device.loadings, torch.Tensor) and isinstance(on_core.loadings, np.ndarray)
    assert on_device.device == torch.device("cpu")
    assert repr(on_device).startswith(f"onlinefa.{name}(") and "device='cpu'" in repr(on_device)
    for got, want in zip(on_device.snapshot(), on_core.snapshot()):
        assert relative(host(got), want) < 1e-10


@pytest.mark.parametrize("name", ["OnlineEM", "OnlineSGA"])
def test_to_moves_a_model_between_row_stores_and_updates_continue_alike(name: str) -> None:
    first, second = stream(40, D, seed=2), stream(30, D, seed=3)
    never_moved = streaming_model(name, None).update(first).update(second)
    moved = streaming_model(name, None).update(first).to("cpu")
    assert moved.n_seen == 40 and isinstance(moved.mean, torch.Tensor)
    back = moved.update(torch.as_tensor(second)).to(None)
    assert type(back) is getattr(onlinefa, name) and back.n_seen == 70
    for got, want in zip(back.snapshot(), never_moved.snapshot()):
        assert relative(got, want) < 1e-10
    assert back.to(None) is back and moved.to("cpu") is moved


@pytest.mark.parametrize("name", ["OnlineEM", "OnlineSGA"])
def test_a_checkpoint_loads_onto_any_device(name: str, tmp_path: Path) -> None:
    path = tmp_path / "model.npz"
    model = streaming_model(name, "cpu").update(torch.as_tensor(stream(50, D, seed=4)))
    model.save(path)
    for loaded in (getattr(onlinefa, name).load(path, device="cpu"), onlinefa.load(path, device="cpu")):
        assert isinstance(loaded, getattr(onlinefa, name)) and isinstance(loaded.loadings, torch.Tensor)
        assert torch.equal(loaded.loadings, model.loadings)
    on_core = onlinefa.load(path)
    assert type(on_core) is getattr(onlinefa, name)
    assert relative(on_core.loadings, host(model.loadings)) < 1e-12
    copy = pickle.loads(pickle.dumps(model))
    assert isinstance(copy, getattr(onlinefa, name)) and torch.equal(copy.loadings, model.loadings)


def test_the_thesis_constructors_take_a_device() -> None:
    rows = stream(120, D, seed=5)
    em = onlinefa.OnlineEM.algorithm2(D, K, seed=0, device="cpu").update(torch.as_tensor(rows))
    reference = onlinefa.OnlineEM.algorithm2(D, K, seed=0).update(rows)
    assert relative(host(em.loadings), reference.loadings) < 1e-10
    sga = onlinefa.OnlineSGA.algorithm1(D, K, seed=0, device="cpu").update(torch.as_tensor(rows))
    assert relative(host(sga.loadings), onlinefa.OnlineSGA.algorithm1(D, K, seed=0).update(rows).loadings) < 1e-10


def test_vifa_takes_a_device_and_moves_between_row_stores() -> None:
    on_device = onlinefa.VIFA(D, K, device="cpu", **VIFA_OPTIONS)
    assert isinstance(on_device, onlinefa.VIFA) and "device='cpu'" in repr(on_device)
    theta = on_device.sample()
    on_device.step(theta - 1.0)
    back = on_device.to(None)
    assert type(back) is onlinefa.VIFA and back.n_steps == 1
    for got, want in zip(back.snapshot(), on_device.snapshot()):
        assert relative(got, host(want)) < 1e-12
    assert back.to("cpu").n_steps == 1


def test_vifa_from_gaussian_takes_a_device() -> None:
    em = onlinefa.OnlineEM(D, K, seed=0).update(stream(60, D, seed=6))
    start = onlinefa.VIFA.from_gaussian(em, prior_precision=1.0, seed=0, device="cpu")
    reference = onlinefa.VIFA.from_gaussian(em, prior_precision=1.0, seed=0)
    assert isinstance(start, onlinefa.VIFA) and isinstance(start.mean, torch.Tensor)
    assert relative(host(start.loadings), reference.loadings) < 1e-12


@pytest.mark.parametrize("name", ["ShardedOnlineEM", "ShardedOnlineSGA"])
def test_a_sharded_model_on_a_device_answers_as_on_the_rust_core(name: str, tmp_path: Path) -> None:
    rows = stream(40, D, seed=7)
    options: dict[str, Any] = {"allreduce": lambda values: values, "rank": 0, "world_size": 1, "seed": 0}
    on_device = getattr(distributed, name)(D, K, device="cpu", **options).update(torch.as_tensor(rows))
    on_core = getattr(distributed, name)(D, K, **options).update(rows)
    assert type(on_device) is type(on_core) and on_device.dtype == on_core.dtype == "float64"
    assert isinstance(on_device.local_model.loadings, torch.Tensor)
    for got, want in zip(on_device.snapshot(), on_core.snapshot()):
        assert relative(host(got), want) < 1e-10
    queries = stream(3, D, seed=9)
    np.testing.assert_allclose(on_device.log_prob(queries), on_core.log_prob(queries), rtol=1e-10)
    np.testing.assert_allclose(on_device.transform(queries), on_core.transform(queries), rtol=1e-8, atol=1e-12)
    assert relative(on_device.sample(4, seed=1), on_core.sample(4, seed=1)) < 1e-10
    on_device.save(tmp_path / "sharded")
    loaded = getattr(distributed, name).load(tmp_path / "sharded", device="cpu", **{
        key: options[key] for key in ("allreduce", "rank", "world_size")})
    assert isinstance(loaded.local_model.loadings, torch.Tensor)
    assert torch.equal(loaded.local_model.loadings, on_device.local_model.loadings)


def test_a_sharded_vifa_on_a_device_steps_and_answers_as_on_the_rust_core(tmp_path: Path) -> None:
    options: dict[str, Any] = {"allreduce": lambda values: values, "rank": 0, "world_size": 1}
    on_device = distributed.ShardedVIFA(D, K, device="cpu", **options, **VIFA_OPTIONS)
    on_core = distributed.ShardedVIFA(D, K, **options, **VIFA_OPTIONS)
    assert type(on_device) is type(on_core)
    target = np.linspace(-1.0, 1.0, D)
    for _ in range(5):  # the same gradient function on each; the draws' noise streams differ between stores
        on_device.step(on_device.sample() - torch.as_tensor(target))
        on_core.step(on_core.sample() - target)
    assert on_device.n_steps == on_core.n_steps == 5
    assert isinstance(on_device.local_model.mean, torch.Tensor)
    # the collective queries of the device rows equal those of the same rows moved to the Rust core
    moved = distributed.ShardedVIFA(D, K, **options, **VIFA_OPTIONS)
    moved._local = on_device.local_model.to(None)
    moved._sync_precision()
    queries = stream(3, D, seed=10)
    np.testing.assert_allclose(on_device.log_prob(queries), moved.log_prob(queries), rtol=1e-10)
    np.testing.assert_allclose(on_device.transform(queries), moved.transform(queries), rtol=1e-8, atol=1e-12)
    on_device.save(tmp_path / "vifa")
    loaded = distributed.ShardedVIFA.load(tmp_path / "vifa", device="cpu", **options)
    assert torch.equal(loaded.local_model.loadings, on_device.local_model.loadings)
    np.testing.assert_allclose(loaded.log_prob(queries), moved.log_prob(queries), rtol=1e-10)


def test_the_old_torch_names_say_where_the_classes_went() -> None:
    for name, new in [("OnlineEM", "onlinefa.OnlineEM"), ("VIFA", "onlinefa.VIFA"),
                      ("ShardedOnlineSGA", "onlinefa.distributed.ShardedOnlineSGA")]:
        with pytest.raises(AttributeError, match=f"is now {new}\\(\\.\\.\\., device=\\.\\.\\.\\)"):
            getattr(onlinefa.torch, name)


def test_a_model_without_a_device_form_refuses_one(tmp_path: Path) -> None:
    path = tmp_path / "vbfa.npz"
    onlinefa.OnlineVBFA(K, random_state=0).partial_fit(stream(60, D, seed=8)).save(path)
    with pytest.raises(TypeError, match="no device form"):
        onlinefa.load(path, device="cpu")

    class Custom(onlinefa.OnlineEM):
        pass

    with pytest.raises(TypeError, match="does not take device="):
        Custom(D, K, device="cpu")
    assert isinstance(Custom(D, K, seed=0), onlinefa.OnlineEM)


def test_a_bad_device_is_refused_and_no_model_is_made() -> None:
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        onlinefa.OnlineEM(D, K, device="no-such-device")
