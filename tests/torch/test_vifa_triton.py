"""The fused Triton step of onlinefa.VIFA (device=), run by Triton's interpreter on the CPU, against the plain torch
step (the same draws: the noise comes from the model's seed and counters).
"""

from __future__ import annotations

import textwrap

import pytest

from triton_runs import run_interpreted

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch, onlinefa
    from onlinefa.torch import _vifa_engine
    from onlinefa.torch._vifa_model import VIFA

    config = json.loads(sys.argv[1])
    dtype = config.pop("dtype")
    d, k, steps = 150, 3, 12  # two row blocks, the second partial
    rng = np.random.default_rng(0)
    target = torch.as_tensor(rng.standard_normal(d))
    scale = torch.as_tensor(rng.uniform(0.5, 2.0, d))

    def train(model):
        for _ in range(steps):
            draws = torch.stack([model.sample() for _ in range(config.get("n_grad_samples", 1))])
            model.step(scale * (draws - target))  # the gradient of a quadratic negative log-likelihood
        return model

    def build(**extra):
        options = dict(prior_precision=0.5, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=4, dtype=dtype)
        return VIFA(d, k, **{**options, **config, **extra})

    calls = []
    original = _vifa_engine.fused_step
    def counted(*args):
        calls.append(1)
        return original(*args)
    _vifa_engine.fused_step = counted
    fused = train(build())
    fused_calls = len(calls)
    bad = build(lr_log_noise=1e6)  # a step far too large: refused by the kernel, nothing changes
    # the draws' counters move with the draws (which the refused step leaves pending); the rest must not move
    kept = lambda state: {key: np.asarray(v) for key, v in state.items() if key not in ("n_draws", "n_pending")}
    before = kept(bad.get_state())
    n_draws = config.get("n_grad_samples", 1)
    for _ in range(n_draws):
        bad.sample()
    try:
        bad.step(torch.full((n_draws, d), 1e6, dtype=torch.float64))
        refused = False
    except onlinefa.NumericalBreakdownError:
        refused = True
    bad._engine.pending = []  # the refused step's draws stay pending; dropped to read the state
    after = kept(bad.get_state())
    unchanged = all(np.array_equal(before[key], after[key]) for key in before)
    _vifa_engine.fused_available = lambda device, k: False
    plain = train(build())
    rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())
    out = {"fused_calls": fused_calls, "refused": refused, "unchanged": unchanged}
    for name in ("mean", "loadings", "log_noise"):
        out[name] = rel(np.asarray(fused.get_state()[name]), np.asarray(plain.get_state()[name]))
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {"dtype": "float64"},
    {"dtype": "float64", "optimizer": "adam", "clip_grad_norm": 5.0, "n_grad_samples": 2},
    {"dtype": "float32", "optimizer": "adam"},
])
@pytest.mark.slow
def test_the_fused_step_equals_the_plain_step(config: dict[str, object]) -> None:
    result = run_interpreted(SCRIPT, config)
    assert result["fused_calls"] == 12  # every step went through the kernel
    assert result["refused"] and result["unchanged"]
    bound = 1e-12 if config["dtype"] == "float64" else 1e-5  # float32: arithmetic in float32 over 12 steps
    for name in ("mean", "loadings", "log_noise"):
        assert result[name] < bound, (name, result)
