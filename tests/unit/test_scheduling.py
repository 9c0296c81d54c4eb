"""The suite's scheduling (tests/scheduling.py): the order modules start in and the areas tests belong to."""

from __future__ import annotations

import json

from tests import scheduling


def test_modules_start_longest_first_and_an_unknown_one_at_its_lanes_median(monkeypatch, tmp_path):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/system/test_a.py": 300.0, "tests/system/test_b.py": 100.0,
                                     "tests/system/test_c.py": 20.0, "tests/unit/test_d.py": 1.0}))
    monkeypatch.setattr(scheduling, "DURATIONS", durations)
    got = scheduling.weights(["tests/system/test_a.py", "tests/system/test_new.py", "tests/unit/test_new.py",
                              "tests/integration/test_new.py"])
    assert got == {"tests/system/test_a.py": 300.0, "tests/system/test_new.py": 100.0, "tests/unit/test_new.py": 1.0,
                   "tests/integration/test_new.py": 1.0}


def test_the_stored_durations_are_of_modules_of_each_lane():
    stored = json.loads(scheduling.DURATIONS.read_text())
    assert {scheduling.lane_of(m) for m in stored} == {"unit", "integration", "system"}
    assert all(m.startswith("tests/") and m.endswith(".py") and s >= 0 for m, s in stored.items())


def test_a_tests_areas_come_from_its_path_and_its_name():
    assert scheduling.areas_of("tests/system/faults/test_fanout_faults.py::test_killed[connect]") == ["fanout", "connect"]
    assert scheduling.areas_of("tests/unit/spec/test_fanout.py::test_sinks_parse") == ["fanout"]
    assert scheduling.areas_of("tests/integration/test_audit.py::test_a_clean_table") == ["audit"]
    assert scheduling.areas_of("tests/unit/core/test_offsets.py::test_ranges") == []
