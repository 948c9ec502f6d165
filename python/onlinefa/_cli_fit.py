"""``onlinefa fit``: stream the rows of a (T, D) .npy file through online EM or SGA."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from ._models import OnlineEM, OnlineSGA
from ._progress import Progress


def add_parser(commands: Any) -> None:
    """Register the ``fit`` sub-command."""
    p = commands.add_parser(
        "fit",
        help="fit a factor-analysis Gaussian to the rows of a .npy file",
        description="Stream the rows of a (T, D) .npy file (memory-mapped, so T*D may exceed RAM) "
        "through online EM or SGA and write mean, loadings, noise_variance and n_seen to an .npz file.",
    )
    p.add_argument("samples", type=Path, help="(T, D) array saved with numpy.save")
    p.add_argument("--components", "-k", type=int, required=True, help="number of latent factors K")
    p.add_argument("--method", choices=("em", "sga"), default="em", help="online EM (default) or SGA")
    p.add_argument("--warmup", type=int, default=100, help="warm-up samples (default 100)")
    p.add_argument("--lr", type=float, default=1e-3, help="SGA learning rate (default 1e-3)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="state dtype")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial loadings (default 0)")
    p.add_argument("--batch-rows", type=int, default=256, help="rows per update call (default 256)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output .npz file")
    p.set_defaults(handler=run)


def _open_samples(path: Path) -> np.ndarray[Any, Any]:
    from .cli import CommandError

    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as err:
        raise CommandError(f"no such file: {path}") from err
    except (ValueError, OSError, EOFError) as err:
        raise CommandError(f"{path} is not a readable .npy array ({err})") from err
    if not isinstance(data, np.ndarray) or data.ndim != 2:
        raise CommandError(f"{path} must hold a 2-D (T, D) array")
    if data.dtype.kind not in "biuf":
        raise CommandError(f"{path} holds dtype {data.dtype}; a real numeric array is required")
    return data


def run(args: argparse.Namespace) -> int:
    """Fit and save; returns the exit code."""
    from .cli import CommandError

    data = _open_samples(args.samples)
    n_samples, n_features = data.shape
    try:
        if args.method == "em":
            model: OnlineEM | OnlineSGA = OnlineEM(
                n_features, args.components, n_warmup=args.warmup, seed=args.seed, dtype=args.dtype
            )
        else:
            model = OnlineSGA(
                n_features, args.components, lr=args.lr, n_warmup=args.warmup, seed=args.seed, dtype=args.dtype
            )
        step = max(1, args.batch_rows)
        with Progress(n_samples, f"fit {args.method}") as bar:
            for lo in range(0, n_samples, step):
                model.update(data[lo : lo + step])
                bar.advance(min(step, n_samples - lo))
    except (ValueError, TypeError) as err:
        raise CommandError(str(err)) from err
    try:
        np.savez(
            args.output,
            mean=model.mean,
            loadings=model.loadings,
            noise_variance=model.noise_variance,
            n_seen=np.int64(model.n_seen),
            method=np.str_(args.method),
        )
    except OSError as err:
        raise CommandError(f"cannot write {args.output}: {err}") from err
    print(f"fitted {args.method} (D={n_features}, K={args.components}) on {n_samples} samples -> {args.output}")
    return 0
