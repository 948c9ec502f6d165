"""The trainer callbacks' default posterior takes the network's dtype unless ``dtype`` is given."""

from __future__ import annotations

import pytest
import torch

import onlinefa
from onlinefa.errors import PosteriorResumeError
from onlinefa.torch._trainer_core import TrainerPosterior
from onlinefa.torch._trainer_store import SavedPosterior


def core(dtype: str | None = None, on_mismatch: str = "raise") -> TrainerPosterior:
    return TrainerPosterior(None, n_components=2, seed=0, dtype=dtype, every_n_steps=1, start_epoch=0, swa_lr=None,
                            asynchronous=False, on_mismatch=on_mismatch)


def network(dtype: torch.dtype) -> torch.nn.Module:
    return torch.nn.Linear(4, 3).to(dtype)


@pytest.mark.parametrize(("weights", "state"), [(torch.float32, "float32"), (torch.float64, "float64"),
                                                (torch.bfloat16, "float32"), (torch.float16, "float32")])
def test_the_default_state_follows_the_network(weights: torch.dtype, state: str) -> None:
    trainer = core()
    trainer.start(network(weights))
    assert getattr(trainer.posterior, "dtype") == state
    trainer.close()


def test_a_given_dtype_overrides_the_network() -> None:
    trainer = core("float32")
    trainer.start(network(torch.float64))
    assert getattr(trainer.posterior, "dtype") == "float32"
    trainer.close()


def saved(dtype: str) -> SavedPosterior:
    return SavedPosterior(onlinefa.OnlineEM(15, 2, seed=0, dtype=dtype), 0)


def test_a_resumed_posterior_of_another_dtype_than_the_network_is_a_mismatch() -> None:
    trainer = core()
    trainer.restore(saved("float32"), "the checkpoint")
    with pytest.raises(PosteriorResumeError, match="dtype='float32'.*ask for 'float64'"):
        trainer.start(network(torch.float64))
    reset = core(on_mismatch="reset")
    reset.restore(saved("float32"), "the checkpoint")
    reset.start(network(torch.float64))
    assert getattr(reset.posterior, "dtype") == "float64" and getattr(reset.posterior, "n_seen") == 0
    reset.close()


def test_a_resumed_posterior_of_the_network_dtype_is_kept() -> None:
    restored = saved("float64")
    trainer = core()
    trainer.restore(restored, "the checkpoint")
    trainer.start(network(torch.float64))
    assert trainer.posterior is restored.posterior
    trainer.close()
