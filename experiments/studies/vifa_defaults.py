"""Measure VIFA's learning-rate choices and the learned noise variance on small UCI regression networks.

For each data set and split seed: a one-hidden-layer MLP (50 ReLU units) is trained by SGD with momentum
on the standardised training split (90 %), SWAG-FA (``onlinefa.OnlineEM``, K = 10) is collected with
``onlinefa.torch.SnapshotCollector`` (one snapshot per epoch), and VIFA is started from it with
``VIFA.from_gaussian`` under several learning-rate settings, with σ² fixed at the training mean squared
residual of θ_SWA or learned with ``onlinefa.torch.GaussianNoise`` (``learned``), and with the prior
precision learned too (``learned+prior``: ``vifa_regression_step(..., learn_prior_precision=True)``, started
from α = λN/σ²). Printed: the test NLL per point in the
original target units (Gaussian mixture over 100 draws), one CSV row per setting.

    nice -n 10 python experiments/studies/vifa_defaults.py --datasets boston concrete energy yacht --seeds 0 1 2

``--grid`` adds the rate grid the ``"auto"`` rule was chosen from, ``--only NAME ...`` runs only the named
settings. The measured rows are in ``experiments/results/vifa_defaults/`` (``table.csv``: the table of
``docs/design/vifa.md``, "A VIFA you can run"; ``grid.csv``: the first grid); the rows labelled "auto" there are
``VIFA.from_gaussian``'s current defaults.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

import onlinefa
from onlinefa._demo_mlp import load_split
from onlinefa.torch import GaussianNoise, ParameterVector, SnapshotCollector, vifa_regression_step, vifa_step

HIDDEN, WD, LR, BATCH, PRE_EPOCHS, COLLECT_EPOCHS, K, VIFA_EPOCHS, DRAWS = 50, 1e-3, 0.01, 32, 300, 50, 10, 50, 100

GRID = False
ONLY: list[str] = []


def net(n_in: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(n_in, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)).double()


def batches(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    return [order[i:i + BATCH] for i in range(0, n, BATCH)]


def test_nll(model: torch.nn.Module, draws: np.ndarray, x: torch.Tensor, y: np.ndarray, var: float, y_scale: float) -> float:
    vector = ParameterVector(model)
    preds = []
    with torch.no_grad():
        for theta in draws:
            vector.assign(theta)
            preds.append(model(x).reshape(-1).numpy())
    p = np.stack(preds)  # (S, n)
    logp = -0.5 * np.log(2 * np.pi * var) - 0.5 * (y[None, :] - p) ** 2 / var
    m = logp.max(axis=0)
    ll = m + np.log(np.mean(np.exp(logp - m), axis=0))
    return float(-(ll.mean()) + math.log(y_scale))


def run(dataset: str, seed: int) -> None:
    split = load_split(dataset, seed)
    torch.manual_seed(seed)
    xtr, ytr = torch.tensor(split.x_train), torch.tensor(split.y_train)
    xte = torch.tensor(split.x_test)
    n, d_in = xtr.shape
    model = net(d_in)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=WD)
    rng = np.random.default_rng(seed)

    def epoch() -> None:
        for idx in batches(n, rng):
            opt.zero_grad()
            loss = 0.5 * ((model(xtr[idx]).reshape(-1) - ytr[idx]) ** 2).mean()
            loss.backward()
            opt.step()

    for _ in range(PRE_EPOCHS):
        epoch()
    D = len(ParameterVector(model))
    em = onlinefa.OnlineEM(D, K, seed=seed)
    collector = SnapshotCollector(em, model, every=-(-n // BATCH), dtype=torch.float64).attach(opt)
    for _ in range(COLLECT_EPOCHS):
        epoch()
    collector.detach()
    swa = em.mean
    vec = ParameterVector(model)
    vec.assign(swa)
    with torch.no_grad():
        sigma2 = float(((model(xtr).reshape(-1) - ytr) ** 2).mean())
    alpha = WD * n / sigma2
    yte = split.y_test
    print(f"{dataset},{seed},swa,-,{test_nll(model, swa[None, :], xte, yte, sigma2, split.y_scale):.4f},{sigma2:.4f},0")
    print(f"{dataset},{seed},swag_fa,-,{test_nll(model, em.sample(DRAWS, seed=1), xte, yte, sigma2, split.y_scale):.4f},{sigma2:.4f},0")
    print(f"{dataset},{seed},sqrt_mean_psi,-,{math.sqrt(float(np.mean(em.noise_variance))):.3g},-,0")
    print(f"{dataset},{seed},rms_mean,-,{math.sqrt(float(np.mean(em.mean**2))):.3g},-,0")
    psi_scale = math.sqrt(float(np.mean(em.noise_variance)))
    rms_mean = math.sqrt(float(np.mean(em.mean**2)))
    settings: dict[str, dict[str, float | str]] = {
        "swag-exp 1e-4/1e-4/1e-2": dict(lr_mean=1e-4, lr_loadings=1e-4, lr_log_noise=1e-2),
        "docs 1e-2/1e-3/1e-2": dict(lr_mean=1e-2, lr_loadings=1e-3, lr_log_noise=1e-2),
        "rms(c) x 0.05 / 0.005 / log-noise 0.01": dict(lr_mean=0.05 * rms_mean, lr_loadings=0.005 * rms_mean,
                                                       lr_log_noise=1e-2),
        "auto": {},  # VIFA.from_gaussian's defaults: rms(c) x 0.01 / 0.001 / log-noise 0.01
    }
    if ONLY:
        settings = {k: v for k, v in settings.items() if k in ONLY}
    if GRID:
        for a in (0.01, 0.03, 0.1):
            for b in (0.01, 0.1):
                settings[f"rms(c) x {a} / log-noise {b}"] = dict(lr_mean=a * rms_mean, lr_loadings=a * rms_mean,
                                                                 lr_log_noise=b)
        for a in (1.0, 3.0):
            settings[f"sqrt(psi) x {a} / log-noise 0.1"] = dict(lr_mean=a * psi_scale, lr_loadings=a * psi_scale,
                                                                lr_log_noise=0.1)
    for name, rates in settings.items():
        for tag in ("fixed", "learned", "learned+prior"):
            learned = tag != "fixed"
            start = time.perf_counter()
            vi = onlinefa.VIFA.from_gaussian(em, prior_precision=alpha, seed=seed, **rates)  # type: ignore[arg-type]
            noise = GaussianNoise(sigma2, lr=1e-2)
            vrng = np.random.default_rng(seed + 100)
            for _ in range(VIFA_EPOCHS):
                for idx in batches(n, vrng):
                    if learned:
                        vifa_regression_step(vi, model, (xtr[idx], ytr[idx]), n_data=n, noise=noise,
                                             learn_prior_precision=tag == "learned+prior")
                    else:
                        vifa_step(vi, model, lambda m, b: 0.5 * ((m(b[0]).reshape(-1) - b[1]) ** 2).mean() / sigma2,
                                  (xtr[idx], ytr[idx]), n_data=n)
            var = noise.variance if learned else sigma2
            nll = test_nll(model, vi.sample(DRAWS, seed=1), xte, yte, var, split.y_scale)
            print(f"{dataset},{seed},{name},{tag},{nll:.4f},{var:.4f},{time.perf_counter() - start:.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", nargs="+", default=["boston", "yacht", "concrete"])
    parser.add_argument("--grid", action="store_true", help="also the rate grid the 'auto' rule was chosen from")
    parser.add_argument("--only", nargs="*", default=[], help="run only these settings (names as printed)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = parser.parse_args()
    global GRID, ONLY
    GRID, ONLY = args.grid, args.only
    torch.set_num_threads(1)
    print("dataset,seed,setting,sigma2,test_nll,sigma2_value,seconds")
    for ds in args.datasets:
        for s in args.seeds:
            run(ds, s)


if __name__ == "__main__":
    main()
