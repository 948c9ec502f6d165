"""Per-update time of two builds of onlinefa, measured alternately in one run (did a change slow the engine?).

Each build is a folder holding an installed ``onlinefa`` (e.g. ``pip install --no-deps --target DIR wheel``).
The rounds run ``benches/engine.py --no-numpy`` once per build, alternating the order (A B, B A, A B, ...) so
that a drift of the machine's load falls on both; the table gives, per configuration, the median ms/update of
each build over the rounds and their ratio. Run by hand::

    python benches/before_after.py --builds /tmp/site-before /tmp/site-after --rounds 4 --d 1000000 --k 1 10 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parent / "engine.py"


def engine_times(build: Path, options: list[str]) -> dict[tuple[str, ...], float]:
    """ms/update by (model, D, K, state) of one run of engine.py with ``build`` first on the import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(build), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ENGINE), "--no-numpy", *options], env=env, check=True,
                         capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in {"EM", "SGA", "VIFA"}:
            times[tuple(cells[:4])] = float(cells[4])
    if not times:
        raise RuntimeError(f"engine.py printed no table with {build}:\n{out}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--builds", nargs=2, type=Path, required=True, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--d", nargs="+", default=["1000000"])
    parser.add_argument("--k", nargs="+", default=["1", "10", "50"])
    parser.add_argument("--models", nargs="+", default=["EM", "SGA", "VIFA"])
    parser.add_argument("--repeats", default="9")
    args = parser.parse_args()
    options = ["--d", *args.d, "--k", *args.k, "--models", *args.models, "--repeats", args.repeats]
    runs: dict[int, list[dict[tuple[str, ...], float]]] = {0: [], 1: []}
    for round_ in range(args.rounds):
        for side in (0, 1) if round_ % 2 == 0 else (1, 0):
            runs[side].append(engine_times(args.builds[side], options))
            print(f"round {round_ + 1}/{args.rounds}: {args.builds[side]} done", file=sys.stderr, flush=True)
    print(f"# before: {args.builds[0]}\n# after: {args.builds[1]}\n# {args.rounds} alternating rounds, medians\n")
    print("| model | D | K | state | before ms | after ms | after / before | spread of after / before |")
    print("|---|---|---|---|---|---|---|---|")
    for key in runs[0][0]:
        before = [r[key] for r in runs[0]]
        after = [r[key] for r in runs[1]]
        ratios = sorted(a / b for a, b in zip(after, before))
        print(f"| {' | '.join(key)} | {statistics.median(before):.2f} | {statistics.median(after):.2f} | "
              f"{statistics.median(after) / statistics.median(before):.2f} | {ratios[0]:.2f}–{ratios[-1]:.2f} |")


if __name__ == "__main__":
    main()
