"""Part (c) of the ``gfa`` experiment: groups = the parameter tensors of a small network.

A ReLU MLP (13 → 16 → 16 → 1) is trained on the Boston housing set of the ``swag`` experiment (same split,
same SGD loop, one thread): ``pretrain`` epochs, then ``collect`` epochs at a constant learning rate
during which the flattened parameter vector is recorded after every optimiser step (the SWAG iterates). The
features are grouped by tensor (the weight and the bias of each layer: 6 groups). Two versions of the
iterates are fitted: as recorded, and with each parameter's linear trend over the collection phase
removed (the iterates still drift, and the drift dominates their variance). Each is streamed through
:class:`onlinefa.OnlineGFA` in chronological mini-batches and fitted with the batch :class:`onlinefa.GFA`
for comparison. A factor is *active* in a tensor when it explains more than 2% of the tensor's variance
over the trajectory; it is *shared* when active in two tensors or more. PyTorch (the ``torch`` extra) is
imported only here.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from onlinefa.gfa import GFA
from onlinefa.online_gfa import OnlineGFA

FloatArray = NDArray[np.float64]
ACTIVE_SHARE = 0.02
HIDDEN = (16, 16)
TASK = "boston"


class LayerFits(NamedTuple):
    """One version of the iterates and its two fits."""

    variant: str
    online: OnlineGFA
    batch: GFA
    seconds: dict[str, float]


def layer_iterates(seed: int, pretrain: int, collect: int) -> tuple[FloatArray, list[str], list[int]]:
    """SGD iterates (T × D, one row per optimiser step of the collection phase), tensor names and sizes."""
    import torch

    from ._swag_data import load_task

    task = load_task(TASK)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network: threads only add overhead
    try:
        return _train(task, seed, pretrain, collect)
    finally:
        torch.set_num_threads(threads)


def _train(task: Any, seed: int, pretrain: int, collect: int) -> tuple[FloatArray, list[str], list[int]]:
    import torch

    from ._swag_train import batches, build_mlp, mean_loss, run_epochs, seed_generator, tensors

    torch.manual_seed(seed)
    model = build_mlp(task.X_train.shape[1], HIDDEN, task.n_outputs)
    data, generator = tensors(task, "train"), seed_generator(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=1e-4)
    run_epochs(model, optimizer, task, data, pretrain, generator, 32)
    rows = []
    for _ in range(collect):
        for inputs, targets in batches(data, 32, generator):
            optimizer.zero_grad(set_to_none=True)
            mean_loss(task, model(inputs), targets).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            rows.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().double().numpy())
    names = [name for name, _ in model.named_parameters()]
    sizes = [int(p.numel()) for p in model.parameters()]
    return np.stack(rows), names, sizes


def detrended(x: FloatArray) -> FloatArray:
    """Each column minus its least-squares line over the row index (the drift of the trajectory)."""
    t = np.arange(x.shape[0], dtype=float)
    t -= t.mean()
    centred = x - x.mean(0)
    slope = (t @ centred) / (t @ t)
    out: FloatArray = centred - np.outer(t, slope)
    return out


def fit_variant(variant: str, x: FloatArray, sizes: list[int], seed: int, k: int) -> LayerFits:
    """OnlineGFA over chronological batches of 25 iterates and batch GFA, per-feature noise.

    The iterates are divided by one global scale (their overall s.d. about the mean), which leaves every
    variance share unchanged and keeps the precisions away from the priors' scale.
    """
    x = x / float(np.std(x - x.mean(0)))
    seconds = {}
    start = time.perf_counter()
    online = OnlineGFA(k, sizes, noise="feature", random_state=seed)
    for first in range(0, x.shape[0], 25):
        online.partial_fit(x[first : first + 25])
    seconds["online"] = time.perf_counter() - start
    start = time.perf_counter()
    batch = GFA(k, sizes, noise="feature", max_iter=2000, tol=1e-7, random_state=seed).fit(x)
    seconds["batch"] = time.perf_counter() - start
    return LayerFits(variant, online, batch, seconds)


def fit_layers(seed: int = 0, pretrain: int = 100, collect: int = 40, k: int = 16) -> tuple[list[str], list[int], int, list[LayerFits]]:
    """Names and sizes of the tensors, number of iterates, and the fits of the raw and detrended iterates."""
    x, names, sizes = layer_iterates(seed, pretrain, collect)
    fits = [fit_variant(v, data, sizes, seed, k) for v, data in (("raw", x), ("detrended", detrended(x)))]
    return names, sizes, x.shape[0], fits


def factor_rows(activity: FloatArray, names: list[str]) -> list[dict[str, Any]]:
    """Per factor (by decreasing total share): the tensors where it is active and whether it is shared."""
    rows = []
    for j in np.argsort(-activity.sum(0)):
        active = [names[m] for m in np.flatnonzero(activity[:, j] > ACTIVE_SHARE)]
        kind = "shared" if len(active) >= 2 else ("private" if active else "inactive")
        rows.append(dict(kind=kind, tensors=active, peak=float(activity[:, j].max())))
    return rows


def report(names: list[str], sizes: list[int], n_iterates: int, fits: list[LayerFits]) -> str:
    """Markdown: the setting, each fit's factor table (online) and a summary of both fits."""
    groups = ", ".join(f"{n} ({s})" for n, s in zip(names, sizes))
    lines = ["## (c) groups = parameter tensors of an MLP (SWAG iterates)", "",
             f"{n_iterates} iterates of {sum(sizes)} parameters; groups: {groups}.", ""]  # fmt: skip
    for fit in fits:
        lines += [f"### {fit.variant} iterates", "",
                  "| factor | OnlineGFA: active in (share > 2%) | kind | largest share |", "| --- | --- | --- | --- |"]  # fmt: skip
        online_rows = factor_rows(fit.online.activity_, names)
        for i, r in enumerate(online_rows):
            lines.append(f"| {i + 1} | {', '.join(r['tensors']) or '—'} | {r['kind']} | {r['peak']:.3f} |")
        summary = []
        for label, rows in (("OnlineGFA", online_rows), ("GFA (batch)", factor_rows(fit.batch.activity_, names))):
            n_shared = sum(r["kind"] == "shared" for r in rows)
            n_private = sum(r["kind"] == "private" for r in rows)
            summary.append(f"{label}: {n_shared} shared, {n_private} private, {len(rows) - n_shared - n_private} inactive")
        lines += ["", "; ".join(summary) + f" (batch GFA kept {fit.batch.n_components_} factors). Seconds: online "
                  f"{fit.seconds['online']:.2f}, batch {fit.seconds['batch']:.2f}.", ""]  # fmt: skip
    return "\n".join(lines)


def heat_map(names: list[str], sizes: list[int], fits: list[LayerFits], path: Any) -> None:
    """PNG: share of each tensor's variance per factor; rows = iterate versions, columns = online / batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{n} ({s})" for n, s in zip(names, sizes)]
    fig, axes = plt.subplots(len(fits), 2, figsize=(12, 3.6 * len(fits)), squeeze=False)
    for row, fit in zip(axes, fits):
        for ax, (title, activity) in zip(row, (("OnlineGFA", fit.online.activity_),
                                               ("GFA (batch)", fit.batch.activity_))):  # fmt: skip
            values = activity[:, np.argsort(-activity.sum(0))]
            im = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
            ax.set_title(f"{fit.variant} iterates, {title}: share of each tensor's variance", fontsize=9)
            ax.set_yticks(range(len(labels)), labels, fontsize=8)
            ax.set_xticks(range(values.shape[1]), [str(i + 1) for i in range(values.shape[1])])
            ax.set_xlabel("factor (sorted by total share)")
            for (i, j), v in np.ndenumerate(values):
                color = "w" if v < 0.6 * values.max() else "k"
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color=color)
            fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
