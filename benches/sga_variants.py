"""Which online-SGA step is right by default? A NumPy transcription of the candidates, measured three ways.

Online SGA (Brownlie 2021, Algorithm 1) fits F and ψ of N(c, F Fᵀ + Ψ) by one gradient step per sample from
the latent posterior of that sample, m = Σ Fᵀ Ψ⁻¹ d and P = Σ + m mᵀ with Σ = (I + Fᵀ Ψ⁻¹ F)⁻¹ (4.23):

    F ← F + a (d mᵀ − F P)                 (4.24), preconditioned by ψ, as the library's default
    log-ψ step:   β ← β + clip(g a ∇β, ±1),   ∇β = ½ ψ⁻¹ q − ½,  q = d² − 2 d (F m) + diag(F P Fᵀ)  (4.26)
    natural step: ψ ← ψ + a (q − ψ)        (the log-ψ gradient preconditioned by its Fisher information, ½)
    whitening:    F ← F L,  L Lᵀ = I + a (P − I)   (parameter expansion: the step's implied latent covariance
                                                  moved into F, as online EM's whitening does)

with step a = ``lr`` (constant: ``OnlineSGA(lr=1e-3)``, the library's earlier default) or a = 1/(t + t₀) after the
warm-up (t₀ = K + 2 makes it 1/n_seen, the running mean's own weight). Every variant starts as the library does
(``scaling="data"``: K + 2 warm-up samples, F₀ σ̂, ψ₀ = d̄²; the first two rows check the transcription against
``onlinefa.OnlineSGA(lr=1e-3)``, the last but one row is the library's default, ``lr="auto"``, the last
variant; the library's orthonormal start is drawn by its own generator, so they differ by the start only).

Three measurements, each against the default ``onlinefa.OnlineEM``:

1. the synthetic stream of ``onlinefa demo`` (D = 1000, K = 10, spectrum [1, 100], seed 0): relative
   covariance error ||Ŝ − S||_F / ||S||_F at T = 100 … 20,000 (it should fall with T);
2. real SGD iterates (the demo's tanh MLP on UCI energy and concrete, 200 snapshots, seeds 0 and 1, K = 10):
   the width ratio (mean over weights of the marginal variance over the iterates' empirical variance; 1 is
   right) and the test NLL of Bayesian model averaging over 30 draws, beside SWA and SWAG-diagonal;
3. a heavy-tailed stream: scikit-learn's digits, standardised (the 61 pixels that vary), 10,000 rows drawn
   with replacement, K = 5; covariance error against scikit-learn's ``FactorAnalysis`` of the 1,797 images.

4. the cost of one update of the library's default step against the constant step (D = 10⁶, K = 10 and 20).

Run: ``python benches/sga_variants.py`` (a few minutes on two cores; needs scikit-learn).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

import onlinefa
from onlinefa import _demo_mlp as mlp
from onlinefa.datasets import make_fa_model, sample_fa
from onlinefa.metrics import relative_covariance_distance

FloatArray = np.ndarray
SYNTHETIC_T = (100, 300, 1_000, 5_000, 20_000)


@dataclass(frozen=True)
class Variant:
    """One SGA configuration: the step a (``lr`` constant, or 1/(t + t0) when ``t0`` is set), the ψ step."""

    lr: float = 1e-3
    t0: float | None = None
    psi_step: str = "log"
    log_gain: float = 1.0
    whiten: bool = False
    safeguard: bool = False


class SgaTranscription:
    """Online SGA under ``scaling="data"`` in NumPy, one sample at a time (the shapes are the thesis's)."""

    def __init__(self, d: int, k: int, variant: Variant, seed: int, noise_floor: float = 1e-10) -> None:
        self.k, self.v, self.floor = k, variant, noise_floor
        # The library's start: orthonormal F₀ drawn with the seed (F₀ = Q of a Gaussian matrix).
        self.f0 = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, k)))[0]
        self.n, self.n_warmup = 0, k + 2
        self.mean, self.dsq = np.zeros(d), np.zeros(d)
        self.f: FloatArray = np.zeros((d, k))
        self.psi: FloatArray = np.ones(d)
        self.sigma2 = 1.0

    def update(self, rows: FloatArray) -> None:
        for x in rows:
            self._one(x)

    def _one(self, x: FloatArray) -> None:
        self.n += 1
        self.mean += (x - self.mean) / self.n
        d = x - self.mean
        if self.n <= self.n_warmup:
            self.dsq += d * d
            if self.n == self.n_warmup:
                psi0 = self.dsq / self.n
                self.sigma2 = float(psi0.mean())
                self.f = self.f0 * np.sqrt(self.sigma2)
                self.psi = np.maximum(psi0, self.floor * self.sigma2)
            return
        self._step(d, self._step_size(self.n - self.n_warmup))

    def _step_size(self, t: int) -> float:
        v = self.v
        return v.lr if v.t0 is None else 1.0 / (t + v.t0)

    def _step(self, d: FloatArray, a: float) -> None:
        f, psi, k = self.f, self.psi, self.k
        scaled = f / psi[:, None]
        sigma = np.linalg.inv(np.eye(k) + f.T @ scaled)                 # (4.23)
        m = sigma @ (scaled.T @ d)
        p = sigma + np.outer(m, m)
        fp = f @ p
        q = d * d - 2.0 * d * (f @ m) + np.einsum("ij,ij->i", fp, f)
        # The F step stays a contraction: a·λ_max(P) ≤ 1, with λ_max(P) ≤ 1 + m·m (Σ ⪯ I).
        a_f = min(a, 1.0 / (1.0 + m @ m)) if self.v.safeguard else a
        f_new = f + a_f * (np.outer(d, m) - fp)                         # (4.24), preconditioned by ψ
        if self.v.psi_step == "natural":
            psi_new = psi + a * (q - psi)
        else:
            psi_new = psi * np.exp(np.clip(self.v.log_gain * a * (0.5 * q / psi - 0.5), -1.0, 1.0))
        if self.v.whiten:
            f_new = f_new @ np.linalg.cholesky(np.eye(k) + a_f * (p - np.eye(k)))
        self.f, self.psi = f_new, np.maximum(psi_new, self.floor * self.sigma2)

    def loadings_and_noise(self) -> tuple[FloatArray, FloatArray]:
        return self.f, self.psi


Model = SgaTranscription | onlinefa.OnlineSGA | onlinefa.OnlineEM


def variants(k: int) -> dict[str, Variant | str]:
    """The rows of every table: the library's classes by name, the transcribed candidates by configuration."""
    return {
        "OnlineSGA, lr = 1e-3": "sga-constant",
        "transcription of it": Variant(),
        "a = 1/(t+100), log step x2": Variant(t0=100.0, log_gain=2.0),
        "a = 1/n, natural psi": Variant(t0=float(k + 2), psi_step="natural"),
        "a = 1/n, natural psi, whiten": Variant(t0=float(k + 2), psi_step="natural", whiten=True),
        "a = 1/n, natural psi, whiten, safeguard": Variant(t0=float(k + 2), psi_step="natural", whiten=True,
                                                           safeguard=True),
        "OnlineSGA default (lr = 'auto')": "sga",
        "OnlineEM default": "em",
    }


def build(spec: Variant | str, d: int, k: int, seed: int) -> Model:
    if spec == "sga":
        return onlinefa.OnlineSGA(d, k, seed=seed)
    if spec == "sga-constant":
        return onlinefa.OnlineSGA(d, k, seed=seed, lr=1e-3)
    if spec == "em":
        return onlinefa.OnlineEM(d, k, seed=seed)
    assert isinstance(spec, Variant)
    return SgaTranscription(d, k, spec, seed)


def loadings_and_noise(model: Model) -> tuple[FloatArray, FloatArray]:
    if isinstance(model, SgaTranscription):
        return model.loadings_and_noise()
    _, f, psi = model.snapshot()
    return np.asarray(f), np.asarray(psi)


def covariance(model: Model) -> FloatArray:
    f, psi = loadings_and_noise(model)
    cov: FloatArray = f @ f.T + np.diag(psi)
    return cov


def synthetic_table(seed: int) -> None:
    d, k = 1000, 10
    c, f, psi = make_fa_model(d, k, spectrum=(1.0, 100.0), seed=seed)
    truth = f @ f.T + np.diag(psi)
    samples = sample_fa(c, f, psi, SYNTHETIC_T[-1], seed=seed + 1)
    print(f"\n1. Synthetic stream (D={d}, K={k}, spectrum [1, 100], seed {seed}): relative covariance error")
    print("| variant | " + " | ".join(f"T={t:,}" for t in SYNTHETIC_T) + " |")
    print("|---|" + "---:|" * len(SYNTHETIC_T))
    for name, spec in variants(k).items():
        model, done, errors = build(spec, d, k, seed), 0, []
        for t in SYNTHETIC_T:
            model.update(samples[done:t])
            done = t
            errors.append(relative_covariance_distance(covariance(model), truth))
        print(f"| {name} | " + " | ".join(f"{e:.4f}" for e in errors) + " |", flush=True)


def real_table(datasets: list[str], seeds: list[int], k: int) -> None:
    print(f"\n2. Real SGD iterates (tanh MLP, 200 snapshots, K={k}): BMA test NLL (width ratio)")
    header = [f"{ds} s{s}" for ds in datasets for s in seeds]
    print("| variant | " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(header))
    cells: dict[str, list[str]] = {"SWA": [], "SWAG-diagonal": [], **{name: [] for name in variants(k)}}
    for ds in datasets:
        for seed in seeds:
            split = mlp.load_split(ds, seed)
            it = mlp.sgd_iterates(split, n_hidden=50, pretrain_epochs=500, n_snapshots=200, learning_rate=0.05,
                                  batch_size=32, seed=seed)
            d, run, swa = it.shape[1], mlp.RealRun(split, 50, it), it.mean(axis=0)
            noise_var = float(np.mean((mlp.mlp_predict(swa, split.x_train, 50) - split.y_train) ** 2))
            rng = np.random.default_rng(seed + 2)
            z, h = rng.standard_normal((30, d)), rng.standard_normal((30, k))

            def cell(f: FloatArray, psi: FloatArray) -> str:
                nll = mlp.bma_scores(swa + h @ f.T + np.sqrt(psi) * z, run, noise_var)[0]
                return f"{nll:.4f} ({mlp.width_ratio(np.sum(f**2, axis=1) + psi, it):.2f})"

            cells["SWA"].append(f"{mlp.bma_scores(swa[None, :], run, noise_var)[0]:.4f}")
            cells["SWAG-diagonal"].append(cell(np.zeros((d, k)), it.var(axis=0)))
            for name, spec in variants(k).items():
                model = build(spec, d, k, seed)
                model.update(it)
                cells[name].append(cell(*loadings_and_noise(model)))
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


def digits_table(seed: int) -> None:
    from sklearn.datasets import load_digits
    from sklearn.decomposition import FactorAnalysis

    x = load_digits().data
    x = x[:, x.std(axis=0) > 0]
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    k = 5
    reference = FactorAnalysis(n_components=k, random_state=0).fit(x).get_covariance()
    stream = x[np.random.default_rng(seed).integers(0, x.shape[0], 10_000)]
    print(f"\n3. Heavy-tailed stream (standardised digits, D={x.shape[1]}, K={k}, 10,000 rows): covariance error "
          "against scikit-learn's FactorAnalysis")
    print("| variant | error |")
    print("|---|---:|")
    for name, spec in variants(k).items():
        model = build(spec, x.shape[1], k, seed)
        model.update(stream)
        print(f"| {name} | {relative_covariance_distance(covariance(model), reference):.4g} |", flush=True)


def speed_table(d: int, repeats: int) -> None:
    """Median seconds of one update of the library's two rules (whitened default, constant lr), one run."""
    import time

    x = np.random.default_rng(0).standard_normal((repeats + 25, d))
    print(f"\n4. Cost of the default step (D={d:,}, median of {repeats} updates, one row each)")
    print("| K | state | lr='auto' ms | lr=1e-3 ms | ratio |")
    print("|---:|---|---:|---:|---:|")
    for k in (10, 20):
        for dtype in ("float64", "float32"):
            rows = x.astype(dtype)
            medians = []
            for lr in ("auto", 1e-3):
                model = onlinefa.OnlineSGA(d, k, seed=0, dtype=dtype, lr=lr).update(rows[:k + 3])
                times = []
                for row in rows[k + 3:k + 3 + repeats]:
                    start = time.perf_counter()
                    model.update(row)
                    times.append(time.perf_counter() - start)
                medians.append(float(np.median(times)) * 1e3)
            print(f"| {k} | {dtype} | {medians[0]:.1f} | {medians[1]:.1f} | {medians[0] / medians[1]:.2f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("synthetic", "real", "digits", "speed"))
    parser.add_argument("--d", type=int, default=1_000_000, help="D of the speed table")
    parser.add_argument("--repeats", type=int, default=15, help="updates timed per cell of the speed table")
    args = parser.parse_args()
    if args.only in (None, "synthetic"):
        synthetic_table(args.seed)
    if args.only in (None, "real"):
        real_table(["energy", "concrete"], [0, 1], 10)
    if args.only in (None, "digits"):
        digits_table(args.seed)
    if args.only in (None, "speed"):
        speed_table(args.d, args.repeats)


if __name__ == "__main__":
    main()
