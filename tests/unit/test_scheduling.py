"""The suite's scheduling (tests/scheduling.py): the order modules start in and the areas tests belong to."""

from __future__ import annotations

import json

from tests import scheduling


def module(lane: str, name: str) -> str:
    """A module's node id (made here: made-up modules written out would read as citations of files)."""
    return f"tests/{lane}/{name}.py"


def test_modules_start_longest_first_and_an_unknown_one_at_its_lanes_median(monkeypatch, tmp_path):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({module("system", "a"): 300.0, module("system", "b"): 100.0,
                                     module("system", "c"): 20.0, module("unit", "d"): 1.0}))
    monkeypatch.setattr(scheduling, "DURATIONS", durations)
    got = scheduling.weights([module("system", "a"), module("system", "new"), module("unit", "new"),
                              module("integration", "new")])
    assert got == {module("system", "a"): 300.0, module("system", "new"): 100.0, module("unit", "new"): 1.0,
                   module("integration", "new"): 1.0}


def test_the_stored_durations_are_of_modules_of_each_lane():
    stored = json.loads(scheduling.DURATIONS.read_text())
    assert {scheduling.lane_of(m) for m in stored} == {"unit", "integration", "system"}
    assert all(m.startswith("tests/") and m.endswith(".py") and s >= 0 for m, s in stored.items())


def test_a_tests_areas_come_from_its_path_and_its_name():
    def areas(lane, name, test):
        return scheduling.areas_of(f"{module(lane, name)}::{test}")

    assert areas("system/faults", "test_fanout_faults", "test_killed[connect]") == ["fanout", "connect"]
    assert areas("unit/spec", "test_fanout", "test_sinks_parse") == ["fanout"]
    assert areas("integration", "test_audit", "test_a_clean_table") == ["audit"]
    assert areas("unit/core", "test_offsets", "test_ranges") == []
