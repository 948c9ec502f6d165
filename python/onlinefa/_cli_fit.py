"""``onlinefa fit``: stream the rows of a (T, D) .npy file through online EM or SGA into a checkpoint.

Every check that can fail is made before the first row is read (input header, output path, sizes, model
options); the model is then written atomically with the model's own ``save``, so ``onlinefa.load`` (or
``OnlineEM.load``/``OnlineSGA.load``) reads it back and an interrupted run never destroys an older file.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._progress import Progress
from ._registry import STREAMING_METHODS, streaming_kind
from .errors import CommandError

if TYPE_CHECKING:
    from .streaming import OnlineEM, OnlineSGA

    StreamingModel = OnlineEM | OnlineSGA


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _warmup(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parser(commands: Any, summary: str) -> None:
    """Register the ``fit`` sub-command."""
    p = commands.add_parser(
        "fit",
        help=summary,
        description="Stream the rows of a (T, D) .npy file (memory-mapped, so T*D may exceed RAM) through "
        "online EM or SGA and write the model as a checkpoint that onlinefa.load reads back.",
    )
    p.add_argument("samples", type=Path, help="(T, D) array saved with numpy.save")
    p.add_argument("--components", "-k", type=_positive_int, required=True, help="number of latent factors K")
    p.add_argument("--method", choices=STREAMING_METHODS, default="em", help="online EM (default) or SGA")
    p.add_argument(
        "--config", choices=("default", "thesis"), default="default",
        help="'default': the library's defaults (EM: whitening, harmonic schedule, data scaling); 'thesis': "
        "Brownlie's Algorithm 2 (EM) / Algorithm 1 (SGA) exactly, for reproduction",
    )
    p.add_argument("--warmup", type=_warmup, default=None,
                   help="warm-up samples: 'auto' (default; K+2, at most 100) or an integer (thesis: 100)")
    p.add_argument("--lr", type=_learning_rate, default=None,
                   help="SGA step: 'auto' (default: steps of 1/t, whitened) or a constant learning rate "
                   "(thesis: 1e-3)")
    p.add_argument("--schedule", choices=("harmonic", "power", "constant"), default=None,
                   help="step sizes ρ_t (default: harmonic; --config default only)")
    p.add_argument("--kappa", type=float, default=0.9, help="κ of the power schedule (default 0.9)")
    p.add_argument("--tau0", type=float, default=0.0, help="τ₀ of the power schedule (default 0)")
    p.add_argument("--rho", type=float, default=0.01, help="ρ of the constant schedule (default 0.01)")
    p.add_argument("--no-whiten", dest="whiten", action="store_false",
                   help="EM without the whitening step (--config default only)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="state dtype")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial loadings (default 0)")
    p.add_argument("--batch-rows", type=_positive_int, default=256, help="rows per update call (default 256)")
    p.add_argument("--minibatch", type=_positive_int, default=None, metavar="B",
                   help="mini-batch EM with B rows per batch (EM only): several shuffled passes over the file, "
                        "read in batches with bounded memory, instead of one exact per-sample pass")
    p.add_argument("--passes", type=_positive_int, default=10,
                   help="largest number of passes of --minibatch (default 10; stops earlier once two passes "
                        "gain less than 1e-5 relative in average log-likelihood)")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="checkpoint file to write (used exactly as given; replaced atomically)")
    p.set_defaults(handler=run)


def open_samples(path: Path) -> np.ndarray[Any, Any]:
    """The (T, D) array of ``path``, memory-mapped; CommandError for anything unusable (read no data)."""
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as err:
        raise CommandError(f"no such file: {path}") from err
    except (ValueError, OSError, EOFError, OverflowError, TypeError) as err:  # a damaged header (negative shape)
        raise CommandError(f"{path} is not a readable .npy array ({err})") from err
    if not isinstance(data, np.ndarray) or data.ndim != 2:
        raise CommandError(f"{path} must hold a 2-D (T, D) array")
    if data.dtype.kind not in "biuf":
        raise CommandError(f"{path} holds dtype {data.dtype}; a real numeric array is required")
    if data.shape[0] == 0:
        raise CommandError(f"{path} holds no rows (shape {data.shape}); nothing to fit")
    return data


class RowReader:
    """Rows of a C-ordered ``.npy`` file read with positioned reads, batch by batch (a copy of each batch).

    Reading through a memory map would kill the process with SIGBUS if the file were truncated while the fit
    runs; a positioned read returns fewer bytes instead, which is reported as a :class:`CommandError`.
    Fortran-ordered files (rows not contiguous) are read through the memory map as before.
    """

    def __init__(self, path: Path, data: np.ndarray[Any, Any]) -> None:
        self.path = path
        self.shape: tuple[int, int] = (int(data.shape[0]), int(data.shape[1]))
        self.dtype = data.dtype
        self._mapped = data if not data.flags.c_contiguous else None
        self._offset = int(getattr(data, "offset", 0))
        self._row_bytes = self.shape[1] * data.dtype.itemsize
        try:  # held open for the whole fit: a file renamed over the path later is not mixed in
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise CommandError(f"cannot read {path}: {err}") from err

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __getitem__(self, rows: slice) -> np.ndarray[Any, Any]:
        if self._mapped is not None:
            return self._mapped[rows]
        lo, hi, _ = rows.indices(self.shape[0])
        hi = max(lo, hi)
        expected = (hi - lo) * self._row_bytes
        try:
            buffer = os.pread(self._fd, expected, self._offset + lo * self._row_bytes)
        except OSError as err:
            raise CommandError(f"cannot read rows {lo}:{hi} of {self.path}: {err}") from err
        if len(buffer) != expected:
            raise CommandError(
                f"{self.path} was truncated while it was read (rows {lo}:{hi} are past its end); nothing was written"
            )
        return np.frombuffer(buffer, dtype=self.dtype).reshape(hi - lo, self.shape[1])


def check_output(output: Path, samples: Path) -> None:
    """CommandError unless ``output`` can be (re)placed by an atomic rename of a file written beside it."""
    directory = output.parent if str(output.parent) else Path(".")
    if not directory.is_dir():
        raise CommandError(f"cannot write {output}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CommandError(f"cannot write {output}: directory {directory} is not writable")
    try:
        mode = output.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as err:  # a symlink loop, a path component that is not a directory, no permission
        raise CommandError(f"cannot write {output}: {err.strerror or err}") from err
    if not stat.S_ISREG(mode):
        raise CommandError(f"cannot write {output}: it exists and is not a regular file")
    if samples.exists() and output.resolve() == samples.resolve():
        raise CommandError(f"the output {output} is the input file; choose another path")


def _learning_rate(text: str) -> float | str:
    """--lr: 'auto' or a float (validated by the model)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {text!r}") from None


def build_model(args: argparse.Namespace, n_features: int) -> StreamingModel:
    """The streaming model the options describe (ValueError/TypeError for invalid values)."""
    warmup = args.warmup if args.warmup is not None else (100 if args.config == "thesis" else "auto")
    common: dict[str, Any] = {"n_warmup": warmup, "seed": args.seed, "dtype": args.dtype}
    kind = streaming_kind(args.method)
    learning_rate = {"lr": args.lr} if args.method == "sga" and args.lr is not None else {}  # SGA's own option
    if args.config == "thesis":
        if args.schedule is not None or not args.whiten:
            raise ValueError("--schedule and --no-whiten apply to --config default only")
        thesis_constructor = getattr(kind.model_class(), str(kind.thesis))
        model: StreamingModel = thesis_constructor(n_features, args.components, **learning_rate, **common)
        return model
    whitening = {"whiten": args.whiten} if args.method == "em" else {}  # EM's own option
    schedule_options = {"tau0": args.tau0, "kappa": args.kappa, "rho": args.rho}
    model = kind.model_class()(n_features, args.components, schedule=args.schedule or "harmonic",
                               **learning_rate, **whitening, **schedule_options, **common)
    return model


def _stream(model: StreamingModel, data: np.ndarray[Any, Any] | RowReader, step: int, label: str
            ) -> tuple[float, int]:
    """Apply every row of ``data`` in order, in batches of at most ``step`` rows, and score held-out rows.

    The held-out rows are the last batch's, each scored (before it is applied) by the model fitted to every
    row before them. When the stream is so short that the model is still warming up where the last batch
    starts (e.g. fewer rows than ``step`` in all), they are the rows after the first ``n_warmup + 1``: the
    first fitted model. Splitting a batch changes nothing in the result, since the models apply rows one at
    a time.

    Returns
    -------
    held_out : float
        The average log-likelihood of the held-out rows (NaN when there are none).
    n_held_out : int
        Their number: 0 when the stream has only ``n_warmup + 1`` rows, all needed for the first fit.
    """
    n_samples = data.shape[0]
    last_batch = n_samples - ((n_samples - 1) // step) * step
    n_held_out = max(0, min(last_batch, n_samples - model.n_warmup - 1))
    split = n_samples - n_held_out
    held_out = float("nan")
    with Progress(n_samples, label) as bar:
        for lo in range(0, split, step):
            batch = data[lo : min(lo + step, split)]
            model.update(batch)
            bar.advance(batch.shape[0])
        if n_held_out:
            batch = data[split:]
            held_out = float(np.mean(model.log_prob(batch)))
            model.update(batch)
            bar.advance(batch.shape[0])
    return held_out, n_held_out


def _held_out_summary(held_out: float, n_held_out: int, n_samples: int, n_warmup: int, step: int) -> str:
    """The quality figure of the summary line, or why there is none."""
    if n_held_out == 0:
        return (f"no held-out log-likelihood: all {n_samples} rows were needed to reach the first fitted model "
                f"(warm-up {n_warmup} + 1 row); pass more rows to get one")
    text = f"held-out average log-likelihood of the last {n_held_out} rows"
    if n_held_out < n_samples - ((n_samples - 1) // step) * step:
        text += f" (every row after the first {n_warmup + 1}: the warm-up of {n_warmup} and the first fitted row)"
    return f"{text}: {held_out:.4g}"


def run(args: argparse.Namespace) -> int:
    """Fit and save; returns the exit code."""
    check_output(args.output, args.samples)
    data = open_samples(args.samples)
    if args.minibatch is not None:
        return _run_minibatch(args, data)
    n_samples, n_features = data.shape
    try:
        model = build_model(args, n_features)
    except (ValueError, TypeError, MemoryError) as err:
        raise CommandError(str(err)) from err
    if n_samples <= model.n_warmup:
        raise CommandError(
            f"{args.samples} has {n_samples} rows, not more than the warm-up of {model.n_warmup}: the fit would "
            "be only the initialisation. Pass more rows or a smaller --warmup."
        )
    started = time.perf_counter()
    reader = RowReader(args.samples, data)
    try:
        held_out, n_held_out = _stream(model, reader, args.batch_rows, f"fit {args.method}")
    except (ValueError, TypeError, ArithmeticError) as err:
        raise CommandError(f"{err} (nothing was written)") from err
    finally:
        reader.close()
    seconds = time.perf_counter() - started
    try:
        model.save(args.output)
    except OSError as err:
        raise CommandError(f"cannot write {args.output}: {err}") from err
    rate = n_samples / seconds if seconds > 0 else float("inf")
    megabytes = n_samples * n_features * data.dtype.itemsize / 1e6
    print(
        f"fitted {type(model).__name__} (D={n_features}, K={args.components}, config {args.config}) on "
        f"{n_samples} samples in {seconds:.2f} s ({rate:,.0f} samples/s, {megabytes / max(seconds, 1e-9):,.1f} MB/s); "
        f"{_held_out_summary(held_out, n_held_out, n_samples, model.n_warmup, args.batch_rows)} -> {args.output}"
    )
    return 0


def _run_minibatch(args: argparse.Namespace, data: np.ndarray[Any, Any]) -> int:
    """``--minibatch B``: :func:`onlinefa.fit_minibatch` on the file (positioned reads, bounded memory)."""
    from .minibatch import fit_minibatch

    n_samples, n_features = data.shape
    if args.method != "em" or args.config != "default":
        raise CommandError("--minibatch is mini-batch EM: it needs --method em and --config default")
    if n_samples < 2 or not 1 <= args.components < n_features:
        raise CommandError(f"--minibatch needs >= 2 rows and 1 <= K < D = {n_features}; got {n_samples} rows, "
                           f"K = {args.components}")
    del data  # the fit reads the file itself, batch by batch
    options: dict[str, Any] = {"whiten": args.whiten}
    if args.schedule is not None:
        options.update(schedule=args.schedule, tau0=args.tau0, kappa=args.kappa, rho=args.rho)
    started = time.perf_counter()
    try:
        with Progress(n_samples * args.passes, f"fit mini-batch EM (<= {args.passes} passes)") as bar:
            model, history = fit_minibatch(args.samples, args.components, batch_size=args.minibatch,
                                           max_iter=args.passes, random_state=args.seed, on_rows=bar.advance,
                                           **options)
    except (ValueError, TypeError, ArithmeticError) as err:
        raise CommandError(f"{err} (nothing was written)") from err
    seconds = time.perf_counter() - started
    try:
        model.save(args.output)
    except OSError as err:
        raise CommandError(f"cannot write {args.output}: {err}") from err
    rows = n_samples * history.n_passes
    print(
        f"fitted MiniBatchEM (D={n_features}, K={args.components}, batches of {args.minibatch}) in "
        f"{history.n_passes} passes over {n_samples} samples in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} "
        f"samples/s); average log-likelihood of up to 5000 rows: {history.scores[-1]:.4g} -> {args.output}"
    )
    return 0
