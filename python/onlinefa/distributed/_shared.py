"""What every sharded model shares: input conversion, the collective queries, checkpoints."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _core
from .._gaussian import sample_noise, sample_seed
from .._validation import as_numpy, as_sample_matrix, check_finite_samples, check_int
from ._comm import Communicator, exchange, new_tag
from ..errors import ShardCommunicationError
from ._layout import ShardLayout

FloatArray = NDArray[np.float64]

#: Version of the manifest written by ``save``.
MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"


def host_array(X: object) -> object:
    """A torch tensor on any device moved to host memory once (a CPU tensor is left as it is, zero-copy)."""
    device = getattr(X, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu" and hasattr(X, "cpu"):
        return X.cpu()
    return X


def local_matrix(X: ArrayLike, n_local: int) -> NDArray[Any]:
    """This rank's slice of a batch as an (n, D_local) float array the core reads in place."""
    return as_sample_matrix(host_array(X), n_local)  # type: ignore[arg-type]


def rank_file(rank: int, world_size: int, generation: int | None = None) -> str:
    """File name of one rank's checkpoint inside a sharded checkpoint directory.

    ``generation`` (a 48-bit id of one ``save``) is part of the names written since checkpoints became
    atomic sets; checkpoints of the previous layout name their files without it (``generation=None``).
    """
    if generation is None:
        return f"rank-{rank:05d}-of-{world_size:05d}.npz"
    return f"rank-{rank:05d}-of-{world_size:05d}.g{generation:012x}.npz"


#: Names of rank files, of either layout: rank, world size and (new layout) generation.
_RANK_FILE = re.compile(r"rank-(\d{5})-of-(\d{5})(?:\.g([0-9a-f]{12}))?\.npz")


class ShardedGaussianMixin:
    """Collective queries of a Gaussian N(c, F Fᵀ + Ψ) whose D rows are split across ranks."""

    _comm: Communicator
    _layout: ShardLayout
    _n_components: int
    _local: Any
    #: The single-process class of each rank's model.
    _local_class: Any

    def _local_engine(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._comm.rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._comm.world_size

    @property
    def layout(self) -> ShardLayout:
        """Row ranges of every rank."""
        return self._layout

    @property
    def row_range(self) -> tuple[int, int]:
        """This rank's rows [start, stop) of the whole vector."""
        return self._layout.row_range

    @property
    def n_features_total(self) -> int:
        """D of the whole model (the sum of every rank's ``n_features``)."""
        return self._layout.n_features_total

    @property
    def n_features(self) -> int:
        """This rank's number of rows (features)."""
        n: int = self._local.n_features
        return n

    @property
    def n_components(self) -> int:
        """K."""
        return self._n_components

    @property
    def local_model(self) -> Any:
        """The single-process model of this rank's rows (its K×K state is the whole model's). Read from it,
        but change it only through this object."""
        return self._local

    def snapshot(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """This rank's rows of the fitted Gaussian (c, F, ψ), read from one consistent state (no collective)."""
        mean, loadings, noise_variance = self._local.snapshot()
        return mean, loadings, noise_variance

    @property
    def mean(self) -> FloatArray:
        """This rank's entries of the mean c."""
        out: FloatArray = self._local.mean
        return out

    @property
    def loadings(self) -> FloatArray:
        """This rank's rows of F, shape (n_features, K)."""
        out: FloatArray = self._local.loadings
        return out

    @property
    def noise_variance(self) -> FloatArray:
        """This rank's entries of ψ."""
        out: FloatArray = self._local.noise_variance
        return out

    def _query_sums(self, X: ArrayLike, what: str) -> tuple[FloatArray, int]:
        failure: BaseException | None = None
        local: FloatArray | None = None
        n = 0
        try:
            x = np.ascontiguousarray(local_matrix(X, self._layout.sizes[self.rank]), dtype=np.float64)
            n = x.shape[0]
            # As the single-process queries: NaN, ±Inf or a too large value is an error (the failure travels
            # with the first collective below, so every rank raises, not only this one).
            check_finite_samples(x)
            local = self._local_engine().query_sums(x)
        except Exception as err:
            failure = err
        k = self._n_components
        sizes = np.zeros(self.world_size, dtype=np.int64)
        sizes[self.rank] = n
        # The payload length depends on n: agree on it first when it could differ (one tiny collective).
        _, rows = exchange(self._comm, failure, None, 0, rows=n, what=what)
        if np.any(rows != rows[0]):
            raise ValueError(f"rank {self.rank}: {what}: the ranks passed different numbers of samples {rows.tolist()}")
        total, _ = exchange(self._comm, None, local, k * k + 1 + n + n * k, rows=n, what=what)
        return total, n

    def log_prob(self, X: ArrayLike) -> FloatArray:
        """Log density of whole vectors, given this rank's slice of each (collective: every rank calls it).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_features,)
            This rank's features of each sample (NumPy, or a torch tensor on any device).

        Returns
        -------
        ndarray of shape (n_samples,)
            log N(x; c, F Fᵀ + Ψ) of the whole vectors, identical on every rank.
        """
        total, n = self._query_sums(X, "log_prob")
        out: FloatArray = _core.log_prob_from_sums(total, n, self._n_components, self.n_features_total)
        return out

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior latent means E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − c) of whole vectors (collective).

        Returns
        -------
        ndarray of shape (n_samples, n_components), identical on every rank.
        """
        total, n = self._query_sums(X, "transform")
        out: FloatArray = _core.latent_mean_from_sums(total, n, self._n_components)
        return out

    def sample(self, n_samples: int = 1, seed: int | None = None, *, dtype: DTypeLike = np.float64) -> NDArray[Any]:
        """This rank's features of ``n_samples`` draws from the whole model (collective).

        Concatenated over ranks in rank order, the draws equal the single-process model's
        ``sample(n_samples, seed)`` exactly: the latent h comes from the seed and the noise of feature d from
        a counter-based generator keyed by d's index in the whole vector. With ``seed=None`` rank 0 draws a
        seed and sends it to the others, so every rank draws from the same vectors.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
            This rank's slice of the draws.

        Raises
        ------
        ValueError
            An invalid argument on any rank, or ranks that passed different ``n_samples`` or ``seed``
            (checked with the call's one collective): every rank raises.
        """
        failure: BaseException | None = None
        chosen, n, engine = 0, 0, None
        out_dtype: np.dtype[Any] = np.dtype(np.float64)
        try:
            n = check_int(n_samples, "n_samples", 0)
            out_dtype = np.dtype(dtype)
            if out_dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
                raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
            chosen = sample_seed(seed) if seed is not None else 0
            engine = self._local_engine()
        except Exception as err:
            failure = err
        # One collective: rank 0's fresh seed (when none is given) and every rank's (n, seed) in its own slots,
        # so that ranks which were given different arguments all raise instead of drawing different vectors.
        w = self.world_size
        payload = np.zeros(4 + 3 * w)
        if self.rank == 0 and seed is None:
            fresh = sample_seed(None)
            payload[:2] = (fresh >> 32, fresh & 0xFFFFFFFF)
        mine = (n, -1.0, -1.0) if seed is None else (n, chosen >> 32, chosen & 0xFFFFFFFF)
        payload[4 + 3 * self.rank: 7 + 3 * self.rank] = mine
        total, _ = exchange(self._comm, failure, payload, 4 + 3 * w, what="sample")
        calls = total[4:].reshape(w, 3)
        if np.any(calls != calls[0]):
            shown = [(int(a), None if b < 0 else (int(b) << 32) | int(c)) for a, b, c in calls]
            raise ValueError(
                f"rank {self.rank}: sample: every rank must pass the same n_samples and seed; got (n_samples, seed) "
                f"= {shown} by rank"
            )
        if seed is None:
            chosen = (int(total[0]) << 32) | int(total[1])
        start, stop = self.row_range
        assert engine is not None  # every rank succeeded above
        latent, out = sample_noise(n, self._n_components, stop - start, chosen, row0=start, dtype=out_dtype)
        engine.draw_into(latent, out)
        return out

    # -- checkpoints ---------------------------------------------------------------------------------------
    def _check_loaded(self, file: Path) -> None:
        """Checks of a loaded rank file beyond its row count (local; raise to refuse it)."""

    def _after_load(self) -> None:
        """Collective work after every rank has loaded its file."""

    def _save_local(self, path: Path) -> None:
        self._local.save(path)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a sharded checkpoint (collective): directory ``path`` gets one file per rank and a manifest.

        The manifest names the class, the world size, every rank's row range, file and SHA-256, and its own
        SHA-256. The set of files is replaced atomically: every rank writes its file under a new generation
        name beside the previous checkpoint's files, the ranks agree that every file was written, and only
        then rank 0 switches ``manifest.json`` to the new generation with one atomic rename. Once every rank
        knows the switch succeeded, each rank deletes its own files of other generations.

        Raises
        ------
        OSError, ValueError, RuntimeError
            Writing failed on this rank, or (on the other ranks) on the rank named in the message. Every
            rank raises; the directory's previous checkpoint still loads and the new generation's files are
            removed.
        ShardCommunicationError
            A collective failed (a peer died or the process group's timeout passed). The previous checkpoint
            still loads unless rank 0 had already switched the manifest, in which case the new one does.
        """
        directory = Path(path)
        rank, w = self.rank, self.world_size
        # 1. Agree on a new generation id (rank 0 draws it; the directory exists on every rank).
        failure: BaseException | None = None
        payload = np.zeros(1)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if rank == 0:
                payload[0] = _new_generation(directory)
        except Exception as err:
            failure = err
        total, _ = exchange(self._comm, failure, payload, 1, what="save (generation)")
        generation = int(total[0])
        # 2. Every rank writes its file of the new generation beside the old ones; agree that all succeeded.
        file = directory / rank_file(rank, w, generation)
        failure, digest = None, np.zeros(4)
        try:
            self._save_local(file)
            digest[:] = _digest_words(file)
        except Exception as err:
            failure = err
        payload = np.zeros(4 * w)
        payload[4 * rank: 4 * rank + 4] = digest
        try:
            total, _ = exchange(self._comm, failure, payload, 4 * w, what="save")
        except BaseException:
            _remove(file)  # the manifest still names the previous generation
            raise
        # 3. Rank 0 switches the manifest (atomic rename); every rank learns whether it did.
        failure, switched = None, False
        if rank == 0:
            try:
                _write_manifest(directory, type(self).__name__, self._layout, total.reshape(w, 4), generation)
                switched = True
            except Exception as err:
                failure = err
        try:
            exchange(self._comm, failure, None, 0, what="save (manifest)")
        except ShardCommunicationError:
            # A peer died after the files were written: rank 0 knows whether the manifest names them; the
            # others cannot tell, so they keep theirs (the next successful save removes them if orphaned).
            if rank == 0 and not switched:
                _remove(file)
            raise
        except BaseException:
            _remove(file)  # rank 0 reported that the manifest was not switched
            raise
        # 4. The new generation is the checkpoint: remove this rank's files of any other generation.
        _remove_other_generations(directory, rank, w, file.name)

    @classmethod
    def _load_local(cls, file: Path, device: Any) -> Any:
        """This rank's model from its file; ``device`` where the rows go (None: the Rust core)."""
        if device is not None:
            raise TypeError(f"{cls.__name__}.load takes no device; load it without one")
        return cls._local_class.load(file)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, group: Any = None, allreduce: Any = None,
             rank: int | None = None, world_size: int | None = None, device: Any = None) -> Any:
        """Read a checkpoint written by :meth:`save` with the same number of ranks (collective).

        Each rank reads the file of its own rank; the manifest's SHA-256 detects a file of another rank or
        another save. Updates then continue bit-identically. ``device`` (the streaming models): where this
        rank's rows go, as the constructor's; a checkpoint saved from either row store loads into either.
        """
        comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        failure: BaseException | None = None
        model = cls.__new__(cls)
        model._comm, n_local = comm, 0
        try:
            file, sizes = read_manifest(Path(path), cls.__name__, comm.rank, comm.world_size)
            model._local = cls._load_local(file, device)
            model._n_components = model._local.n_components
            model._layout = ShardLayout(comm.rank, comm.world_size, sizes)
            n_local = model._local.n_features
            if n_local != sizes[comm.rank]:
                raise ValueError(f"{os.fspath(file)!r} holds {n_local} rows; the manifest gives rank {comm.rank} "
                                 f"{sizes[comm.rank]}")
        except Exception as err:
            failure = err
        tag = np.array([new_tag() if comm.rank == 0 else 0.0])  # the loaded model's tag (see exchange)
        total, _ = exchange(comm, failure, tag, 1, rows=n_local, what=f"loading {os.fspath(path)!r}")
        comm.tag = int(total[0])
        failure = None
        try:
            model._check_loaded(file)
        except Exception as err:
            failure = err
        exchange(comm, failure, None, 0, what=f"loading {os.fspath(path)!r}")
        model._after_load()
        return model


def _digest_words(file: Path) -> list[float]:
    digest = hashlib.sha256(file.read_bytes()).digest()
    return [float(int.from_bytes(digest[i: i + 6], "little")) for i in range(0, 24, 6)]


def _remove(file: Path) -> None:
    """Delete ``file`` if it exists (best effort: a failure to clean up never hides the real error)."""
    with contextlib.suppress(OSError):
        file.unlink()


def _current_generation(directory: Path) -> int | None:
    """The generation named by the directory's manifest, if it is readable (None otherwise)."""
    try:
        generation = json.loads((directory / MANIFEST_NAME).read_text()).get("generation")
    except (OSError, ValueError, AttributeError):
        return None
    return generation if isinstance(generation, int) else None


def _new_generation(directory: Path) -> int:
    """A random 48-bit generation id (exact in the float64 collective) that no file in ``directory`` uses."""
    current = _current_generation(directory)
    while True:
        generation = secrets.randbits(48)
        if generation != current and not any(directory.glob(f"rank-*.g{generation:012x}.npz")):
            return generation


def _remove_other_generations(directory: Path, rank: int, world_size: int, keep: str) -> None:
    """After a successful switch: delete this rank's rank files other than ``keep`` (older generations,
    files of the previous layout, failed saves); rank 0 also deletes files of ranks beyond the world size
    and manifest temporaries left by a killed process. Best effort: the checkpoint is already complete."""
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = _RANK_FILE.fullmatch(entry.name)
            if match is not None and entry.name != keep:
                if int(match.group(1)) == rank or (rank == 0 and int(match.group(1)) >= world_size):
                    _remove(entry)
            elif rank == 0 and entry.name.startswith(f".{MANIFEST_NAME}.") and entry.name.endswith(".tmp"):
                _remove(entry)


def _manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of a manifest's fields other than ``sha256`` (canonical JSON)."""
    body = {key: value for key, value in manifest.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write_manifest(directory: Path, kind: str, layout: ShardLayout, digests: FloatArray, generation: int) -> None:
    """Switch the directory's checkpoint to ``generation``: write the manifest to a temporary file, flush and
    sync it, rename it over ``manifest.json`` and sync the directory. On failure the previous manifest is
    untouched and the temporary file removed."""
    bounds = np.concatenate([[0], np.cumsum(layout.sizes)]).tolist()
    manifest: dict[str, Any] = {
        "format": "onlinefa-sharded-checkpoint",
        "version": MANIFEST_VERSION,
        "class": kind,
        "world_size": layout.world_size,
        "generation": generation,
        "row_ranges": [[int(bounds[r]), int(bounds[r + 1])] for r in range(layout.world_size)],
        "files": [rank_file(r, layout.world_size, generation) for r in range(layout.world_size)],
        "digests": [[int(v) for v in row] for row in digests],
    }
    manifest["sha256"] = _manifest_digest(manifest)
    tmp = directory / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(manifest, indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, directory / MANIFEST_NAME)
    except BaseException:
        _remove(tmp)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse fsync on directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _manifest_field(manifest: dict[str, Any], key: str, check: Any, what: str, shown: str) -> Any:
    value = manifest.get(key)
    try:
        ok = bool(check(value))
    except (TypeError, ValueError, KeyError, IndexError):
        ok = False
    if not ok:
        raise ValueError(f"{shown!r}: field {key!r} must be {what}, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_manifest(directory: Path, kind: str, rank: int, world_size: int) -> tuple[Path, tuple[int, ...]]:
    """Check a sharded checkpoint's manifest against this class, world size and this rank's file.

    Reads both layouts: the current one (files named with the save's generation, and the manifest's own
    SHA-256) and the previous one (files ``rank-RRRRR-of-WWWWW.npz``, no manifest digest). Every field is
    checked before use (a malformed field is a ``ValueError`` naming the manifest), and rank r's file must
    be rank r's name inside ``directory`` (a path elsewhere, or another rank's file, is refused).

    Returns this rank's file and every rank's row count.
    """
    manifest_path = directory / MANIFEST_NAME
    shown = os.fspath(manifest_path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{shown!r} is not a readable sharded-checkpoint manifest: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != "onlinefa-sharded-checkpoint":
        raise ValueError(f"{shown!r} is not an onlinefa sharded-checkpoint manifest")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{shown!r} has unknown format version {manifest.get('version')!r}")
    if "sha256" in manifest and manifest["sha256"] != _manifest_digest(manifest):
        raise ValueError(f"{shown!r} is corrupted: its SHA-256 does not match its content")
    if manifest.get("class") != kind:
        raise ValueError(f"{os.fspath(directory)!r} holds a {manifest.get('class')}, not a {kind}")
    if manifest.get("world_size") != world_size:
        raise ValueError(
            f"{os.fspath(directory)!r} was written by {manifest.get('world_size')} ranks and is loaded by "
            f"{world_size}; load it with the same number of ranks (re-sharding is not supported)"
        )
    generation = None
    if "generation" in manifest:
        generation = _manifest_field(manifest, "generation", lambda g: _is_int(g) and 0 <= g < 1 << 48,
                                     "a 48-bit non-negative integer", shown)
    ranges = _manifest_field(
        manifest, "row_ranges",
        lambda r: isinstance(r, list) and len(r) == world_size
        and all(isinstance(p, list) and len(p) == 2 and all(_is_int(v) for v in p) and p[0] < p[1] for p in r)
        and r[0][0] == 0 and all(r[i][1] == r[i + 1][0] for i in range(world_size - 1)),
        f"{world_size} contiguous non-empty [start, stop) ranges from 0", shown)
    files = _manifest_field(manifest, "files", lambda f: isinstance(f, list) and len(f) == world_size,
                            f"a list of {world_size} file names", shown)
    digests = _manifest_field(
        manifest, "digests",
        lambda d: isinstance(d, list) and len(d) == world_size
        and all(isinstance(p, list) and len(p) == 4 and all(_is_int(v) for v in p) for p in d),
        f"a list of {world_size} digests of 4 integers", shown)
    expected = rank_file(rank, world_size, generation)
    if files[rank] != expected:
        raise ValueError(f"{shown!r} names {files[rank]!r} as rank {rank}'s file; a checkpoint of this "
                         f"generation names it {expected!r} (inside the checkpoint directory)")
    file = directory / expected
    words = _digest_words(file) if file.is_file() else None
    if words is None or [int(v) for v in words] != digests[rank]:
        raise ValueError(
            f"{os.fspath(file)!r} is missing or is not the file rank {rank} wrote (its SHA-256 differs from the "
            "manifest's): was it replaced or moved between ranks?"
        )
    sizes = tuple(int(stop) - int(start) for start, stop in ranges)
    return file, sizes


def as_local_gradients(grad: ArrayLike, n_rows: int, n_local: int) -> NDArray[Any]:
    """VIFA gradients of this rank's rows as an (L, D_local) float array."""
    arr = as_numpy(host_array(grad))
    if arr.ndim == 1 and n_rows == 1:
        arr = arr.reshape(1, -1)
    if arr.shape != (n_rows, n_local):
        raise ValueError(f"expected gradients of shape ({n_rows}, {n_local}), got {arr.shape}")
    return as_sample_matrix(arr, n_local)
