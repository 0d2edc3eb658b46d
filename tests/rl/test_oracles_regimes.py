"""The regime map's bookkeeping and its figure (fluidopt/rl/regimes.py), by hand.

``regime_map``'s evaluation is replaced by a stand-in that returns a scripted summary per cell, so the
grid order, the rows, the progress lines (cell i of n, round robin's latency and preemptions, the router
with the *largest* gain) and the refusals are checked without running a simulation. ``regime_figure``
is drawn from a hand-made table and read back from its artists: one heatmap per router in the table's
order, each cell's value and annotation, the colour of the text (white where |gain| > 0.6 x the largest
|gain|), the axes' labels, the colour bar and the figure's size."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

import fluidopt.rl.evaluate as ev
from fluidopt.core.errors import ScenarioError
from fluidopt.rl.regimes import regime_figure, regime_map, scenario_at
from fluidopt.scenario import scenario_from_dict


def two_instances():
    return scenario_from_dict({
        "name": "kv-1000",
        "gpu": {"alpha": 0.01, "beta": 1e-4, "tau_solo": 0.02, "chunk": 64, "batch": 8, "kv_capacity": 1000.0},
        "cluster": {"gpus": 2},
        "classes": [{"name": "a", "prompt": 100, "decode": 400, "rate": 1.0},
                    {"name": "b", "prompt": 50, "decode": 100, "rate": 3.0}],
    })


def summary(policies, cell):
    """A scripted summary: round robin at e2e 2 + cell s, router j at gain 10 (j - 1) + cell %."""
    rows = []
    for j, p in enumerate(policies):
        gain = 0.0 if p == "round-robin" else 10.0 * (j - 1) + cell
        rows.append({"policy": p, "episodes": 3, "e2e_mean": 2.0 + cell, "e2e_mean_ci": 0.1,
                     "improvement_pct": gain, "improvement_ci": 1.5, "preemptions": 7.0 + cell,
                     "ttft_mean": 0.25, "completed_share": 0.99})
    return pd.DataFrame(rows)


@pytest.fixture
def scripted(monkeypatch):
    calls = []

    def evaluate(sc, pols, **kw):
        calls.append((sum(c.rate for c in sc.classes), sc.gpu.kv_capacity, list(pols), kw))
        return len(calls) - 1  # the cell's index, handed to summarize

    monkeypatch.setattr(ev, "evaluate", evaluate)
    monkeypatch.setattr(ev, "summarize", lambda cell: summary(calls[cell][2], cell))
    return calls


def test_grid_rows_and_progress_by_hand(scripted):
    lines = []
    t = regime_map(two_instances(), ["jsq", "least-requests"], [2.0, 4.0], [500.0, 900.0], episodes=3,
                   n_requests=40, seed=7, progress=lines.append)
    # cells: KV capacity outer, rate inner; round robin added first
    assert [(lam, kv) for lam, kv, _, _ in scripted] == [(2.0, 500.0), (4.0, 500.0), (2.0, 900.0), (4.0, 900.0)]
    assert all(p == ["round-robin", "jsq", "least-requests"] for _, _, p, _ in scripted)
    assert scripted[0][3] == {"episodes": 3, "n_requests": 40, "seed": 7, "accuracy": 0.79, "options": {}}
    assert list(t.columns) == ["rate", "kv_capacity", "policy", "episodes", "e2e_mean", "e2e_mean_ci",
                               "improvement_pct", "improvement_ci", "preemptions", "ttft_mean", "completed_share"]
    assert len(t) == 12
    row = t.iloc[5]  # cell 1 (rate 4, KV 500), least-requests: gain 10 + 1
    assert (row.rate, row.kv_capacity, row.policy, row.improvement_pct, row.preemptions) == (4.0, 500.0,
                                                                                              "least-requests", 11.0, 8.0)
    assert (row.episodes, row.e2e_mean, row.e2e_mean_ci, row.improvement_ci, row.ttft_mean, row.completed_share) == (
        3, 3.0, 0.1, 1.5, 0.25, 0.99)
    # the best router is the one with the largest gain (least-requests: 10 + cell > jsq: cell)
    assert lines == [
        "cell 1/4: rate 2/s, KV 500: round robin 2.00 s, 7 preemptions; best least-requests +10.0%",
        "cell 2/4: rate 4/s, KV 500: round robin 3.00 s, 8 preemptions; best least-requests +11.0%",
        "cell 3/4: rate 2/s, KV 900: round robin 4.00 s, 9 preemptions; best least-requests +12.0%",
        "cell 4/4: rate 4/s, KV 900: round robin 5.00 s, 10 preemptions; best least-requests +13.0%",
    ]


def test_round_robin_alone_has_no_best_router(scripted):
    lines = []
    t = regime_map(two_instances(), ["round-robin"], [2.0], [500.0], progress=lines.append)
    assert list(t.policy) == ["round-robin"]
    assert lines == ["cell 1/1: rate 2/s, KV 500: round robin 2.00 s, 7 preemptions"]


def test_refusals_name_the_field():
    sc = two_instances()
    with pytest.raises(ScenarioError) as e:
        regime_map(sc, [], [2.0], [500.0])
    assert str(e.value) == "regimes: routers: expected at least one"
    with pytest.raises(ScenarioError) as e:
        regime_map(sc, ["jsq"], [2.0], [500.0, 500])
    assert str(e.value) == "regimes: kv capacities: a value is repeated in [500.0, 500]"
    with pytest.raises(ScenarioError) as e:
        regime_map(sc, ["jsq"], [2.0], [])
    assert str(e.value) == "regimes: kv capacities: expected at least one value"


def table():
    """Two routers (and round robin) on 3 rates x 2 KV capacities; gains chosen so that the largest |gain|
    is 20 (lim) and the text is white only where |gain| > 12."""
    rows = []
    gains = {"jsq": {(100.0, 1.0): 5.0, (100.0, 2.0): -13.0, (100.0, 4.0): 12.0,
                     (200.0, 1.0): 0.5, (200.0, 2.0): 20.0, (200.0, 4.0): -1.0},
             "min-min": {(100.0, 1.0): -20.0, (100.0, 2.0): 3.0, (100.0, 4.0): 0.0,
                         (200.0, 1.0): 12.5, (200.0, 2.0): -4.0, (200.0, 4.0): 8.0}}
    for kv in (200.0, 100.0):  # unsorted on purpose: the figure sorts rows and columns
        for lam in (4.0, 1.0, 2.0):
            rows.append({"rate": lam, "kv_capacity": kv, "policy": "round-robin", "improvement_pct": 0.0,
                         "improvement_ci": 0.0, "preemptions": 0.0})
            for p, g in gains.items():
                rows.append({"rate": lam, "kv_capacity": kv, "policy": p, "improvement_pct": g[(kv, lam)],
                             "improvement_ci": 0.25, "preemptions": 3.0 + lam})
    return pd.DataFrame(rows), gains


def test_figure_one_heatmap_per_router_read_back():
    t, gains = table()
    fig = regime_figure(t, title="map")
    axes = [a for a in fig.axes if a.get_visible() and a.images]
    assert [a.get_title() for a in axes] == ["jsq", "min-min"]
    for ax, p in zip(axes, ("jsq", "min-min")):
        (im,) = ax.images
        want = np.array([[gains[p][(kv, lam)] for lam in (1.0, 2.0, 4.0)] for kv in (100.0, 200.0)])
        assert np.array_equal(np.asarray(im.get_array()), want)
        assert im.get_clim() == (-20.0, 20.0)
        assert ax.get_title(loc="center") == p and ax.title.get_fontsize() == 9
        assert ax.get_xlabel() == "arrival rate (requests/s)"
        assert [x.get_text() for x in ax.get_xticklabels()] == ["1", "2", "4"]
        assert list(ax.get_yticks()) == [0, 1]
        texts = {(round(tx.get_position()[0]), round(tx.get_position()[1])): tx for tx in ax.texts}
        assert len(texts) == 6
        for yi, kv in enumerate((100.0, 200.0)):
            for xi, lam in enumerate((1.0, 2.0, 4.0)):
                g = gains[p][(kv, lam)]
                tx = texts[(xi, yi)]
                assert tx.get_text() == f"{g:+.1f} ±0.2\n{3 + lam:.0f} preempt."
                assert tx.get_color() == ("white" if abs(g) > 12.0 else "black")
    assert axes[0].get_ylabel() == "KV tokens per instance"  # the rows share it (sharey)
    assert [y.get_text() for y in axes[0].get_yticklabels()] == ["100", "200"]
    cbar = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    assert len(cbar) == 1 and cbar[0].get_ylabel() == "mean E2E gain over round robin (%)"
    assert fig._suptitle.get_text() == "map"
    # two routers side by side: width 2 (0.9 x 3 rates + 1.6) + 1.2, height (0.55 x 2 capacities + 1.2) + 0.6
    w, h = fig.get_size_inches()
    assert w == pytest.approx(2 * (0.9 * 3 + 1.6) + 1.2) and h == pytest.approx(0.55 * 2 + 1.2 + 0.6)


def test_figure_of_four_routers_wraps_at_three_columns():
    t, gains = table()
    extra = t[t.policy != "round-robin"].copy()
    for name in ("a", "b"):
        more = extra[extra.policy == "jsq"].copy()
        more["policy"] = name
        t = pd.concat([t, more], ignore_index=True)
    fig = regime_figure(t)
    grid = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(grid) == 6 and sum(a.get_visible() for a in grid) == 4
    assert [a.get_title() for a in grid if a.get_visible()] == ["jsq", "min-min", "a", "b"]
    # the colour bar spans the drawn panels, both rows (not just the panel of the last heatmap)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    (cbar,) = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    shown = [a.get_position() for a in grid if a.get_visible()]
    box = cbar.get_position()
    assert box.y0 <= min(b.y0 for b in shown) + 0.02 and box.y1 >= max(b.y1 for b in shown) - 0.02
    w, h = fig.get_size_inches()
    assert w == pytest.approx(3 * (0.9 * 3 + 1.6) + 1.2) and h == pytest.approx(2 * (0.55 * 2 + 1.2) + 0.6)
    assert fig._suptitle is None


def test_a_cell_outside_the_grid_is_refused_naming_the_field():
    sc = two_instances()
    with pytest.raises(ScenarioError) as e:
        scenario_at(sc, 2.0, 0)
    assert str(e.value) == "regimes: kv capacity: expected finite numbers > 0, got 0"
    with pytest.raises(ScenarioError) as e:
        scenario_at(sc, -1.0, 500.0)
    assert str(e.value) == "regimes: rate: expected finite numbers > 0, got -1.0"
    at = scenario_at(sc, 8.0, 500.0)  # rates 1 : 3 scaled to a total of 8
    assert [c.rate for c in at.classes] == [2.0, 6.0] and at.gpu.kv_capacity == 500.0
