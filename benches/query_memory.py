"""Peak extra memory of each query, as a multiple of the model's state (resident memory, Linux only).

Each measurement runs in a fresh process: build and fit the model, reset the kernel's peak-RSS counter
(``/proc/self/clear_refs``), run one query, and report (peak RSS − RSS before) / state bytes. The state is
what ``save`` writes (every D-sized array), so 1.0 means "as much memory again as the model itself".

The last two rows are the NumPy path the queries used before they streamed in the core (snapshot of
mean, F, ψ in float64, then NumPy arithmetic), for comparison.

Usage: ``python benches/query_memory.py [D] [K]`` (default D = 2,000,000, K = 10, float32 state).
"""

from __future__ import annotations

import json
import subprocess
import sys

from peak_rss import PRELUDE


CHILD = PRELUDE + r"""
import json, sys
import numpy as np
import onlinefa


model_name, query, d, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
if model_name == "VIFA":
    model = onlinefa.VIFA(d, k, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3,
                          seed=0, dtype="float32")
else:
    model = getattr(onlinefa, model_name)(d, k, seed=0, dtype="float32")
    model.update(rng.standard_normal((k + 4, d), dtype=np.float32))
state_bytes = sum(v.nbytes for v in model._core.get_state().values() if isinstance(v, np.ndarray))
x = rng.standard_normal((1, d))
calls = {
    "log_prob(1 row)": lambda: model.log_prob(x),
    "transform(1 row)": lambda: model.transform(x),
    "sample(1)": lambda: model.sample(1, seed=0),
    "sample(1, float32)": lambda: model.sample(1, seed=0, dtype=np.float32),
    "snapshot()": lambda: model.snapshot(),
    "previous log_prob": lambda: onlinefa._gaussian.log_prob(x, *model.snapshot()),
    "previous sample(1)": lambda: onlinefa._gaussian.draw(1, *model.snapshot(), 0),
}
reset_peak()
before = rss("VmRSS:")
result = calls[query]()
peak = rss("VmHWM:")
print(json.dumps({"extra": peak - before, "state": state_bytes}))
"""

QUERIES = [
    "log_prob(1 row)", "transform(1 row)", "sample(1)", "sample(1, float32)", "snapshot()",
    "previous log_prob", "previous sample(1)",
]


def measure(model: str, query: str, d: int, k: int) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, model, query, str(d), str(k)], check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, int] = json.loads(out)
    return result


def main() -> None:
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    print(f"D = {d:,}, K = {k}, float32 state; peak extra resident memory / state bytes (one query row)")
    print(f"{'query':<22}" + "".join(f"{name:>12}" for name in ("OnlineEM", "OnlineSGA", "VIFA")))
    for query in QUERIES:
        cells = []
        for model in ("OnlineEM", "OnlineSGA", "VIFA"):
            r = measure(model, query, d, k)
            cells.append(f"{r['extra'] / r['state']:>11.2f}x")
        print(f"{query:<22}" + "".join(cells))


if __name__ == "__main__":
    main()
