"""Tests of the ``uci-bnn`` experiment: published splits, the mixture log-likelihood, end-to-end runs."""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")
from scipy.stats import norm  # noqa: E402

from onlinefa_experiments import available  # noqa: E402
from onlinefa_experiments.uci_bnn._metrics import mixture_log_likelihood, rmse, tune_noise_variance  # noqa: E402
from onlinefa_experiments.uci_bnn._splits import published_splits, validation_split  # noqa: E402


@pytest.mark.parametrize(
    ("n_rows", "split", "part", "first_five"),
    [
        (768, 0, 0, [285, 101, 581, 352, 726]),  # energy, split 0, training rows
        (768, 19, 1, [484, 395, 446, 148, 764]),  # energy, split 19, test rows
        (308, 0, 0, [73, 304, 228, 238, 259]),  # yacht, split 0, training rows
        (308, 19, 1, [74, 54, 250, 21, 71]),  # yacht, split 19, test rows
    ],
)
def test_published_split_indices(n_rows: int, split: int, part: int, first_five: list[int]) -> None:
    # Values from the published index files of the benchmark (index_train_<i>.txt / index_test_<i>.txt).
    splits = published_splits(n_rows, 20)
    assert splits[split][part][:5].tolist() == first_five


def test_splits_sizes_and_global_state() -> None:
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    splits = published_splits(308, 20)
    assert np.random.rand() == expected_next  # NumPy's global generator is untouched
    for train, test in splits:
        assert train.size == int(round(308 * 0.9)) and test.size == 308 - train.size
        assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(308))
    assert np.array_equal(published_splits(308, 3)[2][0], splits[2][0])
    fit, val = validation_split(100, 0)
    assert fit.size == 80 and val.size == 20 and np.intersect1d(fit, val).size == 0


def test_mixture_log_likelihood_against_closed_form() -> None:
    draws = np.array([[0.1, -0.4, 1.2], [0.5, 0.0, 0.9], [-0.3, 0.2, 1.5]])  # standardised outputs (S=3, N=3)
    y = np.array([24.0, 18.5, 31.0])  # original units
    y_mean, y_std, noise = 22.0, 6.0, 0.2
    density = np.mean(norm.pdf(y[None, :], loc=y_mean + y_std * draws, scale=y_std * math.sqrt(noise)), axis=0)
    assert mixture_log_likelihood(draws, y, noise, y_mean, y_std) == pytest.approx(np.mean(np.log(density)),
                                                                                   rel=1e-12)
    # a point estimate (S = 1) is a single Gaussian
    single = norm.logpdf(y, loc=y_mean + y_std * draws[0], scale=y_std * math.sqrt(noise)).mean()
    assert mixture_log_likelihood(draws[:1], y, noise, y_mean, y_std) == pytest.approx(single, rel=1e-12)
    assert rmse(draws, y, y_mean, y_std) == pytest.approx(
        math.sqrt(np.mean((y_mean + y_std * draws.mean(axis=0) - y) ** 2)), rel=1e-12)


def test_tuned_noise_variance_matches_residual_variance() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(scale=0.3, size=20000)
    noise, score = tune_noise_variance(np.zeros((1, y.size)), y)
    # the maximum-likelihood σ² of a zero-mean Gaussian is mean(y²); the grid step is 3.6 %
    assert noise == pytest.approx(np.mean(y**2), rel=0.04)
    assert score == pytest.approx(norm.logpdf(y, scale=math.sqrt(noise)).mean(), rel=1e-10)


def _parse(argv: list[str]) -> argparse.Namespace:
    module = available()["uci-bnn"]
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_quick_end_to_end_on_packaged_set_and_resume(tmp_path: Path) -> None:
    module = available()["uci-bnn"]
    # SLANG (a separate baseline module with tests of its own) is left out to keep this test fast
    methods = "map,swa,swag_diag,swag,swag_fa,online_sga,vifa,vifa_eb,multiswag_fa,ensemble,mc_dropout"
    argv = ["--quick", "--datasets", "yacht", "--out", str(tmp_path), "--methods", methods]
    assert module.run(_parse(argv)) == 0
    rows = _rows(tmp_path / "uci_bnn.csv")
    assert list(rows[0]) == ["dataset", "split", "method", "test_ll", "rmse", "fit_seconds"]
    assert [r["method"] for r in rows] == methods.split(",") * 2
    assert [r["split"] for r in rows] == ["0"] * 11 + ["1"] * 11 and {r["dataset"] for r in rows} == {"yacht"}
    assert all(math.isfinite(float(r["test_ll"])) and float(r["rmse"]) > 0 for r in rows)
    markdown = (tmp_path / "uci_bnn.md").read_text()
    assert "MC dropout (grid)" in markdown and "-1.25 ± 0.01" in markdown
    # a rerun skips every row already present
    assert module.run(_parse(argv)) == 0
    assert len(_rows(tmp_path / "uci_bnn.csv")) == len(rows)


def test_data_dir_layout(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "toy-set" / "data"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=60)
    np.savetxt(folder / "data.txt", np.column_stack([X, y]))
    (folder / "index_features.txt").write_text("0\n1\n2\n")
    (folder / "index_target.txt").write_text("3\n")
    (folder / "n_splits.txt").write_text("3\n")
    (folder / "n_hidden.txt").write_text("8\n")
    (folder / "n_epochs.txt").write_text("4\n")
    out = tmp_path / "out"
    args = _parse(["--quick", "--data-dir", str(tmp_path / "data"), "--datasets", "toy-set", "--splits", "1",
                   "--methods", "map,swag_fa,mc_dropout", "--out", str(out)])
    assert available()["uci-bnn"].run(args) == 0
    rows = _rows(out / "uci_bnn.csv")
    assert [(r["dataset"], r["split"], r["method"]) for r in rows] == [
        ("toy-set", "0", "map"), ("toy-set", "0", "swag_fa"), ("toy-set", "0", "mc_dropout")]
    assert all(math.isfinite(float(r["test_ll"])) and float(r["rmse"]) > 0 for r in rows)


def test_first_split_runs_only_the_later_splits_and_refuses_negative(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "toy-set" / "data"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 2))
    np.savetxt(folder / "data.txt", np.column_stack([X, X @ np.array([1.0, -1.0]) + 0.1 * rng.normal(size=40)]))
    for name, text in [("index_features", "0\n1\n"), ("index_target", "2\n"), ("n_splits", "3\n"),
                       ("n_hidden", "4\n"), ("n_epochs", "2\n")]:
        (folder / f"{name}.txt").write_text(text)
    base = ["--quick", "--data-dir", str(tmp_path / "data"), "--datasets", "toy-set", "--splits", "3",
            "--methods", "map", "--out", str(tmp_path / "out")]
    assert available()["uci-bnn"].run(_parse(base + ["--first-split", "1"])) == 0
    assert [r["split"] for r in _rows(tmp_path / "out" / "uci_bnn.csv")] == ["1", "2"]
    from onlinefa.errors import CommandError

    with pytest.raises(CommandError, match="--first-split"):
        available()["uci-bnn"].run(_parse(base + ["--first-split", "-1"]))


def test_report_only_rewrites_markdown_from_rows(tmp_path: Path) -> None:
    (tmp_path / "uci_bnn.csv").write_text(
        "dataset,split,method,test_ll,rmse,fit_seconds\n"
        "boston,0,map,-2.5,3.0,1.0\nboston,1,map,-2.3,2.0,1.0\nboston,0,swag_fa,-2.4,2.9,2.0\n")
    assert available()["uci-bnn"].run(_parse(["--report-only", "--out", str(tmp_path)])) == 0
    markdown = (tmp_path / "uci_bnn.md").read_text()
    # mean ± s.e. over splits: -2.4 ± 0.1 (s.d. 0.1414 / √2); one split has no s.e.
    assert "| MAP | -2.40 ± 0.10 (2) |" in markdown and "| SWAG-FA (OnlineEM) | -2.40 ± n/a (1) |" in markdown
    assert "| *published:* MC dropout (grid) | -2.40 ± 0.04 |" in markdown


def test_small_rmse_columns_keep_two_significant_digits() -> None:
    from onlinefa_experiments.uci_bnn._report import summary_markdown

    rows = [{"dataset": "naval", "split": str(s), "method": "swag_fa", "test_ll": "6.3", "rmse": str(rmse),
             "fit_seconds": "1"} for s, rmse in enumerate((4.2e-4, 4.4e-4))]
    rows += [{"dataset": "boston", "split": "0", "method": "swag_fa", "test_ll": "-2.5", "rmse": "2.88",
              "fit_seconds": "1"}]
    text = summary_markdown(rows, [])
    rmse_table = text.split("## Test RMSE")[1].split("##")[0]
    # Naval's column in five decimals (two significant digits of 4.3e-4), Boston's in the usual two.
    assert "0.00043 ± 0.00001 (2)" in rmse_table and "2.88 ± n/a (1)" in rmse_table


def _write_run(folder: Path, entries: list[tuple[str, float, float]]) -> None:
    """A run folder with one row per (method, test_ll, validation_ll) on split 0 of Boston."""
    folder.mkdir()
    results = ["dataset,split,method,test_ll,rmse,fit_seconds"]
    choices = ["dataset,split,method,weight_decay,setting,noise_variance,validation_ll,tuning_seconds"]
    for method, test_ll, validation_ll in entries:
        results.append(f"boston,0,{method},{test_ll},3.0,1.0")
        choices.append(f"boston,0,{method},0.001,0.02,0.1,{validation_ll},2.0")
    (folder / "uci_bnn.csv").write_text("\n".join(results) + "\n")
    (folder / "uci_bnn_choices.csv").write_text("\n".join(choices) + "\n")


def test_select_from_keeps_the_best_validated_run_never_the_best_tested(tmp_path: Path) -> None:
    # map: run b validates better but tests worse; swag_fa: run a validates better and tests worse;
    # ensemble exists in run a only (not in every run: left out); mc_dropout ties (the earlier run, a).
    _write_run(tmp_path / "a", [("map", -2.0, -0.5), ("swag_fa", -2.9, -0.1), ("ensemble", -2.2, -0.2),
                                ("mc_dropout", -2.6, -0.3)])
    _write_run(tmp_path / "b", [("map", -2.8, -0.4), ("swag_fa", -2.1, -0.2), ("mc_dropout", -2.5, -0.3)])
    out = tmp_path / "selected"
    argv = ["--select-from", f"{tmp_path / 'a'},{tmp_path / 'b'}", "--out", str(out)]
    assert available()["uci-bnn"].run(_parse(argv)) == 0
    rows = _rows(out / "uci_bnn.csv")
    assert [(r["method"], float(r["test_ll"])) for r in rows] == [("map", -2.8), ("swag_fa", -2.9),
                                                                   ("mc_dropout", -2.6)]
    assert [r["validation_ll"] for r in _rows(out / "uci_bnn_choices.csv")] == ["-0.4", "-0.1", "-0.3"]
    assert [r["run"] for r in _rows(out / "uci_bnn_selected.csv")] == ["b", "a", "a"]
    assert "a (2 rows), b (1 rows)" in (out / "uci_bnn.md").read_text()
    # rerunning into the same selection folder rewrites it (no duplicated rows)
    assert available()["uci-bnn"].run(_parse(argv)) == 0
    assert len(_rows(out / "uci_bnn.csv")) == 3


def test_select_from_refuses_to_overwrite_a_run_or_read_a_folder_without_choices(tmp_path: Path) -> None:
    from onlinefa.errors import CommandError

    _write_run(tmp_path / "a", [("map", -2.0, -0.5)])
    _write_run(tmp_path / "b", [("map", -2.8, -0.4)])
    before = (tmp_path / "b" / "uci_bnn.csv").read_text()
    module = available()["uci-bnn"]
    both = f"{tmp_path / 'a'},{tmp_path / 'b'}"
    with pytest.raises(CommandError, match="must not be one of"):
        module.run(_parse(["--select-from", both, "--out", str(tmp_path / "b")]))
    _write_run(tmp_path / "d", [("map", -2.5, -0.1)])  # another run's folder: not overwritten either
    with pytest.raises(CommandError, match="rows of a run"):
        module.run(_parse(["--select-from", both, "--out", str(tmp_path / "d")]))
    assert (tmp_path / "d" / "uci_bnn.csv").read_text().endswith("boston,0,map,-2.5,3.0,1.0\n")
    assert (tmp_path / "b" / "uci_bnn.csv").read_text() == before
    (tmp_path / "c").mkdir()
    with pytest.raises(CommandError, match="no uci_bnn.csv"):
        module.run(_parse(["--select-from", f"{tmp_path / 'a'},{tmp_path / 'c'}", "--out", str(tmp_path / "s")]))
    (tmp_path / "e").mkdir()  # a result row whose choice row is missing
    (tmp_path / "e" / "uci_bnn.csv").write_text((tmp_path / "a" / "uci_bnn.csv").read_text())
    (tmp_path / "e" / "uci_bnn_choices.csv").write_text((tmp_path / "a" / "uci_bnn_choices.csv").read_text()
                                                        .splitlines()[0] + "\n")
    with pytest.raises(CommandError, match="without a validation choice"):
        module.run(_parse(["--select-from", f"{tmp_path / 'a'},{tmp_path / 'e'}", "--out", str(tmp_path / "s")]))
    (tmp_path / "other").mkdir()
    _write_run(tmp_path / "other" / "a", [("map", -2.1, -0.2)])  # same name as run a: the provenance would be ambiguous
    with pytest.raises(CommandError, match="must differ"):
        module.run(_parse(["--select-from", f"{tmp_path / 'a'},{tmp_path / 'other' / 'a'}", "--out",
                           str(tmp_path / "s")]))
    with pytest.raises(CommandError, match="at least two"):
        module.run(_parse(["--select-from", str(tmp_path / "a"), "--out", str(tmp_path / "s")]))
