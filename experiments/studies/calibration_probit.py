"""Does the digits recipe's sampling error matter? More draws, and the probit approximation, on the development split.

No test row is read: the fit / validation / development rows and shifted development sets of
``calibration_dev_split.py``, the same MLP, SGD budget and collection. Per seed, the recipe's (s, T) is chosen
as the library does (``select_scale(..., temperature=True)``, 30 draws of the validation rows) and the
development rows are predicted:

- ``recipe_30`` / ``recipe_300``: the mean of softmax over 30 or 300 linearised draws at (s, T);
- ``probit_at_recipe``: the probit approximation of that mean at the same (s, T), softmax(μ / (T √(1 + π/8 ·
  s v / T²))), μ the logits at the posterior mean and v the diagonal of J Σ Jᵀ
  (``LinearizedPredictions.variance``, 300 draws) — how laplace-torch predicts by default;
- ``probit_one_se`` / ``probit_max``: the probit predictive with its own (s, T), chosen on the validation rows
  by its score (a grid of 145 scales over 10⁻³–10⁶ and 25 temperatures over 1–10), widened by the
  one-standard-error rule or not.

    python experiments/studies/calibration_probit.py --seeds 3
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_dev_split import BUDGET, N_DRAWS, development_sets  # noqa: E402

from onlinefa.torch import LinearizedPredictions, linearized_predictions, select_scale  # noqa: E402
from onlinefa_experiments._calibration import classification_nll  # noqa: E402
from onlinefa_experiments._calibration_runs import assign_mean, batch_orders, train_sgd  # noqa: E402

MANY_DRAWS = 300
LOG_SCALES = np.linspace(math.log(1e-3), math.log(1e6), 145)
TEMPERATURES = np.exp(np.linspace(0.0, math.log(10.0), 25))


def probit(logits: torch.Tensor, variance: torch.Tensor, scale: float, temperature: float) -> torch.Tensor:
    """softmax(μ / (T √(1 + π/8 · s v / T²))): (N, C) probabilities."""
    spread = torch.sqrt(1.0 + math.pi / 8.0 * scale * variance / temperature**2)
    return torch.softmax(logits / temperature / spread, dim=-1)


def probit_choice(validation: LinearizedPredictions, widen: bool) -> tuple[float, float]:
    """(s, T) maximising the validation rows' mean log probit predictive; with ``widen``, s then widened by the
    one-standard-error rule at that T."""
    logits, variance = validation.centre[0].double(), validation.variance()[0].double()
    labels = validation.targets
    assert labels is not None
    rows = torch.arange(labels.shape[0])

    def per_row(log_scale: float, temperature: float) -> torch.Tensor:
        return torch.log(probit(logits, variance, math.exp(log_scale), temperature)[rows, labels])

    table = np.array([[float(per_row(s, t).mean()) for t in TEMPERATURES] for s in LOG_SCALES])
    i, j = np.unravel_index(int(np.argmax(table)), table.shape)
    if widen:
        best = per_row(LOG_SCALES[i], TEMPERATURES[j])
        threshold = float(best.mean()) - float(best.std()) / math.sqrt(best.numel())
        while i + 1 < len(LOG_SCALES) and table[i + 1, j] >= threshold:
            i += 1
    return math.exp(LOG_SCALES[i]), float(TEMPERATURES[j])


def evaluate(seed: int) -> dict[str, tuple[float, float]]:
    """(clean NLL, mean shifted NLL) of every predictive on the development rows."""
    split, sets = development_sets(seed)
    run = train_sgd(split, 10, BUDGET, batch_orders(split.x_train.shape[0], BUDGET, seed), init_seed=seed)
    assign_mean(run.module, run.posterior)
    validation = linearized_predictions(run.module, run.posterior, [(split.x_val, split.y_val)], n_samples=N_DRAWS,
                                        seed=seed)
    chosen = select_scale(validation, temperature=True)
    probit_scales = {"probit_one_se": probit_choice(validation, True), "probit_max": probit_choice(validation, False)}
    scores: dict[str, dict[str, float]] = {}
    for name, (inputs, labels) in sets.items():
        few = linearized_predictions(run.module, run.posterior, [(inputs,)], n_samples=N_DRAWS, seed=seed)
        many = linearized_predictions(run.module, run.posterior, [(inputs,)], n_samples=MANY_DRAWS, seed=seed)
        logits, variance = many.centre[0].double(), many.variance()[0].double()
        found = {
            "recipe_30": torch.softmax(few.outputs(chosen.scale, chosen.temperature).double(), -1).mean(0),
            "recipe_300": torch.softmax(many.outputs(chosen.scale, chosen.temperature).double(), -1).mean(0),
            "probit_at_recipe": probit(logits, variance, chosen.scale, chosen.temperature),
            **{method: probit(logits, variance, *pair) for method, pair in probit_scales.items()},
        }
        for method, probabilities in found.items():
            scores.setdefault(method, {})[name] = classification_nll(probabilities.numpy(), labels)
    return {method: (row["clean"], float(np.mean([v for k, v in row.items() if k != "clean"])))
            for method, row in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [evaluate(seed) for seed in range(args.seeds)]
    print("| method | clean NLL | shifted NLL |\n|---|---|---|")
    for method in results[0]:
        values = np.array([seed_result[method] for seed_result in results])
        spread = values.std(axis=0, ddof=1) / math.sqrt(len(values))
        print(f"| {method} | {values[:, 0].mean():.3f} ± {spread[0]:.3f} | {values[:, 1].mean():.3f} ± {spread[1]:.3f} |")


if __name__ == "__main__":
    main()
