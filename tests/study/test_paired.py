"""The study's paired differences (``impulsevit.study.paired``, the report's Δ columns, ``report.json``): the t
interval against a hand computation and scipy, pairing by seed (mismatched seeds and failed runs), the noise floor
(the same method twice gives an interval around 0, a shift of a few seed-noise widths is resolved while the unpaired
comparison is not), the reference choice, and ``--report-only`` rebuilding a report of finished runs without
training. Synthetic numbers only: nothing here trains."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from impulsevit import study
from impulsevit.errors import ConfigError
from impulsevit.study.paired import pair_by_seed, paired_difference, t_interval
from impulsevit.study.plan import reference_method
from impulsevit.study.report import RunResult, paired_differences, render_report, report_data

# Student's t with 2 degrees of freedom has a closed-form quantile, t_p = (2p - 1) / sqrt(2 p (1 - p)): for p = 0.975,
# 0.95 / sqrt(0.04875) = 4.3027 (printed tables: 4.303)
T_975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)


def test_t_interval_n3_by_hand_and_by_scipy() -> None:
    diffs = [1.0, 2.0, 4.0]
    # by hand: mean 7/3; squared deviations 16/9, 1/9, 25/9 sum to 42/9, over n - 1 = 2: variance 7/3
    mean, var = 7 / 3, 7 / 3
    half = T_975_DF2 * math.sqrt(var) / math.sqrt(3)
    got = t_interval(diffs)
    assert got == pytest.approx((mean, math.sqrt(var), mean - half, mean + half), rel=1e-12)
    assert got[2] == pytest.approx(-1.46125, abs=1e-5) and got[3] == pytest.approx(6.12792, abs=1e-5)
    # scipy's own paired t test gives the same interval
    ref = [70.0, 60.0, 65.0]
    ci = stats.ttest_rel([r + d for r, d in zip(ref, diffs)], ref).confidence_interval(0.95)
    assert (got[2], got[3]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # a z interval (1.96) or a population std would be narrower: the test tells them apart
    assert half > 2 * 1.96 * math.sqrt(var) / math.sqrt(3)


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_t_interval_matches_scipy_ttest_rel(n: int) -> None:
    import numpy as np

    rng = np.random.default_rng(n)
    a, b = rng.normal(70, 3, n), rng.normal(69, 3, n)
    for conf in (0.9, 0.95, 0.99):
        _, std, low, high = t_interval(list(a - b), conf)
        ci = stats.ttest_rel(a, b).confidence_interval(conf)
        assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-9)
        assert std == pytest.approx(float(np.std(a - b, ddof=1)), rel=1e-12)


def test_t_interval_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], 95)


def test_pairs_only_matching_seeds_with_finite_values() -> None:
    method = {0: 71.0, 1: 72.0, 3: 80.0, 4: float("nan")}
    reference = {0: 70.0, 1: 69.5, 2: 60.0, 4: 65.0}
    assert pair_by_seed(method, reference) == ((0, 1), (1.0, 2.5))  # 2 and 3 on one side only, 4 is nan
    d = paired_difference(method, reference)
    assert (d.n, d.seeds, d.diffs, d.mean) == (2, (0, 1), (1.0, 2.5), 1.75)
    # by position, the same numbers would pair 80.0 with 60.0: the seeds decide, not the order
    assert paired_difference({3: 80.0, 0: 71.0}, {2: 60.0, 0: 70.0}).diffs == (1.0,)
    one = paired_difference({0: 71.0, 1: 72.0}, {1: 70.0})
    assert (one.n, one.mean, one.std, one.low, one.excludes_zero) == (1, 2.0, None, None, None)
    none = paired_difference({0: 71.0}, {1: 70.0})
    assert (none.n, none.mean) == (0, None)


def _runs(values: dict[str, dict[int, float | None]], failed: set[str] = frozenset()) -> list[RunResult]:
    """RunResults with final = best = the given top-1 fractions; names in ``failed`` (or a None value) failed."""
    out = []
    for method, per_seed in values.items():
        for seed, v in per_seed.items():
            name = f"{method}-s{seed}"
            if v is None or name in failed:
                out.append(RunResult(name, method, seed, "failed", detail="exit code 1"))
            else:
                out.append(RunResult(name, method, seed, "done", final=v, best=v + 0.01, curve=[v - 0.1, v]))
    return out


def test_a_failed_run_drops_only_its_pair() -> None:
    results = _runs({"impulse": {0: 0.75, 1: 0.72, 2: 0.74}, "torch": {0: 0.60, 1: 0.58, 2: 0.61}},
                    failed={"torch-s1"})
    d = paired_differences(results, "torch")["impulse"]["final"]
    assert d.seeds == (0, 2) and d.diffs == pytest.approx((15.0, 13.0))
    md = render_report("s", {"recipe": "r", "seeds": 3}, results, {})
    row = next(line for line in md.splitlines() if line.startswith("| impulse | final val top-1 |"))
    assert "| 2 | +14.00 | 1.41 |" in row and "s0 +15.00, s2 +13.00" in row


def test_noise_floor_same_method_contains_zero_and_a_shift_is_resolved() -> None:
    """Per-seed top-1 = a large shared seed effect (what both methods see at a seed) + a small per-run noise. Two
    names for the same init: the interval contains 0. The same with +2 points: the paired interval excludes 0, while
    the unpaired comparison of the two means (Welch's t interval) cannot tell it from 0."""
    seed_effect = [70.0, 62.0, 76.0, 66.0, 73.0]
    noise_a, noise_b = [0.1, -0.2, 0.15, 0.0, -0.1], [-0.1, 0.2, -0.05, 0.1, 0.05]
    torch = {s: (e + n) / 100 for s, (e, n) in enumerate(zip(seed_effect, noise_a))}
    for n_seeds in (3, 5):
        same = {s: (e + n) / 100 for s, (e, n) in enumerate(zip(seed_effect[:n_seeds], noise_b))}
        shifted = {s: v + 0.02 for s, v in same.items()}
        dup = {s: torch[s] for s in range(n_seeds)}
        results = _runs({"torch": {s: torch[s] for s in range(n_seeds)}, "torch_again": same, "shifted": shifted,
                         "duplicate": dup})
        paired = paired_differences(results, "torch")
        again, moved, twin = paired["torch_again"]["final"], paired["shifted"]["final"], paired["duplicate"]["final"]
        assert again.n == n_seeds and again.low < 0 < again.high and again.excludes_zero is False
        assert (twin.mean, twin.std, twin.low, twin.high) == pytest.approx((0, 0, 0, 0), abs=1e-9)
        assert twin.excludes_zero is False
        assert moved.excludes_zero is True and moved.low > 0 and moved.mean == pytest.approx(2 + again.mean)
        unpaired = stats.ttest_ind([100 * v for v in shifted.values()], [100 * torch[s] for s in range(n_seeds)],
                                   equal_var=False).confidence_interval(0.95)
        assert unpaired.low < 0 < unpaired.high, "the seed effect should hide the shift from an unpaired comparison"


def test_reference_choice() -> None:
    assert reference_method(["impulse", "torch", "mimetic"]) == "torch"
    assert reference_method(["impulse", "box", "random"]) == "impulse"
    assert reference_method(["impulse", "torch"], header="impulse") == "impulse"
    assert reference_method(["impulse", "torch"], given="impulse", header="nope") == "impulse"
    with pytest.raises(ConfigError, match=r"--reference 'timm' is not a method of this study \(methods: impulse, "):
        reference_method(["impulse", "torch"], given="timm")
    with pytest.raises(ConfigError, match=r"r\.yaml: '# study:' reference 'timm'"):
        reference_method(["impulse", "torch"], header="timm", recipe="r.yaml")


def test_report_table_and_json_quote_the_paired_difference() -> None:
    results = _runs({"impulse": {0: 0.75, 1: 0.72, 2: 0.74}, "torch": {0: 0.60, 1: 0.58, 2: 0.61},
                     "mimetic": {0: 0.55}})
    md = render_report("s", {"recipe": "r", "seeds": 3}, results, {})
    header = next(line for line in md.splitlines() if line.startswith("| method | n |"))
    assert "Δ final val vs torch (paired)" in header and "Δ best val vs torch (paired)" in header
    diffs = [15.0, 14.0, 13.0]
    _, _, low, high = t_interval(diffs)
    row = next(line for line in md.splitlines() if line.startswith("| impulse | 3 |"))
    assert f"+14.00 [{low:+.2f}, {high:+.2f}], excludes 0" in row
    assert next(line for line in md.splitlines() if line.startswith("| torch | 3 |")).endswith(
        "| reference | reference |")
    assert "| mimetic | 1 |" in md and "-5.00, no interval (n=1)" in md

    data = json.loads(json.dumps(report_data("s", {"recipe": "r", "seeds": 3}, results, {})))
    assert data["reference"] == "torch" and data["methods"]["torch"]["paired"] is None
    p = data["methods"]["impulse"]["paired"]["final"]
    assert p["n"] == 3 and p["seeds"] == [0, 1, 2] and p["diffs"] == pytest.approx(diffs)
    assert (p["mean"], p["std"], p["ci_low"], p["ci_high"]) == pytest.approx((14.0, 1.0, low, high))
    assert p["excludes_zero"] is True and p["confidence"] == 0.95
    assert data["methods"]["impulse"]["paired"]["best"]["diffs"] == pytest.approx(diffs)  # best = final + 1 point
    assert data["methods"]["impulse"]["final"]["mean"] == pytest.approx(statistics.mean([75, 72, 74]))
    assert data["methods"]["mimetic"]["paired"]["final"]["ci_low"] is None
    # with impulse as the reference the signs flip
    flipped = paired_differences(results, "impulse")["torch"]["final"]
    assert flipped.mean == pytest.approx(-14.0) and flipped.high < 0


RECIPE = """\
# Tiny recipe for the report tests (never trained here)
# study: {methods: [impulse, torch, mimetic], reference: impulse}
seed_everything: 0
model:
  backbone: vit_tiny_patch16_224
"""


def _finished_study(sdir: Path, values: dict[str, dict[int, float]]) -> None:
    """A study folder whose runs are done, each with a val/acc1 curve ending at ``values[method][seed]`` (fraction)."""
    from torch.utils.tensorboard import SummaryWriter

    runs = [(m, s) for m, per_seed in values.items() for s in per_seed]
    plan = {"recipe": "tiny", "methods": list(values), "seeds": 3, "overrides": [],
            "runs": [{"method": m, "seed": s, "name": f"{m}-s{s}", "args": []} for m, s in runs]}
    sdir.mkdir(parents=True)
    (sdir / "study.json").write_text(json.dumps(plan))
    for m, s in runs:
        (sdir / f"{m}-s{s}").mkdir()
        (sdir / f"{m}-s{s}" / "status.json").write_text(json.dumps({"state": "done", "returncode": 0}))
        with SummaryWriter(str(sdir / f"{m}-s{s}")) as w:
            w.add_scalar("val/acc1", values[m][s] + 0.05, 1)  # best = epoch 1, final = epoch 2
            w.add_scalar("val/acc1", values[m][s], 2)


def test_report_only_rebuilds_from_finished_runs_with_the_chosen_reference(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(RECIPE)
    runs_dir = tmp_path / "runs"
    values = {"impulse": {0: 0.75, 1: 0.72, 2: 0.74}, "torch": {0: 0.60, 1: 0.58, 2: 0.61},
              "mimetic": {0: 0.55, 1: 0.50, 2: 0.56}}
    _finished_study(runs_dir / "tiny-study", values)
    # the recipe header's reference (impulse) unless --reference says otherwise
    assert study.main(["--recipe", str(recipe), "--runs-dir", str(runs_dir), "--report-only"]) == 0
    out = capsys.readouterr().out
    assert "Δ final val vs impulse (paired)" in out and "[study] torch − impulse (paired, 95 % CI, points)" in out
    assert study.main(["--recipe", str(recipe), "--runs-dir", str(runs_dir), "--report-only", "--reference", "torch",
                       "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads((runs_dir / "tiny-study" / "report.json").read_text())
    assert data["reference"] == "torch"
    got = data["methods"]["impulse"]["paired"]
    assert got["final"]["diffs"] == pytest.approx([15.0, 14.0, 13.0])
    assert got["best"]["diffs"] == pytest.approx([15.0, 14.0, 13.0])
    assert "Δ final val vs torch (paired)" in (runs_dir / "tiny-study" / "report.md").read_text()


def test_a_bad_reference_is_refused_before_any_work(tmp_path: Path) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(RECIPE)
    runs_dir = tmp_path / "runs"
    with pytest.raises(ConfigError, match="--reference 'timm' is not a method"):
        study.main(["--recipe", str(recipe), "--runs-dir", str(runs_dir), "--reference", "timm"])
    assert not (runs_dir / "tiny-study").exists()  # no plan written, no run started
    with pytest.raises(ConfigError, match=r"tiny\.yaml: '# study:' reference 'impulse' is not a method"):
        study.main(["--recipe", str(recipe), "--runs-dir", str(runs_dir), "--methods", "torch,mimetic"])
    assert not (runs_dir / "tiny-study").exists()
