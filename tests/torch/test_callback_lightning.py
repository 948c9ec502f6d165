"""onlinefa.torch.lightning.PosteriorCallback on tiny real Lightning runs: the snapshots it collects are the
parameter vectors of the schedule (checked against a recorder callback that feeds its own OnlineEM), the SWA
learning rate, an exact resume from the trainer's checkpoint, and BMA at the end."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import onlinefa  # noqa: E402
from engine_state import engine_state  # noqa: E402
from onlinefa.torch.lightning import PosteriorCallback  # noqa: E402

N_ROWS, BATCH = 48, 16  # 3 optimiser steps per epoch


class TinyRegressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.lr = lr

    def forward(self, x: Any) -> Any:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader() -> Any:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_ROWS, 4, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(N_ROWS, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=False)


class Recorder(pl.Callback):  # type: ignore[misc]
    """Records θ and the learning rate after every optimiser step and at every epoch end."""

    def __init__(self) -> None:
        self.after_step: list[tuple[int, int, np.ndarray, float]] = []
        self.after_epoch: list[tuple[int, np.ndarray]] = []

    @staticmethod
    def theta(module: Any) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().astype(np.float32)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.after_step.append((trainer.current_epoch, trainer.global_step, self.theta(pl_module), lr))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.after_epoch.append((trainer.current_epoch, self.theta(pl_module)))


def fit(callbacks: list[Any], max_epochs: int, tmp_path: Path, ckpt_path: str | None = None,
        module: Any = None) -> Any:
    module = module if module is not None else TinyRegressor()
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", deterministic=True,
                         default_root_dir=tmp_path, enable_checkpointing=any(
                             isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice (num_workers, small data sets) on a tiny run
        trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return module


def reference(vectors: list[np.ndarray], n_components: int) -> onlinefa.OnlineEM:
    em = onlinefa.OnlineEM(vectors[0].size, n_components, seed=0, dtype="float32")
    for theta in vectors:
        em.update(theta)
    return em


def test_once_per_epoch_from_the_start_epoch(tmp_path: Path) -> None:
    swag, recorder = PosteriorCallback(n_components=3, start_epoch=2), Recorder()
    fit([swag, recorder], 7, tmp_path)
    expected = [theta for epoch, theta in recorder.after_epoch if epoch >= 2]
    assert len(expected) == 5 and swag.n_snapshots == 5
    assert isinstance(swag.posterior, onlinefa.OnlineEM) and swag.posterior.n_seen == 5
    assert engine_state(swag.posterior).keys() == engine_state(reference(expected, 3)).keys()
    for key, value in engine_state(reference(expected, 3)).items():
        np.testing.assert_array_equal(engine_state(swag.posterior)[key], value, err_msg=key)


def test_every_n_steps_and_the_swa_learning_rate(tmp_path: Path) -> None:
    swag, recorder = PosteriorCallback(n_components=2, every_n_steps=2, start_epoch=1, swa_lr=0.01), Recorder()
    fit([swag, recorder], 4, tmp_path)
    expected = [theta for epoch, step, theta, _ in recorder.after_step if epoch >= 1 and step % 2 == 0]
    assert swag.posterior.n_seen == len(expected) == 5  # steps 4, 6, 8, 10, 12
    np.testing.assert_array_equal(swag.posterior.loadings, reference(expected, 2).loadings)
    lrs = {epoch: {lr for e, _, _, lr in recorder.after_step if e == epoch} for epoch in range(4)}
    assert lrs == {0: {0.05}, 1: {0.01}, 2: {0.01}, 3: {0.01}}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_resumed_run_ends_with_the_posterior_of_an_uninterrupted_one(tmp_path: Path, asynchronous: bool) -> None:
    """With ``asynchronous=True`` the snapshots are fitted on a worker: the checkpoint must still hold all of them."""
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    whole = PosteriorCallback(n_components=3, start_epoch=1, dtype="float64", asynchronous=asynchronous)
    fit([whole, checkpoints], 6, tmp_path / "whole")
    saved = sorted((tmp_path / "ckpt").glob("epoch=2-*.ckpt"))
    assert len(saved) == 1
    stored = torch.load(saved[0], weights_only=True)  # the posterior is plain tensors in the checkpoint
    assert any("posterior" in state for state in stored["callbacks"].values())
    resumed = PosteriorCallback(n_components=3, start_epoch=1, dtype="float64", asynchronous=asynchronous)
    fit([resumed], 6, tmp_path / "resumed", ckpt_path=str(saved[0]))
    assert resumed.n_snapshots == 3 and resumed.posterior.n_seen == whole.posterior.n_seen == 5
    left, right = engine_state(resumed.posterior), engine_state(whole.posterior)
    for key, value in left.items():
        np.testing.assert_array_equal(value, right[key], err_msg=key)


def test_bayesian_model_average_under_the_fitted_posterior(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2)
    module = fit([swag], 5, tmp_path)
    x, y = next(iter(loader()))
    draws = swag.bayesian_model_average(module, [x], n_samples=8, seed=0, task="regression")
    assert draws.shape == (8, BATCH, 1) and torch.isfinite(draws).all()
    assert torch.all(draws.std(dim=0) > 0)  # the draws differ: a posterior, not a point
    mean = draws.mean(dim=0)
    # Eight draws from a posterior of five snapshots: predictions near the SWA point's.
    swa = torch.from_numpy(np.asarray(swag.posterior.mean, dtype=np.float32))
    torch.nn.utils.vector_to_parameters(swa, module.parameters())
    with torch.no_grad():
        point = module(x)
    assert torch.mean((mean - point) ** 2) < torch.mean((point - y) ** 2)


def test_bad_arguments_are_refused_before_training() -> None:
    with pytest.raises(ValueError, match="every_n_steps"):
        PosteriorCallback(every_n_steps=0)
    with pytest.raises(ValueError, match="swa_lr"):
        PosteriorCallback(swa_lr=-1.0)
    with pytest.raises(ValueError, match="start_epoch"):
        PosteriorCallback(start_epoch=-1)
    with pytest.raises(RuntimeError, match="no posterior yet"):
        PosteriorCallback().bayesian_model_average(torch.nn.Linear(2, 1), [torch.zeros(1, 2)])


# --- nothing lost, nothing loaded wrong ------------------------------------------------------------------


def _checkpointed_run(tmp_path: Path, callbacks: list[Any], max_epochs: int = 3) -> Path:
    """A run saving a checkpoint every epoch; the path of the one at the end of epoch 1."""
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    fit([*callbacks, checkpoints], max_epochs, tmp_path / "first")
    (saved,) = sorted((tmp_path / "ckpt").glob("epoch=1-*.ckpt"))
    return saved


def _posterior_key(stored: dict[str, Any]) -> str:
    (key,) = [k for k, state in stored["callbacks"].items() if "posterior" in state]
    return key


def test_bit_flips_in_the_checkpoints_posterior_are_refused(tmp_path: Path) -> None:
    first = PosteriorCallback(n_components=2, dtype="float64")
    saved = _checkpointed_run(tmp_path, [first])
    stored = torch.load(saved, weights_only=True)
    key = _posterior_key(stored)
    original = stored["callbacks"][key]["posterior"].clone()
    rng = np.random.default_rng(0)
    refused = 0
    for trial in range(8):
        damaged = original.clone()
        damaged[int(rng.integers(damaged.numel()))] ^= 1 << int(rng.integers(8))
        stored["callbacks"][key]["posterior"] = damaged
        path = tmp_path / f"damaged-{trial}.ckpt"
        torch.save(stored, path)
        callback = PosteriorCallback(n_components=2, dtype="float64")
        try:
            fit([callback], 3, tmp_path / f"resumed-{trial}", ckpt_path=str(path))
        except ValueError as err:
            assert "the posterior in the Lightning checkpoint" in str(err)
            refused += 1
        else:  # a flip in bytes no reader looks at (a zip timestamp): the posterior is the saved one
            assert callback.posterior.n_seen == first.posterior.n_seen
    assert refused >= 6


@pytest.mark.parametrize("changed", [{"n_components": 3}, {"dtype": "float32"}])
def test_a_resume_with_other_settings_is_refused_or_reset(tmp_path: Path, changed: dict[str, Any]) -> None:
    saved = _checkpointed_run(tmp_path, [PosteriorCallback(n_components=2, dtype="float64")])
    settings: dict[str, Any] = {"n_components": 2, "dtype": "float64", **changed}
    with pytest.raises(onlinefa.errors.PosteriorResumeError, match=next(iter(changed))):
        fit([PosteriorCallback(**settings)], 4, tmp_path / "resumed", ckpt_path=str(saved))
    reset = PosteriorCallback(**settings, on_mismatch="reset")
    fit([reset], 4, tmp_path / "reset", ckpt_path=str(saved))
    assert reset.posterior.n_components == settings["n_components"] and reset.posterior.dtype == settings["dtype"]
    assert reset.posterior.n_seen == 2  # epochs 2 and 3


def test_a_checkpoint_without_the_posterior_is_refused_unless_asked_to_warn(tmp_path: Path) -> None:
    saved = _checkpointed_run(tmp_path, [])  # written without the callback
    with pytest.raises(onlinefa.errors.PosteriorResumeError, match="holds no posterior"):
        fit([PosteriorCallback(n_components=2)], 4, tmp_path / "resumed", ckpt_path=str(saved))
    fresh = PosteriorCallback(n_components=2, on_missing="warn")
    with pytest.warns(UserWarning, match="the posterior starts empty"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the frameworks' advice on a tiny run
        warnings.filterwarnings("always", module="onlinefa")
        trainer = pl.Trainer(max_epochs=4, callbacks=[fresh], logger=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", enable_checkpointing=False,
                             default_root_dir=tmp_path / "warned")
        trainer.fit(TinyRegressor(), loader(), ckpt_path=str(saved))
    assert fresh.posterior.n_seen == 2


def test_bad_settings_are_refused_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="dtype"):
        PosteriorCallback(dtype="float16")
    with pytest.raises(ValueError, match="on_missing"):
        PosteriorCallback(on_missing="ignore")


class StepRecorder(pl.Callback):  # type: ignore[misc]
    """θ after every optimiser step (the step hook of the optimiser itself, not the trainer's counters)."""

    def __init__(self) -> None:
        self.thetas: list[np.ndarray] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        trainer.optimizers[0].register_step_post_hook(
            lambda *args: self.thetas.append(Recorder.theta(pl_module)))


@pytest.mark.parametrize("accumulation", [2, 3])
def test_gradient_accumulation_collects_each_optimiser_step_once(tmp_path: Path, accumulation: int) -> None:
    swag, steps = PosteriorCallback(n_components=2, every_n_steps=1), StepRecorder()
    trainer = pl.Trainer(max_epochs=3, callbacks=[swag, steps], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", enable_checkpointing=False,
                         accumulate_grad_batches=accumulation, default_root_dir=tmp_path)
    data = torch.utils.data.DataLoader(loader().dataset, batch_size=8, shuffle=False)  # 6 batches an epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyRegressor(), data)
    assert len(steps.thetas) == trainer.global_step == 3 * (-(-6 // accumulation))
    assert swag.posterior.n_seen == len(steps.thetas)
    left, right = engine_state(swag.posterior), engine_state(reference(steps.thetas, 2))
    for key, value in right.items():
        np.testing.assert_array_equal(left[key], value, err_msg=key)


class EpochSeededSampler(torch.utils.data.Sampler):  # type: ignore[misc]
    """The usage guide's recipe."""

    def __init__(self, n_rows: int, seed: int = 0) -> None:
        self.n_rows, self.seed, self.epoch = n_rows, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n_rows, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n_rows


def _shuffled_fit(callbacks: list[Any], root: Path, sampler: bool, ckpt_path: str | None = None,
                  ours: Any = "error") -> Any:
    """A run of 4 epochs over shuffled batches; the library's own warnings get the action ``ours``, the
    frameworks' advice on a tiny run is ignored."""
    dataset = loader().dataset
    data = (torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=EpochSeededSampler(len(dataset)))
            if sampler else torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True))
    trainer = pl.Trainer(max_epochs=4, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", deterministic=True, default_root_dir=root,
                         enable_checkpointing=any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks))
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings(ours, module="onlinefa")
        trainer.fit(TinyRegressor(), data, ckpt_path=ckpt_path)


@pytest.mark.parametrize("sampler", [True, False], ids=["epoch-seeded sampler", "shuffle=True"])
def test_a_shuffled_resume_is_exact_with_the_epoch_seeded_sampler_and_warns_without(tmp_path: Path,
                                                                                    sampler: bool) -> None:
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    whole = PosteriorCallback(n_components=2, dtype="float64")
    _shuffled_fit([whole, checkpoints], tmp_path / "whole", sampler)
    (saved,) = sorted((tmp_path / "ckpt").glob("epoch=1-*.ckpt"))
    resumed = PosteriorCallback(n_components=2, dtype="float64")
    if sampler:
        _shuffled_fit([resumed], tmp_path / "resumed", sampler, str(saved), ours="error")
        left, right = engine_state(resumed.posterior), engine_state(whole.posterior)
        for key, value in right.items():
            np.testing.assert_array_equal(left[key], value, err_msg=key)
    else:
        with pytest.warns(UserWarning, match="RandomSampler"):
            _shuffled_fit([resumed], tmp_path / "resumed", sampler, str(saved), ours="always")


# --- what a trainer user expects: a parameter filter, annealing, the SWA weights, logged metrics ----------


def test_a_posterior_over_chosen_parameters(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, parameters=lambda module: module.net[2].parameters())
    recorder = Recorder()
    module = fit([swag, recorder], 4, tmp_path)
    assert swag.posterior.n_features == 9  # the last layer: 8 weights and a bias
    last_layer = [theta[-9:] for _, theta in recorder.after_epoch]
    left, right = engine_state(swag.posterior), engine_state(reference(last_layer, 2))
    for key, value in right.items():
        np.testing.assert_array_equal(left[key], value, err_msg=key)
    x, _ = next(iter(loader()))
    first = module.net[0].weight.detach().clone()
    draws = swag.bayesian_model_average(module, [x], n_samples=4, seed=0, task="regression")
    assert torch.all(draws.std(dim=0) > 0) and torch.equal(module.net[0].weight, first)


def test_the_learning_rate_anneals_to_swa_lr_and_resumes_mid_annealing(tmp_path: Path) -> None:
    def lrs(recorder: Recorder) -> dict[int, set[float]]:
        return {e: {round(lr, 12) for epoch, _, _, lr in recorder.after_step if epoch == e}
                for e in {epoch for epoch, _, _, _ in recorder.after_step}}

    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    whole, recorder = PosteriorCallback(n_components=2, start_epoch=1, swa_lr=0.01, anneal_epochs=3), Recorder()
    fit([whole, recorder, checkpoints], 6, tmp_path / "whole")
    alpha = [(1 - math.cos(math.pi * i / 3)) / 2 for i in (1, 2)]
    assert lrs(recorder) == {0: {0.05}, 1: {round(alpha[0] * 0.01 + (1 - alpha[0]) * 0.05, 12)},
                             2: {round(alpha[1] * 0.01 + (1 - alpha[1]) * 0.05, 12)}, 3: {0.01}, 4: {0.01},
                             5: {0.01}}
    (saved,) = sorted((tmp_path / "ckpt").glob("epoch=1-*.ckpt"))  # mid-annealing
    resumed = PosteriorCallback(n_components=2, start_epoch=1, swa_lr=0.01, anneal_epochs=3)
    later = Recorder()
    fit([resumed, later], 6, tmp_path / "resumed", ckpt_path=str(saved))
    assert lrs(later) == {e: v for e, v in lrs(recorder).items() if e >= 2}
    with pytest.raises(ValueError, match="anneal_epochs needs swa_lr"):
        PosteriorCallback(anneal_epochs=2)


class BatchNormRegressor(TinyRegressor):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1))


def test_the_swa_weights_are_left_in_the_model_with_fresh_batch_norm_statistics(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, start_epoch=1, swa_weights=True)
    module = fit([swag], 5, tmp_path, module=BatchNormRegressor())
    mean = torch.from_numpy(np.asarray(swag.posterior.mean, dtype=np.float32))
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(module.parameters()), mean, rtol=0, atol=0)
    # the statistics of one pass over the training batches, at these weights: the plain average of the
    # batch means and unbiased batch variances of the layer's input
    inputs = [module.net[0](x).detach() for x, _ in loader()]
    norm = module.net[1]
    torch.testing.assert_close(norm.running_mean, torch.stack([i.mean(0) for i in inputs]).mean(0))
    torch.testing.assert_close(norm.running_var, torch.stack([i.var(0, unbiased=True) for i in inputs]).mean(0))
    plain = PosteriorCallback(n_components=2, start_epoch=1)
    kept = fit([plain], 5, tmp_path / "plain", module=BatchNormRegressor())
    assert not torch.equal(torch.nn.utils.parameters_to_vector(kept.parameters()), mean)  # the last iterate


def test_the_snapshot_count_and_cost_are_logged(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, every_n_steps=2)
    trainer = pl.Trainer(max_epochs=3, callbacks=[swag], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", enable_checkpointing=False,
                         default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyRegressor(), loader())
    metrics = trainer.callback_metrics
    assert float(metrics["onlinefa/n_snapshots"]) == swag.n_snapshots == 4  # steps 2, 4, 6, 8
    cost = float(metrics["onlinefa/snapshot_cost_in_steps"])
    assert math.isfinite(cost) and cost > 0


def test_the_recommended_recipe_takes_the_callbacks_posterior(tmp_path: Path) -> None:
    # The two lines of the usage guide with a Lightning module: the linearised draws at the chosen scale
    # are those the same posterior gives a plain module holding the same network.
    from onlinefa.torch import linearized_model_average, linearized_predictions, select_scale

    swag = PosteriorCallback(n_components=2)
    module = fit([swag], 5, tmp_path)
    val = list(loader())[:1]
    chosen = select_scale(linearized_predictions(module, swag.posterior, val, n_samples=8, seed=0),
                          task="regression", noise_variance=0.01)
    draws = linearized_model_average(module, swag.posterior, val, n_samples=8, scale=chosen.scale, seed=1,
                                     task="regression")
    plain = linearized_model_average(module.net, swag.posterior, val, n_samples=8, scale=chosen.scale, seed=1,
                                     task="regression")
    assert chosen.scale > 0 and draws.shape == (8, BATCH, 1)
    assert torch.allclose(draws, plain, rtol=1e-6, atol=1e-7)
