"""Peak extra memory of loading and saving a checkpoint, as a multiple of the file (resident memory, Linux only).

A parent process builds and saves each model once; every measurement then runs in a fresh process:
import onlinefa, reset the kernel's peak-RSS counter (``/proc/self/clear_refs``), run one call, and
report (peak RSS − RSS before) / file bytes. The loaded model itself is ~1.0× the file, so 1.0 is the
floor; anything above it is transient copies made on the way in. ``from_state(dict)`` receives a dict of
NumPy arrays that stays alive, so its floor is 2.0× (the caller's arrays plus the model). ``save`` and
``get_state`` run on a model loaded before the counter is reset; their floor is 1.0× (the arrays handed to
Python), anything above it is a transient copy.

Usage: ``python benches/load_memory.py [D] [K] [directory]`` (default D = 2,000,000, K = 10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from peak_rss import PRELUDE

BUILD = r"""
import sys
import numpy as np
import onlinefa

cls, dtype, d, k, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(0)
if cls == "OnlineFactorAnalysis":
    model = onlinefa.OnlineFactorAnalysis(k, dtype=dtype, random_state=0)
    model.partial_fit(rng.standard_normal((k + 4, d)).astype(dtype))
else:
    model = getattr(onlinefa, cls)(d, k, seed=0, dtype=dtype)
    model.update(rng.standard_normal((k + 4, d)).astype(dtype))
model.save(path)
"""


CHILD = PRELUDE + r"""
import json, pickle, sys
import numpy as np
import onlinefa
from onlinefa.checkpoint import load_state


cls_name, call, path = sys.argv[1], sys.argv[2], sys.argv[3]
cls = getattr(onlinefa, cls_name)
state = load_state(path, cls_name) if call == "from_state(dict)" else None
model = cls.load(path) if call in ("save", "get_state") else None
reset_peak()
before = rss("VmRSS:")
if call == "load":
    result = cls.load(path)
elif call == "save":
    model.save(path + ".again")
elif call == "get_state":
    result = model._core.get_state() if hasattr(model, "_core") else model._checkpoint_state()
elif call == "load_state":
    result = load_state(path, cls_name)
else:
    result = cls.__new__(cls)
    result.__setstate__({"class": cls_name, "state": state})
print(json.dumps({"extra": rss("VmHWM:") - before}))
"""

CASES = [
    ("OnlineEM", "load"), ("OnlineSGA", "load"), ("OnlineFactorAnalysis", "load"),
    ("OnlineEM", "load_state"), ("OnlineEM", "from_state(dict)"),
    ("OnlineEM", "save"), ("OnlineSGA", "save"), ("OnlineFactorAnalysis", "save"), ("OnlineEM", "get_state"),
]


def measure(cls: str, call: str, path: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, cls, call, path], check=True, capture_output=True,
                         text=True).stdout
    extra: int = json.loads(out)["extra"]
    return extra / os.path.getsize(path)


def main() -> None:
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    directory = sys.argv[3] if len(sys.argv) > 3 else None
    print(f"D = {d:,}, K = {k}; peak extra resident memory / checkpoint file bytes (fresh process each)")
    print(f"{'call':<34}{'float32':>12}{'float64':>12}")
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        paths = {}
        for cls in ("OnlineEM", "OnlineSGA", "OnlineFactorAnalysis"):
            for dtype in ("float32", "float64"):
                paths[cls, dtype] = os.path.join(tmp, f"{cls}-{dtype}.npz")
                subprocess.run([sys.executable, "-c", BUILD, cls, dtype, str(d), str(k), paths[cls, dtype]],
                               check=True)
        for dtype in ("float32", "float64"):
            size = os.path.getsize(paths["OnlineEM", dtype])
            print(f"  (OnlineEM {dtype} file: {size / 2**20:.0f} MiB)")
        for cls, call in CASES:
            cells = [measure(cls, call, paths[cls, dtype]) for dtype in ("float32", "float64")]
            print(f"{cls + '.' + call:<34}" + "".join(f"{cell:>11.2f}x" for cell in cells))


if __name__ == "__main__":
    main()
