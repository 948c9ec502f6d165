"""The fused Triton pass of onlinefa.OnlineEM (device=), run by Triton's interpreter on the CPU, against the plain
torch pass and the Rust core.
"""

from __future__ import annotations

import textwrap

import pytest

from triton_runs import STREAMING_PREAMBLE, run_interpreted

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = STREAMING_PREAMBLE + textwrap.dedent("""
    from onlinefa.torch import _em_engine
    from onlinefa.torch._online_em import OnlineEM

    fused = OnlineEM(d, k, seed=3, dtype=dtype, **config)
    count_calls(_em_engine, "fused_pass")
    fused.update(torch.as_tensor(X))
    _em_engine.fused_available = lambda device, k: False
    plain = OnlineEM(d, k, seed=3, dtype=dtype, **config).update(torch.as_tensor(X))
    rust = onlinefa.OnlineEM(d, k, seed=3, dtype="float64", **config).update(X)
    print(json.dumps({"fused_calls": len(calls), "n_warmup": fused.n_warmup,
                      "fused_vs_plain": rel(cov(fused), cov(plain)), "fused_vs_rust": rel(cov(fused), cov(rust)),
                      "plain_vs_rust": rel(cov(plain), cov(rust))}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    {"dtype": "float64"},
    {"dtype": "float64", "whiten": False, "schedule": "power"},
    {"dtype": "float32"},
])
@pytest.mark.slow
def test_the_fused_pass_equals_the_plain_pass_and_the_rust_core(config: dict[str, object]) -> None:
    result = run_interpreted(SCRIPT, config)
    # every sample whose E-step uses fitted loadings went through the kernel (the first n_warmup + 1 use F₀)
    assert result["fused_calls"] == 40 - (result["n_warmup"] + 1)
    if config["dtype"] == "float64":
        assert result["fused_vs_plain"] < 1e-12 and result["fused_vs_rust"] < 1e-10
    else:
        # float32 arithmetic in the kernel: as far from float64 as the plain float32 pass, within 10x
        assert result["fused_vs_rust"] < max(10 * result["plain_vs_rust"], 1e-5)
