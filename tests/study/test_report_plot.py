"""The study's accuracy figure (``report.png``): every validation a method's runs reached is drawn, each point the mean
over the runs that reached it; a run with fewer validations no longer cuts the method's curve short. Synthetic runs,
no training."""

from __future__ import annotations

import statistics
from unittest import mock

import pytest

from impulsevit.study.report import RunResult, accuracy_by_epoch, render_plot


def test_accuracy_curve_runs_to_the_longest_run() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.axes

    results = [RunResult("impulse-s0", "impulse", 0, "done", curve=[0.5, 0.6, 0.7, 0.8]),
               RunResult("impulse-s1", "impulse", 1, "done", curve=[0.4, 0.5, 0.6]),  # one validation fewer
               RunResult("impulse-s2", "impulse", 2, "failed", curve=[0.1, 0.1, 0.1, 0.1, 0.1]),
               RunResult("torch-s0", "torch", 0, "done", curve=[0.3, float("nan"), 0.5, 0.55])]
    assert accuracy_by_epoch([r.curve for r in results[:2]]) == {1: [0.5, 0.4], 2: [0.6, 0.5], 3: [0.7, 0.6],
                                                                 4: [0.8]}
    drawn: dict[str, tuple[list[float], list[float]]] = {}
    real_plot = matplotlib.axes.Axes.plot

    def spy(self, x, y, *args, **kwargs):  # noqa: ANN001, ANN202
        drawn[kwargs.get("label")] = (list(x), list(y))
        return real_plot(self, x, y, *args, **kwargs)

    with mock.patch.object(matplotlib.axes.Axes, "plot", spy):
        png = render_plot(results)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    x, y = drawn["impulse (n=2)"]  # the failed run is not drawn
    assert x == [1, 2, 3, 4]  # was cut to 3 points (the shortest run)
    assert y == pytest.approx([45, 55, 65, 80])  # the last point: seed 0 alone, its final value as in the table
    assert y[-1] == pytest.approx(100 * results[0].curve[-1])
    x, y = drawn["torch (n=1)"]
    assert x == [1, 3, 4] and y == pytest.approx([30, 50, 55])  # a nan validation is left out, not drawn as a gap
    assert statistics.mean([0.5, 0.4]) * 100 == pytest.approx(drawn["impulse (n=2)"][1][0])
