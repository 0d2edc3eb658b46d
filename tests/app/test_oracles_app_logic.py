"""The app's logic by hand (fluidopt/app/logic.py): a field's path as the page names it, edits that
create a missing section, and the operating point's per-class table (arrival rate per GPU = class rate /
GPUs, both pricings)."""

from __future__ import annotations

import pytest

from fluidopt.app import logic as L
from fluidopt.scenario import default_scenario, scenario_to_dict

DATA = scenario_to_dict(default_scenario())


@pytest.mark.parametrize("path, shown", [(("classes", 0, "rate"), "classes[0].rate"), (("gpu", "alpha"), "gpu.alpha"),
                                         (("name",), "name"), (("classes", 1, "demand", "slope"),
                                                                "classes[1].demand.slope")])
def test_an_empty_field_is_named_by_its_path(path, shown):
    assert L.field_error(DATA, path, None) == f"{shown}: expected a value"
    if path != ("name",):  # a blank name is the loader's to judge; any other blank string is empty
        assert L.field_error(DATA, path, "  ") == f"{shown}: expected a value"


def test_an_edit_creates_a_missing_section_and_leaves_the_original_alone():
    data = {"name": "x", "classes": [{"name": "a"}]}
    out = L.set_field(data, ("cluster", "gpus"), 4)
    assert out == {"name": "x", "classes": [{"name": "a"}], "cluster": {"gpus": 4}}
    out = L.set_field(data, ("classes", 0, "demand", "model"), "linear")
    assert out["classes"][0] == {"name": "a", "demand": {"model": "linear"}}
    assert data == {"name": "x", "classes": [{"name": "a"}]}


def test_operating_point_classes_by_hand():
    sc = default_scenario()
    op = L.operating_point(sc)
    assert list(op.classes.columns) == ["pricing", "class", "lam", "x", "served_fraction", "y_mixed", "y_solo",
                                        "prefill_wait"]
    n = sc.gpus
    for pricing in ("bundled", "separate"):
        rows = op.classes[op.classes.pricing == pricing]
        assert list(rows["class"]) == list(sc.class_names)
        assert list(rows["lam"]) == pytest.approx([c.rate / n for c in sc.classes], rel=1e-12)
    assert list(op.headline.pricing) == ["bundled", "separate"]
