"""The sharded models against the single-process models, with ranks simulated by threads (``allreduce=``).

The contract: after a stream (warm-up included) the concatenated mean, loadings and noise variances of
every rank equal the single-process model's to 1e-10 relative; queries and draws of the whole vector
agree; bad input on any rank makes every rank raise and leaves every state unchanged. The same models
over real ``torch.distributed`` processes are tested in test_distributed_torch.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa.distributed import ShardCommunicationError, ShardedOnlineEM, ShardedOnlineSGA, ShardedVIFA
from thread_ranks import ThreadRanks, run_ranks
from engine_state import engine_state

D, K, N = 37, 3, 1000
LAYOUTS = {1: [0, D], 2: [0, 20, D], 3: [0, 5, 30, D], 4: [0, 9, 18, 27, D]}
TOL = 1e-10


def data(n: int = N, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((D, K))
    return rng.standard_normal((n, K)) @ f.T + 0.3 * rng.standard_normal((n, D)) + 2.0


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def concat(results: list[Any], i: int) -> np.ndarray:
    return np.concatenate([r[i] for r in results], axis=-1 if np.ndim(results[0][i]) == 2 and i == 4 else 0)


STREAMING = {
    "em": (ShardedOnlineEM, onlinefa.OnlineEM, {}),
    "em-plain": (ShardedOnlineEM, onlinefa.OnlineEM, {"whiten": False, "schedule": "harmonic"}),
    "em-float32": (ShardedOnlineEM, onlinefa.OnlineEM, {"dtype": "float32"}),
    "sga": (ShardedOnlineSGA, onlinefa.OnlineSGA, {"lr": 1e-2}),
}


def check_errors(errors: list[BaseException | None]) -> None:
    for err in errors:
        if err is not None:
            raise err


@pytest.mark.parametrize("world", sorted(LAYOUTS))
@pytest.mark.parametrize("config", sorted(STREAMING))
@pytest.mark.slow
def test_streaming_shards_equal_the_single_process_model(config: str, world: int) -> None:
    sharded_cls, single_cls, options = STREAMING[config]
    x = data()
    single = single_cls(D, K, seed=5, **options).update(x)
    probe = x[:6]

    def body(rank: int, comm: dict[str, Any], rows: slice) -> tuple[Any, ...]:
        model = sharded_cls(rows.stop - rows.start, K, seed=5, **comm, **options)
        for i in range(0, N, 7):  # batches of 7, and the last one shorter
            model.update(x[i: i + 7, rows])
        return (model.mean, model.loadings, model.noise_variance, model.log_prob(probe[:, rows]),
                model.sample(4, seed=11), model.transform(probe[:, rows]), model.n_seen)

    results, errors = run_ranks(LAYOUTS[world], body)
    check_errors(errors)
    # float64: the sums over rows are added in another order, nothing else differs (1e-10 is the contract).
    # float32 state: each row's arithmetic is float32 (ε = 6e-8) and the order of the float32 partial
    # sums differs; over 1000 samples that reached 1.1e-6 in F and 6.4e-5 in ψ (whose d̄² − rowsum(F ⊙ Ā)
    # cancels), so the bound is the suite's float32 bound, 1e-3.
    tol = 1e-3 if options.get("dtype") == "float32" else TOL
    assert rel(np.concatenate([r[0] for r in results]), single.mean) < tol
    assert rel(np.concatenate([r[1] for r in results]), single.loadings) < tol
    assert rel(np.concatenate([r[2] for r in results]), single.noise_variance) < tol
    for r in results:
        assert r[6] == N
        assert rel(r[3], single.log_prob(probe)) < tol
        assert rel(r[5], single.transform(probe)) < tol
    assert rel(np.concatenate([r[4] for r in results], axis=1), single.sample(4, seed=11)) < tol


VIFA_OPTIONS = {
    "adam": {"optimizer": "adam"},
    "sgd-clip-L2": {"optimizer": "sgd", "clip_grad_norm": 1.0, "n_grad_samples": 2},
}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
@pytest.mark.parametrize("config", sorted(VIFA_OPTIONS))
@pytest.mark.slow
def test_vifa_shards_equal_the_single_process_model(config: str, world: int) -> None:
    rng = np.random.default_rng(1)
    centre, curvature = rng.standard_normal(D), rng.uniform(0.5, 2.0, D)
    options = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2,
               **VIFA_OPTIONS[config]}
    steps = 500
    single = onlinefa.VIFA(D, K, seed=3, **options)
    draws = single.n_grad_samples
    for _ in range(steps):
        theta = np.stack([single.sample() for _ in range(draws)])
        single.step(curvature * (theta - centre))

    def body(rank: int, comm: dict[str, Any], rows: slice) -> tuple[Any, ...]:
        model = ShardedVIFA(rows.stop - rows.start, K, seed=3, **comm, **options)
        for _ in range(steps):
            theta = np.stack([model.sample() for _ in range(draws)])
            model.step(curvature[rows] * (theta - centre[rows]))
        return model.mean, model.loadings, model.noise_variance, model.log_prob(centre[None, rows])

    results, errors = run_ranks(LAYOUTS[world], body)
    check_errors(errors)
    assert rel(np.concatenate([r[0] for r in results]), single.mean) < TOL
    assert rel(np.concatenate([r[1] for r in results]), single.loadings) < TOL
    assert rel(np.concatenate([r[2] for r in results]), single.noise_variance) < TOL
    for r in results:
        assert rel(r[3], single.log_prob(centre[None])) < TOL


@pytest.mark.parametrize("shrink", [True, False])
def test_em_takes_one_collective_per_sample(shrink: bool) -> None:
    """One collective per sample (the E-step sums), and with the reporting shrinkage one more per call (the
    Gram matrix over every rank's rows, once the model is fitted)."""
    x = data(40)
    ranks = ThreadRanks(2)
    models: list[Any] = [None, None]
    bounds = LAYOUTS[2]

    def build(rank: int) -> None:
        models[rank] = ShardedOnlineEM(bounds[rank + 1] - bounds[rank], K, seed=1, shrink=shrink, **ranks.kwargs(rank))

    def feed(rank: int) -> None:
        models[rank].update(x[:, bounds[rank]: bounds[rank + 1]])

    for step in (build, feed):
        before = ranks.calls
        threads = [__import__("threading").Thread(target=step, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if step is feed:
            assert ranks.calls - before == len(x) + int(shrink)


def states(results: list[Any]) -> list[dict[str, Any]]:
    return [r for r in results]


def equal_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


BAD_INPUTS = {
    "nan": lambda x: np.where(np.arange(x.shape[1]) == 1, np.nan, x),
    "wrong-length": lambda x: x[:, :-1],
    "fewer-rows": lambda x: x[:-1],
    "text": lambda x: np.full(x.shape, "a"),
}


@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
@pytest.mark.parametrize("sharded_cls", [ShardedOnlineEM, ShardedOnlineSGA])
def test_bad_input_on_one_rank_raises_on_every_rank_and_changes_nothing(sharded_cls: Any, bad: str) -> None:
    x = data(60)

    def body(rank: int, comm: dict[str, Any], rows: slice) -> tuple[Any, ...]:
        model = sharded_cls(rows.stop - rows.start, K, seed=2, **comm)
        model.update(x[:30, rows])
        before = engine_state(model.local_model)
        batch = x[30:36, rows]
        try:
            model.update(BAD_INPUTS[bad](batch) if rank == 1 else batch)
        except (ValueError, TypeError) as err:
            raised: BaseException | None = err
        else:
            raised = None
        after = engine_state(model.local_model)
        model.update(x[36:, rows])  # every rank still works, in step with the others
        return raised, equal_states(before, after), model.n_seen

    results, errors = run_ranks(LAYOUTS[3], body)
    check_errors(errors)
    for rank, (raised, unchanged, n_seen) in enumerate(results):
        assert raised is not None, f"rank {rank} did not raise"
        assert ("rank 1" in str(raised)) or ("[1]" in str(raised)) or "same number" in str(raised)
        assert unchanged, f"rank {rank}'s state changed"
        assert n_seen == 30 + 24


def test_vifa_bad_gradients_on_one_rank_change_nothing() -> None:
    options = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2}

    def body(rank: int, comm: dict[str, Any], rows: slice) -> tuple[Any, ...]:
        model = ShardedVIFA(rows.stop - rows.start, K, seed=4, **comm, **options)
        theta = model.sample()
        before = engine_state(model.local_model)
        grad = theta.copy()
        if rank == 0:
            grad[0] = np.inf
        try:
            model.step(grad)
        except ValueError as err:
            raised: BaseException | None = err
        else:
            raised = None
        unchanged = equal_states(before, engine_state(model.local_model))
        model.step(theta)  # the pending draw is still there on every rank
        return raised, unchanged, model.n_steps

    results, errors = run_ranks(LAYOUTS[2], body)
    check_errors(errors)
    for raised, unchanged, n_steps in results:
        assert isinstance(raised, ValueError) and unchanged and n_steps == 1


@pytest.mark.parametrize(
    "rank1_options, match",
    [({"n_components": K + 1}, "differ from rank 0"), ({"whiten": False}, "differ from rank 0"),
     ({"n_features": 2}, "needs more than K")],
)
def test_construction_checks_every_rank(rank1_options: dict[str, Any], match: str) -> None:
    def body(rank: int, comm: dict[str, Any], rows: slice) -> None:
        args = {"n_features": rows.stop - rows.start, "n_components": K, "seed": 1}
        if rank == 1:
            args.update(rank1_options)
        ShardedOnlineEM(**args, **comm)

    _, errors = run_ranks(LAYOUTS[3], body)
    for err in errors:
        assert isinstance(err, ValueError) and err is not None
    assert match in str(errors[1])


@pytest.mark.slow
def test_a_rank_that_never_arrives_is_a_clear_error_not_a_hang() -> None:
    def body(rank: int, comm: dict[str, Any], rows: slice) -> None:
        model = ShardedOnlineEM(rows.stop - rows.start, K, seed=1, **comm)
        if rank == 0:
            model.update(data(3)[:, rows])  # rank 1 has "died"

    _, errors = run_ranks(LAYOUTS[2], body, timeout=2.0)
    assert isinstance(errors[0], ShardCommunicationError)
    assert "rank 0" in str(errors[0]) and "peer" in str(errors[0])


def test_save_and_load_resume_bit_exactly(tmp_path: Any) -> None:
    x = data(400)
    bounds = LAYOUTS[3]

    def uninterrupted(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        model = ShardedOnlineEM(rows.stop - rows.start, K, seed=6, **comm).update(x[:, rows])
        return engine_state(model.local_model)

    def resumed(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        model = ShardedOnlineEM(rows.stop - rows.start, K, seed=6, **comm).update(x[:250, rows])
        model.save(tmp_path / "ckpt")
        again = ShardedOnlineEM.load(tmp_path / "ckpt", **comm).update(x[250:, rows])
        return engine_state(again.local_model)

    first, errors = run_ranks(bounds, uninterrupted)
    check_errors(errors)
    second, errors = run_ranks(bounds, resumed)
    check_errors(errors)
    for a, b in zip(first, second):
        assert equal_states(a, b)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names[0] == "manifest.json" and len(names) == 4
    assert [re.fullmatch(r"rank-0000(\d)-of-00003\.g[0-9a-f]{12}\.npz", n) is not None for n in names[1:]] == [True] * 3


def test_loading_with_another_layout_or_swapped_files_is_a_clear_error(tmp_path: Any) -> None:
    x = data(50)

    def save(rank: int, comm: dict[str, Any], rows: slice) -> None:
        ShardedOnlineSGA(rows.stop - rows.start, K, seed=6, **comm).update(x[:, rows]).save(tmp_path / "ckpt")

    check_errors(run_ranks(LAYOUTS[2], save)[1])

    def load(rank: int, comm: dict[str, Any], rows: slice) -> None:
        ShardedOnlineSGA.load(tmp_path / "ckpt", **comm)

    _, errors = run_ranks(LAYOUTS[3], load)
    assert all(isinstance(e, ValueError) for e in errors)
    assert "written by 2 ranks and is loaded by 3" in str(errors[0])
    _, errors = run_ranks(LAYOUTS[2], lambda r, c, s: ShardedOnlineEM.load(tmp_path / "ckpt", **c))
    assert all(isinstance(e, ValueError) for e in errors) and "holds a ShardedOnlineSGA" in str(errors[0])
    a, b = (tmp_path / "ckpt" / name for name in json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["files"])
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    _, errors = run_ranks(LAYOUTS[2], load)
    assert all(isinstance(e, ValueError) for e in errors)
    assert "not the file rank 0 wrote" in str(errors[0])


def test_torch_tensor_slices_are_read_like_numpy() -> None:
    torch = pytest.importorskip("torch")
    x = data(30)

    def body(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        a = ShardedOnlineEM(rows.stop - rows.start, K, seed=7, **comm).update(x[:, rows])
        b = ShardedOnlineEM(rows.stop - rows.start, K, seed=7, **comm).update(torch.from_numpy(x[:, rows].copy()))
        return equal_states(engine_state(a.local_model), engine_state(b.local_model))

    results, errors = run_ranks(LAYOUTS[2], body)
    check_errors(errors)
    assert all(results)


def test_importing_onlinefa_distributed_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, onlinefa.distributed; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shard_range_splits_evenly_and_covers_every_row() -> None:
    from onlinefa.distributed import shard_range

    for n, world in [(10, 3), (7, 7), (100, 4)]:
        ranges = [shard_range(n, r, world) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        shard_range(2, 0, 3)


def test_vifa_save_and_load_resume_bit_exactly(tmp_path: Any) -> None:
    options = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2,
               "optimizer": "adam"}
    centre = np.linspace(-1.0, 1.0, D)

    def train(model: Any, rows: slice, steps: int) -> Any:
        for _ in range(steps):
            model.step(model.sample() - centre[rows])
        return model

    def uninterrupted(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        model = train(ShardedVIFA(rows.stop - rows.start, K, seed=2, **comm, **options), rows, 30)
        return engine_state(model.local_model)

    def resumed(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        train(ShardedVIFA(rows.stop - rows.start, K, seed=2, **comm, **options), rows, 12).save(tmp_path / "v")
        model = train(ShardedVIFA.load(tmp_path / "v", **comm), rows, 18)
        return engine_state(model.local_model)

    first, errors = run_ranks(LAYOUTS[3], uninterrupted)
    check_errors(errors)
    second, errors = run_ranks(LAYOUTS[3], resumed)
    check_errors(errors)
    assert all(equal_states(a, b) for a, b in zip(first, second))
