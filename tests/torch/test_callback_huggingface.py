"""onlinefa.torch.huggingface.PosteriorCallback on tiny real transformers.Trainer runs: the collection
schedule (checked against a recorder callback feeding its own OnlineEM), the SWA learning rate, the posterior
written into every checkpoint and an exact resume from one, and BMA at the end. No download: the model is a
small torch module built here."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import onlinefa  # noqa: E402
from engine_state import engine_state  # noqa: E402
from onlinefa.torch.huggingface import POSTERIOR_FILE, PosteriorCallback  # noqa: E402

N_ROWS, BATCH = 48, 16  # 3 optimiser steps per epoch


class TinyRegressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x: Any, labels: Any = None) -> Any:
        out = self.net(x)
        if labels is None:
            return out
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def rows() -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_ROWS, 4, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(N_ROWS, 1, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(N_ROWS)]


class InOrderTrainer(transformers.Trainer):  # type: ignore[misc]
    """The rows in order every epoch, so that runs compare step by step."""

    def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.data.SequentialSampler(self.train_dataset)


class Recorder(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.after_step: list[tuple[float, int, np.ndarray, float]] = []
        self.after_epoch: list[np.ndarray] = []

    @staticmethod
    def theta(model: Any) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().astype(np.float32)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                              **kwargs: Any) -> None:
        self.step_lr = optimizer.param_groups[0]["lr"]  # the rate of this optimiser step

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after_step.append((state.epoch, state.global_step, self.theta(model), self.step_lr))

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after_epoch.append(self.theta(model))


def train(callbacks: list[Any], epochs: int, out: Path, resume: str | bool | None = None, save: bool = False) -> Any:
    model = TinyRegressor()
    args = transformers.TrainingArguments(
        output_dir=str(out), num_train_epochs=epochs, per_device_train_batch_size=BATCH, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, save_strategy="epoch" if save else "no",
        report_to=[], logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = InOrderTrainer(model=model, args=args, train_dataset=rows(), callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers|accelerate|torch")  # their advice on tiny runs
        trainer.train(resume_from_checkpoint=resume)
    return model


def reference(vectors: list[np.ndarray], n_components: int, dtype: str = "float32") -> onlinefa.OnlineEM:
    em = onlinefa.OnlineEM(vectors[0].size, n_components, seed=0, dtype=dtype)
    for theta in vectors:
        em.update(theta)
    return em


def test_once_per_epoch_from_the_start_epoch(tmp_path: Path) -> None:
    swag, recorder = PosteriorCallback(n_components=3, start_epoch=2), Recorder()
    train([swag, recorder], 6, tmp_path)
    expected = recorder.after_epoch[2:]
    assert len(expected) == 4 and swag.posterior.n_seen == 4
    for key, value in engine_state(reference(expected, 3)).items():
        np.testing.assert_array_equal(engine_state(swag.posterior)[key], value, err_msg=key)


def test_every_n_steps_and_the_swa_learning_rate(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, every_n_steps=2, start_epoch=1, swa_lr=0.01)
    recorder = Recorder()
    train([swag, recorder], 4, tmp_path)
    expected = [theta for epoch, step, theta, _ in recorder.after_step if epoch > 1 and step % 2 == 0]
    assert swag.posterior.n_seen == len(expected) == 5  # steps 4, 6, 8, 10, 12
    np.testing.assert_array_equal(swag.posterior.loadings, reference(expected, 2).loadings)
    lr_by_epoch = {int(np.ceil(epoch)) - 1: lr for epoch, _, _, lr in recorder.after_step}
    assert lr_by_epoch == {0: 0.05, 1: 0.01, 2: 0.01, 3: 0.01}


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_posterior_of_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = PosteriorCallback(n_components=3, start_epoch=1, dtype="float64")
    train([whole], 5, tmp_path / "whole", save=True)
    checkpoint = tmp_path / "whole" / "checkpoint-6"  # the end of epoch 2 (3 steps per epoch)
    assert (checkpoint / POSTERIOR_FILE).is_file()
    # The usual resume: the latest checkpoint of the output folder (the later ones removed).
    run = tmp_path / "run"
    shutil.copytree(checkpoint, run / "checkpoint-6")
    resumed = PosteriorCallback(n_components=3, start_epoch=1, dtype="float64")
    train([resumed], 5, run, resume=True)
    # A checkpoint outside the output folder, named to the callback.
    elsewhere = PosteriorCallback(n_components=3, start_epoch=1, dtype="float64")
    elsewhere.load_checkpoint(checkpoint)
    train([elsewhere], 5, tmp_path / "elsewhere", resume=str(checkpoint))
    right = engine_state(whole.posterior)
    for callback in (resumed, elsewhere):
        assert callback.n_snapshots == 3 and callback.posterior.n_seen == whole.posterior.n_seen == 4
        for key, value in engine_state(callback.posterior).items():
            np.testing.assert_array_equal(value, right[key], err_msg=key)


def test_bayesian_model_average_under_the_fitted_posterior(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2)
    model = train([swag], 5, tmp_path)
    batch = rows()[:BATCH]
    x = torch.stack([r["x"] for r in batch])
    draws = swag.bayesian_model_average(model, [x], n_samples=8, seed=0, task="regression")
    assert draws.shape == (8, BATCH, 1) and torch.isfinite(draws).all()
    assert torch.all(draws.std(dim=0) > 0)


def test_the_recommended_recipe_takes_the_callbacks_posterior_and_dict_batches(tmp_path: Path) -> None:
    # The usage guide's two lines with the Trainer's own dict batches (inputs as keywords, "labels" as the
    # targets): the linearised draws at the chosen scale are those of the same network fed tensors.
    from onlinefa.torch import linearized_model_average, linearized_predictions, select_scale

    swag = PosteriorCallback(n_components=2)
    model = train([swag], 5, tmp_path)
    batch = rows()[:BATCH]
    dict_batches = [{"x": torch.stack([r["x"] for r in batch]), "labels": torch.stack([r["labels"] for r in batch])}]
    predictions = linearized_predictions(model, swag.posterior, dict_batches, n_samples=8, seed=0)
    chosen = select_scale(predictions, task="regression", noise_variance=0.01)
    draws = linearized_model_average(model, swag.posterior, dict_batches, n_samples=8, scale=chosen.scale, seed=1,
                                     task="regression")
    plain = linearized_model_average(model.net, swag.posterior, [(dict_batches[0]["x"],)], n_samples=8,
                                     scale=chosen.scale, seed=1, task="regression")
    assert torch.equal(predictions.targets, dict_batches[0]["labels"])
    assert chosen.scale > 0 and draws.shape == (8, BATCH, 1)
    assert torch.allclose(draws, plain, rtol=1e-6, atol=1e-7)


# --- nothing lost, nothing loaded wrong ------------------------------------------------------------------


class Killed(BaseException):
    """The process dying at this point: nothing after it runs (not even the trainer's exception handling)."""


def _kill_on_save_at(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the callback's on_save die at ``step``, after the trainer has written (and rotated) checkpoint-N."""
    original = PosteriorCallback.on_save

    def on_save(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == step:
            raise Killed
        original(self, args, state, control, **kwargs)

    monkeypatch.setattr(PosteriorCallback, "on_save", on_save)


def _train_with(callbacks: list[Any], epochs: int, out: Path, resume: Any = None, **options: Any) -> Any:
    model = TinyRegressor()
    settings: dict[str, Any] = dict(
        output_dir=str(out), num_train_epochs=epochs, per_device_train_batch_size=BATCH, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, save_strategy="epoch", report_to=[],
        logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    settings.update(options)
    trainer = InOrderTrainer(model=model, args=transformers.TrainingArguments(**settings), train_dataset=rows(),
                             callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers|accelerate|torch")
        trainer.train(resume_from_checkpoint=resume)
    return model


def _assert_same_posterior(left: Any, right: Any) -> None:
    expected = engine_state(right)
    for key, value in engine_state(left).items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)


@pytest.mark.parametrize("save_total_limit", [None, 1])
@pytest.mark.slow
def test_a_kill_between_the_trainers_save_and_the_callbacks_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, save_total_limit: int | None) -> None:
    whole = PosteriorCallback(n_components=3, dtype="float64")
    _train_with([whole], 4, tmp_path / "whole")
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _kill_on_save_at(6, patch)  # the end of epoch 2 (3 steps per epoch)
        with pytest.raises(Killed):
            _train_with([PosteriorCallback(n_components=3, dtype="float64")], 4, run,
                        save_total_limit=save_total_limit)
    assert (run / "checkpoint-6").is_dir() and not (run / "checkpoint-6" / POSTERIOR_FILE).exists()
    if save_total_limit == 1:  # the trainer has already removed the checkpoint before
        assert not (run / "checkpoint-3").exists()
    resumed = PosteriorCallback(n_components=3, dtype="float64")
    _train_with([resumed], 4, run, resume=True, save_total_limit=save_total_limit)
    remaining = sorted(run.glob("checkpoint-*"))
    assert remaining and all((folder / POSTERIOR_FILE).is_file() for folder in remaining)
    assert len(remaining) == (1 if save_total_limit == 1 else 4)
    assert resumed.n_snapshots == 2 and resumed.posterior.n_seen == whole.posterior.n_seen == 4
    _assert_same_posterior(resumed.posterior, whole.posterior)
    assert not list(run.glob(".onlinefa_posterior-step-*"))  # nothing pending is left behind


def test_bit_flips_in_the_saved_posterior_are_refused_naming_the_file(tmp_path: Path) -> None:
    first = PosteriorCallback(n_components=2, dtype="float64")
    _train_with([first], 2, tmp_path / "run")
    path = tmp_path / "run" / "checkpoint-6" / POSTERIOR_FILE
    original = path.read_bytes()
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(8):
        damaged = bytearray(original)
        position = int(rng.integers(len(damaged)))
        damaged[position] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(damaged))
        callback = PosteriorCallback(n_components=2, dtype="float64")
        try:
            callback.load_checkpoint(path.parent)
        except ValueError as err:
            assert str(path) in str(err)
            refused += 1
        else:  # a flip in bytes no reader looks at (a zip timestamp): the very same posterior
            _assert_same_posterior(callback._core.posterior, first.posterior)
    assert refused >= 6
    path.write_bytes(original[: len(original) // 2])
    with pytest.raises(ValueError, match="onlinefa_posterior.npz"):
        _train_with([PosteriorCallback(n_components=2, dtype="float64")], 3, tmp_path / "run", resume=True)


@pytest.mark.parametrize("changed", [{"n_components": 3}, {"dtype": "float32"}])
@pytest.mark.slow
def test_a_resume_with_other_settings_is_refused_or_reset(tmp_path: Path, changed: dict[str, Any]) -> None:
    _train_with([PosteriorCallback(n_components=2, dtype="float64")], 2, tmp_path / "run")
    settings: dict[str, Any] = {"n_components": 2, "dtype": "float64", **changed}
    with pytest.raises(onlinefa.errors.PosteriorResumeError, match=next(iter(changed))):
        _train_with([PosteriorCallback(**settings)], 3, tmp_path / "run", resume=True)
    reset = PosteriorCallback(**settings, on_mismatch="reset")
    _train_with([reset], 3, tmp_path / "run", resume=True)
    assert reset.posterior.n_components == settings["n_components"] and reset.posterior.dtype == settings["dtype"]
    assert reset.posterior.n_seen == 1  # epoch 2 only


@pytest.mark.slow
def test_a_resume_without_the_posterior_is_refused_unless_asked_to_warn(tmp_path: Path) -> None:
    train([], 3, tmp_path / "plain", save=True)  # checkpoints written without the callback
    with pytest.raises(onlinefa.errors.PosteriorResumeError, match="checkpoint-9.*does not exist"):
        train([PosteriorCallback(n_components=2)], 5, tmp_path / "plain", resume=True)
    fresh = PosteriorCallback(n_components=2, on_missing="warn")
    with pytest.warns(UserWarning, match="the posterior starts empty"):
        train([fresh], 5, tmp_path / "plain", resume=True)
    assert fresh.posterior.n_seen == 2  # epochs 3 and 4 only


def test_bad_settings_are_refused_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="dtype"):
        PosteriorCallback(dtype="float16")
    with pytest.raises(ValueError, match="on_missing"):
        PosteriorCallback(on_missing="ignore")
    with pytest.raises(ValueError, match="on_mismatch"):
        PosteriorCallback(on_mismatch="keep")


@pytest.mark.parametrize("accumulation", [2, 3])
def test_gradient_accumulation_collects_each_optimiser_step_once(tmp_path: Path, accumulation: int) -> None:
    swag, recorder = PosteriorCallback(n_components=2, every_n_steps=1), Recorder()
    model = TinyRegressor()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=3, per_device_train_batch_size=8, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, save_strategy="no", report_to=[],
        logging_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, gradient_accumulation_steps=accumulation)
    trainer = InOrderTrainer(model=model, args=args, train_dataset=rows(), callbacks=[swag, recorder])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers|accelerate|torch")
        trainer.train()
    steps = [step for _, step, _, _ in recorder.after_step]
    assert steps == list(range(1, trainer.state.global_step + 1))  # 6 micro-batches an epoch, fewer steps
    assert trainer.state.global_step < 18 and swag.posterior.n_seen == trainer.state.global_step
    _assert_same_posterior(swag.posterior, reference([theta for _, _, theta, _ in recorder.after_step], 2))


# --- what a trainer user expects: a parameter filter, annealing, the SWA weights, logged metrics ----------


def test_annealing_a_parameter_filter_and_the_swa_weights(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, start_epoch=1, swa_lr=0.01, anneal_epochs=2, swa_weights=True,
                             parameters=lambda model: model.net[2].parameters())
    recorder = Recorder()
    model = train([swag, recorder], 4, tmp_path)
    lr_by_epoch = {int(np.ceil(epoch)) - 1: round(lr, 12) for epoch, _, _, lr in recorder.after_step}
    assert lr_by_epoch == {0: 0.05, 1: round(0.5 * 0.01 + 0.5 * 0.05, 12), 2: 0.01, 3: 0.01}
    assert swag.posterior.n_features == 9 and swag.posterior.n_seen == 3
    expected = reference([theta[-9:] for theta in recorder.after_epoch[1:]], 2)
    _assert_same_posterior(swag.posterior, expected)
    mean = torch.from_numpy(np.asarray(swag.posterior.mean, dtype=np.float32))
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(model.net[2].parameters()), mean, rtol=0, atol=0)
    first_layer_end = torch.from_numpy(recorder.after_epoch[-1][:40])
    torch.testing.assert_close(torch.nn.utils.parameters_to_vector(model.net[0].parameters()), first_layer_end,
                               rtol=0, atol=0)  # outside the posterior: the trained values


def test_the_snapshot_count_and_cost_are_in_the_log_history(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2, every_n_steps=1)
    model = TinyRegressor()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=BATCH, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", save_strategy="no", report_to=[], logging_strategy="steps",
        logging_steps=2, use_cpu=True, seed=0, disable_tqdm=True)
    trainer = InOrderTrainer(model=model, args=args, train_dataset=rows(), callbacks=[swag])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers|accelerate|torch")
        trainer.train()
    logged = [(entry["step"], entry["onlinefa/n_snapshots"]) for entry in trainer.state.log_history
              if "onlinefa/n_snapshots" in entry and "loss" in entry]
    assert logged == [(2, 2.0), (4, 4.0), (6, 6.0)]


def test_only_the_main_process_writes_the_posterior_files(tmp_path: Path) -> None:
    """Under DDP every rank calls on_step_end/on_save with the same posterior; one writer is enough (and
    several would race on the same files)."""
    swag = PosteriorCallback(n_components=2)
    train([swag], 1, tmp_path / "run")  # a posterior to save
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "ranks"), report_to=[], use_cpu=True)
    control = transformers.TrainerControl(should_save=True)
    for rank_zero, expected in ((False, []), (True, ["checkpoint-7"])):
        state = transformers.TrainerState(global_step=7, is_world_process_zero=rank_zero)
        swag.on_step_end(args, state, control)  # the pending posterior (the trainer writes checkpoint-7 next)
        swag.on_save(args, state, control)
        written = sorted(p.name for p in (tmp_path / "ranks").glob("checkpoint-*")) if (tmp_path / "ranks").exists() else []
        assert written == expected
    assert (tmp_path / "ranks" / "checkpoint-7" / POSTERIOR_FILE).is_file()
    assert not list((tmp_path / "ranks").glob(".onlinefa_posterior-step-*"))
