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


def test_a_resume_without_the_posterior_warns(tmp_path: Path) -> None:
    train([], 3, tmp_path / "plain", save=True)  # checkpoints written without the callback
    fresh = PosteriorCallback(n_components=2)
    with pytest.warns(UserWarning, match="the posterior starts empty"):
        train([fresh], 5, tmp_path / "plain", resume=True)
    assert fresh.posterior.n_seen == 2  # epochs 3 and 4 only


def test_bayesian_model_average_under_the_fitted_posterior(tmp_path: Path) -> None:
    swag = PosteriorCallback(n_components=2)
    model = train([swag], 5, tmp_path)
    batch = rows()[:BATCH]
    x = torch.stack([r["x"] for r in batch])
    draws = swag.bayesian_model_average(model, [x], n_samples=8, seed=0, task="regression")
    assert draws.shape == (8, BATCH, 1) and torch.isfinite(draws).all()
    assert torch.all(draws.std(dim=0) > 0)
