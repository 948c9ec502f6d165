"""The fused Triton pass of onlinefa.OnlineSGA (device=), run by Triton's interpreter on the CPU, against the plain
torch pass and the Rust core.
"""

from __future__ import annotations

import textwrap

import pytest

from triton_runs import STREAMING_PREAMBLE, run_interpreted

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = STREAMING_PREAMBLE + textwrap.dedent("""
    from onlinefa.torch import _sga_engine
    from onlinefa.torch._online_sga import OnlineSGA

    count_calls(_sga_engine, "fused_pass")
    fused = OnlineSGA(d, k, seed=3, dtype=dtype, **config).update(torch.as_tensor(X))
    fused_calls = len(calls)
    if config.get("scaling") == "unit":  # a step far too large: the kernel's pass refuses it, changing nothing
        bad_state = OnlineSGA(d, k, seed=3, dtype=dtype, **config).update(torch.as_tensor(X[:12])).get_state()
        bad = OnlineSGA.from_state({**bad_state, "lr": 1e6})
        before = bad.get_state()
        try:
            bad.update(torch.as_tensor(X[12:16]))
            refused = False
        except onlinefa.NumericalBreakdownError:
            refused = True
        after = bad.get_state()
        unchanged = all(np.array_equal(np.asarray(before[key]), np.asarray(after[key])) for key in before)
    else:
        refused = unchanged = True
    _sga_engine.fused_available = lambda device, k: False
    plain = OnlineSGA(d, k, seed=3, dtype=dtype, **config).update(torch.as_tensor(X))
    rust = onlinefa.OnlineSGA(d, k, seed=3, dtype="float64", **config).update(X)
    print(json.dumps({"fused_calls": fused_calls, "n_warmup": fused.n_warmup, "refused": refused,
                      "unchanged": unchanged, "fused_vs_plain": rel(cov(fused), cov(plain)),
                      "fused_vs_rust": rel(cov(fused), cov(rust)), "plain_vs_rust": rel(cov(plain), cov(rust))}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {"dtype": "float64"},  # the default: the whitened steps
    {"dtype": "float64", "lr": 1e-3},  # the constant-step gradient rule, data-scaled
    {"dtype": "float64", "scaling": "unit", "lr": 1e-2, "schedule": "power"},
    {"dtype": "float32"},
])
@pytest.mark.slow
def test_the_fused_pass_equals_the_plain_pass_and_the_rust_core(config: dict[str, object]) -> None:
    result = run_interpreted(SCRIPT, config)
    # every sample with a pending gradient step after the start went through the kernel (the first
    # n_warmup + 1 samples are the warm-up and the start or first E-step)
    assert result["fused_calls"] == 40 - (result["n_warmup"] + 1)
    assert result["refused"] and result["unchanged"]
    if config["dtype"] == "float64":
        assert result["fused_vs_plain"] < 1e-12 and result["fused_vs_rust"] < 1e-10
    else:
        # float32 arithmetic in the kernel: as far from float64 as the plain float32 pass, within 10x
        assert result["fused_vs_rust"] < max(10 * result["plain_vs_rust"], 1e-5)
