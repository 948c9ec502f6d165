"""The device models on a CUDA GPU (marker ``cuda``; they run wherever a GPU is present and are skipped
elsewhere, since a CPU-only machine cannot run them). ``benches/gpu_check.sh`` runs them on a GPU machine.

On the GPU: the plain torch pass and the fused Triton pass (K ≤ 16) against the Rust core (float64: 1e-10 for
the plain pass, as on the CPU; the fused pass within the bound its interpreter tests hold), checkpoints from
the GPU to the Rust core and back, the collector feeding a GPU model without a host copy, and VIFA's state
staying on the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
import onlinefa.torch  # noqa: E402
from onlinefa.torch._triton_common import SWITCH  # noqa: E402
from device_parity import relative, stream  # noqa: E402

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benches/gpu_check.sh)")]

D, K = 300, 6


def covariance(model: object) -> np.ndarray:
    _, loadings, psi = model.snapshot()  # type: ignore[attr-defined]
    f = np.asarray(loadings.cpu().numpy() if isinstance(loadings, torch.Tensor) else loadings, dtype=np.float64)
    p = np.asarray(psi.cpu().numpy() if isinstance(psi, torch.Tensor) else psi, dtype=np.float64)
    return np.asarray(f @ f.T + np.diag(p))


@pytest.mark.parametrize("name", ["OnlineEM", "OnlineSGA"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_gpu_model_equals_the_rust_core(name: str, fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "1" if fused else "0")
    rows = stream(200, D, seed=0)
    gpu = getattr(onlinefa, name)(D, K, seed=0, device="cuda").update(torch.as_tensor(rows, device="cuda"))
    rust = getattr(onlinefa, name)(D, K, seed=0).update(rows)
    assert gpu.device.type == "cuda" and gpu.loadings.device.type == "cuda"
    assert relative(covariance(gpu), covariance(rust)) < (1e-8 if fused else 1e-10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_gpu_posterior_moves_to_the_host_and_back(dtype: str, tmp_path: Path) -> None:
    rows = stream(120, D, seed=1)
    gpu = onlinefa.OnlineEM(D, K, seed=0, dtype=dtype, device="cuda").update(torch.as_tensor(rows, device="cuda"))
    path = tmp_path / "posterior.npz"
    gpu.save(path)
    host = onlinefa.load(path)
    assert type(host) is onlinefa.OnlineEM
    np.testing.assert_array_equal(covariance(host), covariance(gpu.to(None)))
    again = host.to("cuda")
    more = stream(30, D, seed=2)
    again.update(torch.as_tensor(more, device="cuda"))
    host.update(more)
    tolerance = 1e-10 if dtype == "float64" else 1e-5
    assert relative(covariance(again), covariance(host)) < tolerance


def test_the_collector_feeds_a_gpu_model_on_the_gpu() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    d = sum(p.numel() for p in net.parameters())
    posterior = onlinefa.OnlineEM(d, 3, seed=0, device="cuda")
    reference = onlinefa.OnlineEM(d, 3, seed=0)
    collector = onlinefa.torch.SnapshotCollector(posterior, net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.randn(64, 8, device="cuda"), torch.randn(64, 1, device="cuda")
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        collector.collect()
        reference.update(collector.parameter_vector.numpy())
    assert posterior.n_seen == reference.n_seen == 40
    assert relative(covariance(posterior), covariance(reference)) < 1e-8


def test_vifa_keeps_its_state_and_draws_on_the_gpu() -> None:
    vi = onlinefa.VIFA(D, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2,
                       optimizer="adam", seed=0, device="cuda")
    mu = torch.linspace(-1.0, 1.0, D, dtype=torch.float64, device="cuda")
    for _ in range(50):
        theta = vi.sample()
        assert theta.device.type == "cuda"
        vi.step(theta - mu)
    assert vi.mean.device.type == "cuda" and vi.n_steps == 50
    host = vi.to(None)
    assert relative(covariance(host), covariance(vi)) < 1e-12
