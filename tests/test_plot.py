"""Figures are returned (a notebook shows them inline), saved only when given a path, and show every point."""

from __future__ import annotations

import pytest

from dlperf.engine import predict
from dlperf.plan import Plan
from dlperf.plot import breakdown_chart, efficiency_limits, log_ticks, parity_chart, scaling_chart
from dlperf.search import Sweep, SweepPoint
from dlperf.spec.hardware import load_hardware
from dlperf.spec.model import load_model


@pytest.fixture(scope="module")
def prediction():
    return predict(load_model("resnet50"), load_hardware("dgx-a100"), Plan(devices=8, dp=8, global_batch=256))


def test_charts_return_a_figure_and_write_nothing_without_a_path(prediction, tmp_path, monkeypatch):
    import matplotlib
    from matplotlib.figure import Figure

    monkeypatch.chdir(tmp_path)
    backend = matplotlib.get_backend()
    fig = breakdown_chart([prediction], ["resnet50"])
    assert isinstance(fig, Figure) and fig.axes
    assert list(tmp_path.iterdir()) == []
    assert matplotlib.get_backend() == backend  # a notebook's inline backend is left alone


def test_efficiency_panel_shows_superlinear_points():
    bottom, top = efficiency_limits([1.0, 1.059, 0.97])
    assert top >= 105.9 + 5 and bottom == 90
    assert efficiency_limits([1.0, 0.95]) == (90, 101.0)
    assert efficiency_limits([1.0, 0.3])[0] == 0


def _fake_sweep(efficiencies: list[float]) -> Sweep:
    class _P:
        def __init__(self, thr: float) -> None:
            self.throughput_samples_per_s, self.step_time_s, self.fits = thr, 1.0, True

    points = [SweepPoint(n, 64, Plan(devices=n, dp=n, global_batch=64), _P(100.0 * n * e))
              for n, e in zip((1, 2, 4), efficiencies, strict=True)]
    return Sweep("m", "hw", "data", "strong", points)


def test_scaling_chart_does_not_clip_a_superlinear_point():
    fig = scaling_chart([_fake_sweep([1.0, 1.08, 1.2])])
    efficiency = fig.axes[1]
    assert max(efficiency.lines[0].get_ydata()) == pytest.approx(120.0)
    assert efficiency.get_ylim()[1] > 120.0


def test_log_ticks_are_few_and_inside_the_range():
    assert log_ticks(50, 2e5) == [100, 1000, 10000, 100000]
    ticks = log_ticks(110, 240)  # less than a decade: 1-2-5 gives one tick, so finer steps
    assert len(ticks) >= 2 and all(110 <= t <= 240 for t in ticks)


def test_parity_chart_grid_labels_and_no_empty_panel():
    from dlperf.validate import evaluate, load_dataset

    rows = load_dataset(None)
    chosen = [r for r in rows if r.unit in ("samples_per_s", "tflops_per_gpu", "speedup", "scaling_efficiency",
                                             "iteration_time_s")]
    fig = parity_chart(evaluate(chosen[::4], universe=rows))
    panels = list(fig.axes)
    units = {r.unit for r in chosen[::4]}
    assert len(panels) == len(units)  # the unused cell of the last row is removed, not left as an empty frame
    assert len({round(ax.get_position().x0, 2) for ax in panels}) <= 3  # at most 3 columns
    labels = {ax.get_xlabel() for ax in panels}
    assert "measured throughput (samples/s)" in labels
    assert not any("_" in label for label in labels)
    width, height = fig.get_size_inches()
    assert width / height < 2.5  # not one long row


def test_parity_plot_draws_measurements_not_simulated_rows():
    """A simulated figure is not a measurement: with measured rows chosen, the parity plot leaves simulated ones
    out (vTrain's one-node rows are iteration_time_s, the only unit they would add a panel for here)."""
    from dlperf.validate import evaluate, load_dataset, parity_plot

    rows = load_dataset(None)
    simulated = [r for r in rows if not r.is_measurement][:3]
    measured = [r for r in rows if r.is_measurement and r.unit == "samples_per_s"][:3]
    assert simulated and measured and {r.unit for r in simulated} == {"iteration_time_s"}
    fig = parity_plot(evaluate(simulated + measured, universe=rows))
    assert [ax.get_xlabel() for ax in fig.axes] == ["measured throughput (samples/s)"]
    alone = parity_plot(evaluate(simulated, universe=rows))  # nothing measured chosen: the simulated rows are drawn
    assert len(alone.axes) == 1 and alone.axes[0].get_xlabel() != "measured throughput (samples/s)"


def test_every_breakdown_part_is_drawn_and_listed_by_search():
    """The breakdown chart draws only the parts it has a colour for and search lists only BREAKDOWN_COLUMNS: every
    part a prediction can report (the CPU loader's wait and composer's metric sync included) is in both, so the
    bars add up to the step."""
    from dlperf.commands.search import BREAKDOWN_COLUMNS
    from dlperf.plot import BREAKDOWN_COLORS

    resnet = predict(load_model("resnet50"), load_hardware("dgx-a100"),
                     Plan(devices=8, global_batch=256, data_backend="cpu", loader_workers=4,
                          input_ops=("jpeg-decode-pillow", "rrc224-flip-pillow", "fast-collate")))
    mpt = predict(load_model("mpt"), load_hardware("dgx-a100"), Plan(devices=16, global_batch=32, micro_batch=2))
    parts = set(resnet.breakdown_s) | set(mpt.breakdown_s)
    assert {"input/cpu", "overhead/metric_sync"} <= parts
    assert parts <= set(BREAKDOWN_COLORS) and parts <= set(BREAKDOWN_COLUMNS)
    assert sum(mpt.breakdown_s.values()) == pytest.approx(mpt.step_time_s, rel=1e-9)
