"""``bayesian_model_average`` takes what the trainers hand it: dict batches as keyword arguments (less the
labels), model outputs with ``logits``, a Lightning module's own ``predict_step``; and the Hugging Face callback's
BMA works on a tiny ``transformers`` model built in code with the Trainer's own dict batches (no download).

The reference each time: the same draws (same seed) assigned by hand, and the model called by hand."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa

torch = pytest.importorskip("torch")

from onlinefa.torch import ParameterVector, bayesian_model_average, sample_parameters  # noqa: E402


def _posterior_for(module: Any) -> Any:
    D = sum(p.numel() for p in module.parameters() if p.requires_grad)
    rng = np.random.default_rng(0)
    return onlinefa.OnlineEM(D, 2, n_warmup=3, seed=0).update(0.05 * rng.standard_normal((20, D)))


def _by_hand(module: Any, posterior: Any, predict: Any, n: int, seed: int) -> torch.Tensor:
    """(1/S) Σ_s softmax(predict(θ_s)) with the draws of ``sample_parameters`` assigned by hand."""
    vector = ParameterVector([p for p in module.parameters() if p.requires_grad])
    saved = vector.gather().clone()
    total = None
    with torch.no_grad():
        for chunk in sample_parameters(posterior, n, seed=seed):
            for theta in chunk:
                vector.assign(theta)
                module.eval()
                p = torch.softmax(predict(), dim=-1)
                total = p if total is None else total + p
        vector.assign(saved)
    assert total is not None
    return total / n


class DictModel(torch.nn.Module):
    """Keyword inputs, a dict output with logits (as a Hugging Face model returns)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(4, 2)

    def forward(self, x: Any, z: Any, labels: Any = None) -> dict[str, Any]:
        assert labels is None, "the labels must not be passed to the model"
        return {"logits": self.a(x) + self.b(z)}


def test_dict_batches_go_in_as_keyword_arguments_without_the_labels() -> None:
    model = DictModel()
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(5, 3, generator=g), "z": torch.randn(5, 4, generator=g),
                "labels": torch.zeros(5, dtype=torch.long)} for _ in range(2)]
    posterior = _posterior_for(model)
    got = bayesian_model_average(model, posterior, batches, n_samples=4, seed=3)
    expected = _by_hand(model, posterior, lambda: torch.cat(
        [model(x=b["x"], z=b["z"])["logits"] for b in batches]), 4, 3)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_lightning_modules_predict_step_is_used() -> None:
    pl = pytest.importorskip("lightning.pytorch")

    class Scaled(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(3, 2)

        def forward(self, x: Any) -> Any:
            return self.net(x)

        def predict_step(self, batch: Any, batch_idx: int = 0) -> Any:
            x, _ = batch
            return 3.0 * self(x) + batch_idx  # not what forward gives: the BMA must go through here

    module = Scaled()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, generator=g), torch.zeros(4)) for _ in range(2)]
    posterior = _posterior_for(module)
    got = bayesian_model_average(module, posterior, batches, n_samples=3, seed=5)
    expected = _by_hand(module, posterior, lambda: torch.cat(
        [3.0 * module(x) + i for i, (x, _) in enumerate(batches)]), 3, 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_an_output_without_logits_is_named() -> None:
    class Words(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            return ("not", "a tensor")

    module = Words()
    with pytest.raises(TypeError, match="neither a tensor nor an output with logits"):
        bayesian_model_average(module, _posterior_for(module), [torch.zeros(1, 2)], n_samples=1)


def test_the_hugging_face_callbacks_bma_on_a_tiny_bert_with_the_trainers_batches(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from onlinefa.torch.huggingface import PosteriorCallback

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(2)
    examples = [{"input_ids": torch.randint(1, 40, (8,), generator=g), "attention_mask": torch.ones(8, dtype=torch.long),
                 "labels": torch.tensor(i % 3)} for i in range(24)]
    swag = PosteriorCallback(n_components=2, every_n_steps=1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=8, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", save_strategy="no", report_to=[], logging_strategy="no",
        use_cpu=True, seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=examples, callbacks=[swag])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="transformers|accelerate|torch")
        trainer.train()
    assert swag.posterior.n_seen == 6
    test_loader = torch.utils.data.DataLoader(examples[:8], batch_size=4,
                                              collate_fn=transformers.default_data_collator)
    got = swag.bayesian_model_average(model, test_loader, n_samples=4, seed=0)
    assert got.shape == (8, 3)
    batches = list(test_loader)
    expected = _by_hand(model, swag.posterior, lambda: torch.cat(
        [model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits for b in batches]), 4, 0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
