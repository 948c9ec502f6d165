"""The every-layer null-space prior on breast cancer, judged on a development split (clean, shifted and OOD rows).

No test row is read. Per seed, the benchmark's breast-cancer training split (80 % of the rows, as ``onlinefa
experiment calibration`` splits it) is split again: fit rows (70/80) train the network and feed the posterior,
validation rows (10/80) choose the recipe's scale and temperature, and development rows (20/80) are evaluated:
clean, with Gaussian feature noise of 0.5, 1 and 2 fit-row s.d. (the benchmark's shifted sets), and against rows
uniform over each feature's fit-row range (its OOD set; AUROC by predictive entropy). Features are standardised
by the fit rows. Same MLP, SGD budget and collection as the benchmark.

Methods: ``swa``; ``laplace`` (laplace-torch's default, if installed); ``recipe`` (the linearised predictive at
``select_scale(..., temperature=True)``'s scale and temperature); and ``recipe+null_<f>_<w>``: the recipe plus
the input-null-space prior on every ``Linear`` (``calibration_dev_split.null_deviations``: δW ~ N(0, w σ₀² P) per
unit, P the projector onto the directions the layer's inputs on the fit rows do not vary in, eigenvalues below
f of the largest, σ₀² = 1/(3·fan_in)), its deviations pushed through the same linearisation and added to the
recipe's before the temperature; ``recipe+null_<f>_typical``, the same with each layer's prior variance its
weights' mean square at θ_SWA; and ``recipe+last_<f>_<v>``, the prior on the last ``Linear`` only, with
variance v (laplace-torch's marginal likelihood puts its last-layer prior variance near 1 here).

    python experiments/studies/calibration_null_prior.py --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_dev_split import (N_DRAWS, Predictor, development_split, null_deviations,  # noqa: E402
                                   trained_with_baselines)

from onlinefa.torch import ParameterVector, linearized_predictions, select_scale  # noqa: E402
from onlinefa.torch._linearized import _Linearization  # noqa: E402
from onlinefa_experiments._calibration import auroc, classification_nll, predictive_entropy  # noqa: E402
from onlinefa_experiments._calibration_data import FEATURE_NOISE_LEVELS  # noqa: E402
from onlinefa_experiments._calibration_runs import Split  # noqa: E402

#: (eigenvalue fraction, weight) of the null-space prior variants.
NULL_VARIANTS = ((1e-3, 1.0), (1e-2, 1.0), (1e-3, 10.0), (1e-2, 10.0))


def development_sets(seed: int) -> tuple[Split, dict[str, tuple[torch.Tensor, np.ndarray]], torch.Tensor]:
    """Fit/validation split, the development sets (clean and shifted) and the development OOD rows."""
    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    x_fit, y_fit, x_val, y_val, x_dev, y_dev = development_split(x, y, seed)
    centre, spread = x_fit.mean(axis=0), x_fit.std(axis=0)
    rng = np.random.default_rng(300 + seed)

    def scaled(values: np.ndarray) -> torch.Tensor:
        return torch.tensor((values - centre) / spread, dtype=torch.float32)

    sets = {"clean": (scaled(x_dev), y_dev)}
    for level in FEATURE_NOISE_LEVELS:
        sets[f"noise{level}"] = (scaled(x_dev + level * spread * rng.standard_normal(x_dev.shape)), y_dev)
    ood = scaled(rng.uniform(x_fit.min(axis=0), x_fit.max(axis=0), size=x_dev.shape))
    split = Split(scaled(x_fit), torch.tensor(y_fit), scaled(x_val), torch.tensor(y_val))
    return split, sets, ood


def predictors(seed: int, split: Split) -> dict[str, Predictor]:
    module, posterior, mean, found = trained_with_baselines(seed, split, 2)
    vector = ParameterVector(module)
    validation = linearized_predictions(module, posterior, [(split.x_val, split.y_val)], n_samples=N_DRAWS, seed=seed)
    chosen = select_scale(validation, temperature=True)
    print(f"seed {seed}: scale {chosen.scale:.3g}, temperature {chosen.temperature:.3g}", flush=True)
    linearization = _Linearization(module, vector, mean)

    def recipe(null_draws: torch.Tensor | None, weight: float) -> Predictor:
        def predict(inputs: torch.Tensor) -> np.ndarray:
            outputs = linearized_predictions(module, posterior, [(inputs,)], n_samples=N_DRAWS,
                                             seed=seed).outputs(chosen.scale)
            if null_draws is not None:
                extra = torch.stack([linearization.push_forward((inputs,), d)[1] for d in null_draws])
                outputs = outputs + weight ** 0.5 * extra.to(outputs.dtype)
            return torch.softmax(outputs.double() / chosen.temperature, dim=-1).mean(dim=0).numpy()
        return predict

    found["recipe"] = recipe(None, 0.0)
    for fraction, weight in NULL_VARIANTS:
        draws = null_deviations(module, split, N_DRAWS, seed, fraction, every_layer=True)
        found[f"recipe+null_{fraction:g}_{weight:g}"] = recipe(draws, weight)
    for fraction in (1e-3, 1e-2):
        draws = typical_null_deviations(module, split, N_DRAWS, seed, fraction)
        found[f"recipe+null_{fraction:g}_typical"] = recipe(draws, 1.0)
    for fraction in (1e-3, 1e-2, 1e-1):
        for variance in (0.1, 1.0):
            draws = last_layer_null(module, split, N_DRAWS, seed, fraction, variance)
            found[f"recipe+last_{fraction:g}_{variance:g}"] = recipe(draws, 1.0)
    return found


def last_layer_null(module: torch.nn.Module, split: Split, n_draws: int, seed: int, fraction: float,
                    variance: float) -> torch.Tensor:
    """``null_deviations`` on the last ``Linear`` only, with prior variance ``variance``."""
    vector = ParameterVector(module)
    draws = null_deviations(module, split, n_draws, seed, fraction, every_layer=True)
    sizes = [tensor.numel() for tensor in vector.parameters]
    last = sum(sizes[-2:])
    draws[:, : draws.shape[1] - last] = 0.0
    weight = vector.parameters[-2]
    draws *= (variance * 3.0 * weight.shape[1]) ** 0.5
    return draws


def typical_null_deviations(module: torch.nn.Module, split: Split, n_draws: int, seed: int,
                            fraction: float) -> torch.Tensor:
    """``null_deviations`` on every layer with each layer's prior variance its weights' mean square at θ_SWA
    (the variance under which the fitted weights are typical draws) instead of w σ₀²."""
    vector = ParameterVector(module)
    draws = null_deviations(module, split, n_draws, seed, fraction, every_layer=True)
    start = 0
    for tensor in vector.parameters:
        count = tensor.numel()
        if tensor.dim() == 2:
            # A Linear's weight, then its bias: both deviations scale with δW (δb = −δW ā).
            ratio = float(tensor.detach().pow(2).mean()) * 3.0 * tensor.shape[1]
            draws[:, start:start + count + tensor.shape[0]] *= ratio ** 0.5
        start += count
    return draws


def evaluate(seed: int) -> dict[str, dict[str, float]]:
    split, sets, ood = development_sets(seed)
    table: dict[str, dict[str, float]] = {}
    for method, predict in predictors(seed, split).items():
        probabilities = {name: predict(inputs) for name, (inputs, _) in sets.items()}
        row = {name: classification_nll(probabilities[name], labels) for name, (_, labels) in sets.items()}
        row["shifted"] = float(np.mean([value for name, value in row.items() if name != "clean"]))
        row["auroc"] = auroc(predictive_entropy(probabilities["clean"]), predictive_entropy(predict(ood)))
        table[method] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables = [evaluate(seed) for seed in range(args.seeds)]
    n = len(tables)

    def mean_se(values: list[float], digits: int = 3) -> str:
        spread = float(np.std(values, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        return f"{np.mean(values):.{digits}f} ± {spread:.{digits}f}"

    print("| method | clean NLL | shifted NLL | AUROC uniform | Δ clean vs recipe | Δ shifted vs recipe |")
    print("|---|---|---|---|---|---|")
    for method in tables[0]:
        cells = [mean_se([t[method][key] for t in tables]) for key in ("clean", "shifted", "auroc")]
        cells += [mean_se([t[method][key] - t["recipe"][key] for t in tables]) for key in ("clean", "shifted")]
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
