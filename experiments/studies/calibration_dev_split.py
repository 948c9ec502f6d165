"""Width rules and an input-null-space prior for the recommended digits recipe, judged on a development split.

No test row is read. Per seed, the benchmark's digits training split (80 % of the rows, the same split as
``onlinefa experiment calibration``) is split again: fit rows (70/80) train the network and feed the posterior,
validation rows (10/80) choose the covariance scale, and development rows (20/80) are evaluated, clean and
with shifted sets built from them exactly as the benchmark builds its test's (pixel noise 0.1/0.2/0.4, ±15°
rotation, one-pixel translation). Same MLP, SGD budget and collection as the benchmark.

Methods: ``swa``; ``laplace`` (laplace-torch's default on the last iterate; needs ``pip install laplace-torch``,
otherwise left out); the linearised predictive of the OnlineEM Gaussian at the scale of ``select_scale``'s
default rule (``one_se``) and of its plain maximiser (``max``); and each of these plus a first-layer
**input-null-space prior** (``+null``): for every hidden unit j, δW_j ~ N(0, w σ₀² P), δb_j = −δW_j x̄, with
σ₀² = 1/(3·fan_in) (PyTorch's initial variance of ``Linear`` weights), P the projector onto the eigen-directions
of the fit rows' input covariance below 10⁻³ of its largest eigenvalue, x̄ their mean, and w the covariance
scale s (the term then widens with the rest of the covariance). On inputs like the fit rows x − x̄ has no
component in those directions, so the term changes nothing there; off them it adds output variance.
``+null_all_<w>`` puts the same prior on every ``Linear`` at once, each on the null directions of the inputs it
receives from the layer below on the fit rows (the ``Linear`` inputs at θ_SWA), with a fixed weight w
(``NULL_ALL_WEIGHTS``), and ``+null_all_s`` with w = s.

``subspace_laplace`` replaces the fitted covariance's shape by the curvature's: with P an orthonormal basis of
the span of F, the Laplace posterior restricted to θ = c + P z, z ~ N(0, (G + α I)⁻¹), G = Σ_n (J_n P)ᵀ
(diag p_n − p_n p_nᵀ) (J_n P) the generalised Gauss-Newton matrix of the fit rows in that subspace (K
Jacobian-vector products per batch), α the prior precision of z by MacKay's evidence fixed point
α = γ / ‖Pᵀ c‖², γ = Σ_k g_k / (g_k + α) (g_k the eigenvalues of G), predicted linearised at scale 1 (no
validation row used), and ``subspace_laplace_one_se`` the same at the default rule's scale. ``mixture`` is the
equal mixture of the ``max`` and ``one_se`` predictives (a two-point prior on the scale). ``one_se+T`` and
``max+T`` choose a softmax temperature with the scale (``select_scale(..., temperature=True)``; the recipe is
``one_se+T``), and ``swa+T`` is temperature scaling of SWA's logits alone (no covariance).

    python experiments/studies/calibration_dev_split.py --seeds 3
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from onlinefa.torch import (LinearizedPredictions, ParameterVector, ScaleSelection, linearized_predictions,
                            select_scale)
from onlinefa.torch._linearized import _Linearization
from onlinefa_experiments._calibration import classification_nll
from onlinefa_experiments._calibration_data import SPLIT_SEED, TEST_FRACTION, _shifted_sets
from onlinefa_experiments._calibration_runs import (Budget, Split, assign_mean, batch_orders, linearized_predictor,
                                                    scaling_temperature, train_sgd)

N_DRAWS = 30
BUDGET = Budget(hidden=(200, 200), epochs=150, collect_epochs=50, lr=0.05, batch_size=32, snapshots_per_epoch=5,
                rank=20, n_draws=N_DRAWS)
#: Eigenvalues of the input covariance below this fraction of the largest span the "null" directions.
NULL_FRACTION = 1e-3
#: Fixed weights w of the every-layer null-space prior (``+null_all_<w>``), besides w = s (``+null_all_s``).
NULL_ALL_WEIGHTS = (1.0, 10.0, 30.0, 300.0, 1000.0, 3000.0)
Predictor = Callable[[torch.Tensor], np.ndarray]


def development_split(x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    """(x_fit, y_fit, x_val, y_val, x_dev, y_dev): the benchmark's training split (80 %) of (x, y) cut into fit
    rows (70/80), validation rows (10/80) and development rows (20/80), stratified, by seeds of ``seed``."""
    x_tr, _, y_tr, _ = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    x_rest, x_dev, y_rest, y_dev = train_test_split(x_tr, y_tr, test_size=0.25, random_state=100 + seed,
                                                    stratify=y_tr)
    x_fit, x_val, y_fit, y_val = train_test_split(x_rest, y_rest, test_size=1 / 7, random_state=200 + seed,
                                                  stratify=y_rest)
    return x_fit, y_fit, x_val, y_val, x_dev, y_dev


def development_sets(seed: int) -> tuple[Split, dict[str, tuple[torch.Tensor, np.ndarray]]]:
    """The fit/validation split and the development sets (clean and shifted), standardised by the fit rows."""
    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    x_fit, y_fit, x_val, y_val, x_dev, y_dev = development_split(x, y, seed)
    centre, spread = x_fit.mean(), x_fit.std()

    def scaled(values: np.ndarray) -> torch.Tensor:
        return torch.tensor((values - centre) / spread, dtype=torch.float32)

    split = Split(scaled(x_fit), torch.tensor(y_fit), scaled(x_val), torch.tensor(y_val))
    shifted = _shifted_sets(x_dev, y_dev, np.random.default_rng(300 + seed))
    sets = {"clean": (scaled(x_dev), y_dev), **{name: (scaled(xs), ys) for name, (xs, ys) in shifted.items()}}
    return split, sets


def layer_inputs(module: torch.nn.Module, inputs: torch.Tensor) -> dict[torch.nn.Linear, np.ndarray]:
    """The inputs each ``Linear`` of ``module`` receives on ``inputs`` (float64, one row per input row)."""
    seen: dict[torch.nn.Linear, np.ndarray] = {}
    hooks = [layer.register_forward_hook(lambda layer, args, _: seen.__setitem__(layer, args[0].double().numpy()))
             for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    try:
        with torch.no_grad():
            module(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def null_deviations(module: torch.nn.Module, split: Split, n_draws: int, seed: int, fraction: float,
                    every_layer: bool) -> torch.Tensor:
    """``n_draws`` flat parameter deviations of the input-null-space prior, on the first ``Linear`` or on every
    one: for each such layer δW = σ₀ Z P and δb = −δW ā, with P the projector onto the directions its inputs on
    the fit rows do not vary in (eigenvalues of their covariance below ``fraction`` of the largest), ā their
    mean and σ₀² = 1/(3·fan_in); zero elsewhere."""
    vector = ParameterVector(module)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.zeros(n_draws, len(vector))
    offsets, start = {}, 0
    for tensor in vector.parameters:
        offsets[id(tensor)] = start
        start += tensor.numel()
    layers = list(layer_inputs(module, split.x_train).items())
    for layer, seen in layers if every_layer else layers[:1]:
        eigenvalues, eigenvectors = np.linalg.eigh(np.cov(seen.T))
        null = eigenvectors[:, eigenvalues < fraction * eigenvalues.max()]
        projector = torch.tensor(null @ null.T, dtype=torch.float32)
        a_bar = torch.tensor(seen.mean(axis=0), dtype=torch.float32)
        prior_sd = (1.0 / (3.0 * layer.in_features)) ** 0.5
        w0, b0 = offsets[id(layer.weight)], offsets[id(layer.bias)]
        for draw in draws:
            d_w = prior_sd * torch.randn(layer.out_features, layer.in_features, generator=generator) @ projector
            draw[w0:w0 + d_w.numel()] = d_w.reshape(-1)
            draw[b0:b0 + layer.out_features] = -d_w @ a_bar
    return draws


def trained_with_baselines(seed: int, split: Split, n_classes: int, budget: Budget = BUDGET
                           ) -> tuple[torch.nn.Module, Any, torch.Tensor, dict[str, Predictor]]:
    """The benchmark's network trained on the fit rows, left at θ_SWA: (module, posterior, θ_SWA, predictors of
    ``laplace`` (laplace-torch's default on the last iterate, when installed) and ``swa``)."""
    run = train_sgd(split, n_classes, budget, batch_orders(split.x_train.shape[0], budget, seed), init_seed=seed)
    module, posterior = run.module, run.posterior
    found: dict[str, Predictor] = {}
    if importlib.util.find_spec("laplace") is not None:
        from onlinefa_experiments._calibration_peers import laplace_predictor

        ParameterVector(module).assign(run.last)
        found["laplace"], _ = laplace_predictor(module, split, BUDGET, False)
    assign_mean(module, posterior)
    vector = ParameterVector(module)
    mean = vector.gather().clone()

    def swa(inputs: torch.Tensor) -> np.ndarray:
        vector.assign(mean)
        module.eval()
        with torch.no_grad():
            return torch.softmax(module(inputs).double(), dim=-1).numpy()

    found["swa"] = swa
    return module, posterior, mean, found


def predictors(seed: int, split: Split, budget: Budget = BUDGET,
               null_fraction: float = NULL_FRACTION) -> dict[str, Predictor]:
    module, posterior, mean, found = trained_with_baselines(seed, split, 10, budget)
    vector = ParameterVector(module)
    validation = linearized_predictions(module, posterior, [(split.x_val, split.y_val)], n_samples=N_DRAWS, seed=seed)
    scales = {"one_se": select_scale(validation).scale,
              "max": select_scale(validation, within_standard_error=False).scale}
    linearization = _Linearization(module, vector, mean)
    null_draws = null_deviations(module, split, N_DRAWS, seed, null_fraction, every_layer=False)

    null_all_draws = null_deviations(module, split, N_DRAWS, seed, null_fraction, every_layer=True)

    def linearized(scale: float, null_weight: float, every_layer: bool = False) -> Predictor:
        def predict(inputs: torch.Tensor) -> np.ndarray:
            outputs = linearized_predictions(module, posterior, [(inputs,)], n_samples=N_DRAWS,
                                             seed=seed).outputs(scale)
            if null_weight:
                extra = torch.stack([linearization.push_forward((inputs,), d)[1]
                                     for d in (null_all_draws if every_layer else null_draws)])
                outputs = outputs + null_weight ** 0.5 * extra.to(outputs.dtype)
            return torch.softmax(outputs.double(), dim=-1).mean(dim=0).numpy()
        return predict

    for rule, scale in scales.items():
        found[rule] = linearized(scale, 0.0)
        found[f"{rule}+null"] = linearized(scale, scale)
        found[f"{rule}+null_all_s"] = linearized(scale, scale, every_layer=True)
        for weight in NULL_ALL_WEIGHTS:
            found[f"{rule}+null_all_{weight:g}"] = linearized(scale, weight, every_layer=True)
    narrow, wide = linearized(scales["max"], 0.0), linearized(scales["one_se"], 0.0)
    found["mixture"] = lambda inputs: 0.5 * narrow(inputs) + 0.5 * wide(inputs)
    subspace = subspace_laplace(linearization, posterior, split.x_train)
    found["subspace_laplace"] = linearized_with(module, subspace, seed, 1.0)
    subspace_validation = linearized_predictions(module, subspace, [(split.x_val, split.y_val)], n_samples=N_DRAWS,
                                                 seed=seed)
    found["subspace_laplace_one_se"] = linearized_with(module, subspace, seed, select_scale(subspace_validation).scale)
    found["scale_average"] = scale_average(module, posterior, validation, seed)
    found.update(tempered(module, posterior, validation, seed))
    return found


def tempered(module: torch.nn.Module, posterior: Any, validation: LinearizedPredictions, seed: int
             ) -> dict[str, Predictor]:
    """The softmax temperature chosen with the scale (``one_se+T``: the recipe, ``max+T``: its maximiser), and
    the temperature alone on SWA's logits (``swa+T``: temperature scaling, every deviation set to zero)."""
    chosen = {"one_se+T": select_scale(validation, temperature=True),
              "max+T": select_scale(validation, temperature=True, within_standard_error=False)}
    swa_temperature = scaling_temperature(validation.centre[0], validation.targets)
    chosen["swa+T"] = ScaleSelection(0.0, math.nan, False, swa_temperature)
    return {name: linearized_predictor(module, posterior, selection, N_DRAWS, seed)
            for name, selection in chosen.items()}


class _Gaussian:
    """A fixed (c, F, ψ) for the library's predictive functions."""

    def __init__(self, mean: np.ndarray, loadings: np.ndarray, noise_variance: np.ndarray) -> None:
        self._parts = (mean, loadings, noise_variance)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._parts


def subspace_laplace(linearization: _Linearization, posterior: Any, inputs: torch.Tensor) -> _Gaussian:
    """N(c, P (G + α I)⁻¹ Pᵀ): the Laplace posterior of the fit rows restricted to the span of F (see above)."""
    c, f, psi = (np.asarray(part, dtype=np.float64) for part in posterior.snapshot())
    basis, _ = np.linalg.qr(f)
    tangents = torch.tensor(basis, dtype=torch.float32)
    with torch.no_grad():
        logits, _ = linearization.push_forward((inputs,), tangents[:, 0])
        pushed = torch.stack([linearization.push_forward((inputs,), tangents[:, k])[1].double()
                              for k in range(basis.shape[1])], dim=-1)  # (N, C, K)
    probabilities = torch.softmax(logits.double(), dim=-1)
    weighted = torch.einsum("nck,nc->nk", pushed, probabilities)
    ggn = (torch.einsum("nck,nc,ncl->kl", pushed, probabilities, pushed) - weighted.T @ weighted).numpy()
    eigenvalues = np.linalg.eigvalsh(ggn)
    centre = basis.T @ c
    alpha = 1.0
    for _ in range(100):
        alpha = float(np.sum(eigenvalues / (eigenvalues + alpha)) / (centre @ centre))
    factor = np.linalg.cholesky(np.linalg.inv(ggn + alpha * np.eye(len(ggn))))
    return _Gaussian(c, basis @ factor, np.zeros_like(psi))


def linearized_with(module: torch.nn.Module, gaussian: Any, seed: int, scale: float) -> Predictor:
    def predict(inputs: torch.Tensor) -> np.ndarray:
        outputs = linearized_predictions(module, gaussian, [(inputs,)], n_samples=N_DRAWS, seed=seed).outputs(scale)
        return torch.softmax(outputs.double(), dim=-1).mean(dim=0).numpy()
    return predict


#: The grid of covariance scales the scale-averaged predictive integrates over (8 points per decade).
SCALE_GRID = np.logspace(-3, 6, 73)


def scale_average(module: torch.nn.Module, posterior: Any, validation: Any, seed: int) -> Predictor:
    """Predictions averaged over the covariance scale s with its posterior given the validation rows (a flat
    prior on log s over ``SCALE_GRID``): w_s ∝ Π_n p(y_n | x_n, s), instead of one chosen s."""
    labels = validation.targets.reshape(-1)
    log_evidence = []
    for scale in SCALE_GRID:
        log_p = torch.log_softmax(validation.outputs(float(scale)).double(), dim=-1)
        per_draw = log_p.gather(-1, labels.view(1, -1, 1).expand(log_p.shape[0], -1, 1)).squeeze(-1)
        per_row = torch.logsumexp(per_draw, dim=0) - np.log(per_draw.shape[0])
        log_evidence.append(float(per_row.sum()))
    weights = np.exp(np.array(log_evidence) - max(log_evidence))
    weights /= weights.sum()

    def predict(inputs: torch.Tensor) -> np.ndarray:
        outputs = linearized_predictions(module, posterior, [(inputs,)], n_samples=N_DRAWS, seed=seed)
        mixture = sum(w * torch.softmax(outputs.outputs(float(s)).double(), dim=-1).mean(dim=0).numpy()
                      for w, s in zip(weights, SCALE_GRID) if w > 1e-6)
        return np.asarray(mixture)

    return predict


def evaluate(seed: int, budget: Budget = BUDGET, null_fraction: float = NULL_FRACTION) -> dict[str, dict[str, float]]:
    split, sets = development_sets(seed)
    table: dict[str, dict[str, float]] = {}
    for method, predict in predictors(seed, split, budget, null_fraction).items():
        row = {name: classification_nll(predict(inputs), labels) for name, (inputs, labels) in sets.items()}
        row["shifted"] = float(np.mean([value for name, value in row.items() if name != "clean"]))
        table[method] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=BUDGET.rank, help="K of the OnlineEM posterior")
    parser.add_argument("--collect-epochs", type=int, default=BUDGET.collect_epochs)
    parser.add_argument("--collect-lr", type=float, default=None,
                        help="SGD learning rate over the collection epochs (default: the training rate)")
    parser.add_argument("--null-fraction", type=float, default=NULL_FRACTION,
                        help="eigenvalue fraction below which an input direction counts as null")
    args = parser.parse_args()
    torch.set_num_threads(1)
    budget = BUDGET._replace(rank=args.rank, collect_epochs=args.collect_epochs, collect_lr=args.collect_lr)
    tables = [evaluate(seed, budget, args.null_fraction) for seed in range(args.seeds)]
    reference = "one_se"
    print("| method | clean NLL | shifted NLL | Δ clean vs one_se | Δ shifted vs one_se |")
    print("|---|---|---|---|---|")
    n = len(tables)

    def mean_se(values: list[float]) -> str:
        spread = float(np.std(values, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        return f"{np.mean(values):.3f} ± {spread:.3f}"

    for method in tables[0]:
        cells: list[Any] = []
        for key in ("clean", "shifted"):
            cells.append(mean_se([t[method][key] for t in tables]))
        for key in ("clean", "shifted"):
            cells.append(mean_se([t[method][key] - t[reference][key] for t in tables]))
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
