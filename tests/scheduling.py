"""How the suite runs side by side: the order modules start in, the areas a test belongs to, the
Spark JVM start, and what each lane spent starting its shared parts (a pytest plugin: tests/conftest.py
loads it).

* **Side by side.** ``./dev test`` runs pytest-xdist workers (``-n``, two on two cores) with
  ``--dist loadscope``: a module's tests run on one worker, in file order (a module's fixtures, and
  tests that build on each other, stay together); each worker has its own broker, Spark session,
  Connect server and Airflow home (the session fixtures are per process; the Airflow home per worker
  is the pytest plugin's: airflow_eo/testing/airflow.py). A test that needs another module's tests
  beside it asks for a shared session fixture instead.
* **Longest first.** Modules start in the order of the time they took when last measured
  (``tests/durations.json``, seconds per module; a module not in it counts as its lane's median), so
  the long system modules do not start last and hold one worker while the other idles. Refresh the
  file with ``./dev test --store-durations`` (it merges the modules of that run).
* **Areas.** Every test carries the marker of each area its module or name belongs to (:data:`AREAS`),
  so ``./dev test area fanout`` (``pytest -m fanout``) runs one area's unit, integration and system
  tests together; a test marked by hand (``@pytest.mark.audit``) joins that area too.
* **JVM start.** Once collected tests reach beyond the unit lane, every JVM the session starts runs
  with the class archive and options of :mod:`airflow_eo.testing.spark` (the archive is built in the
  background the first time, once per environment).
* **Start-up report.** At the end of a run: each session and module fixture's set-up time (the
  broker, Spark, Connect server, Airflow database, a module's world), summed over the workers.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"
# area -> words: a test is in the area when its node id (path and name) contains one of them
AREAS = {
    "fanout": ("fanout", "fan_out", "fan-out", "sinks_", "_sink_", "routing", "topic_pattern"),
    "audit": ("audit",),
    "merge": ("merge", "cdc", "upsert", "changes"),
    "dedup": ("dedup",),
    "reprocess": ("reprocess",),
    "interval": ("interval",),
    "maintenance": ("maintenance", "compact", "vacuum"),
    "decoding": ("avro", "registry", "decode", "decoding", "schema"),
    "shared": ("shared_tables", "features", "column_mapping", "deletion_vector"),
    "connect": ("connect",),
    "airflow": ("tests/integration/airflow/", "tests/system/airflow/", "operators/", "sensors/", "triggers/",
                "dag", "lineage", "version_compat"),
    "ui": ("/ui/",),
    "cli": ("cli",),
    "lease": ("lease", "racing", "concurrency", "killed_attempts", "liveness"),
    "s3": ("s3",),
}
_SETUP_PROBE: dict[str, list] = {}  # "scope fixture" -> [count, total s, longest s], in this process
_MODULE_TIMES: dict[str, float] = defaultdict(float)  # a module's node id -> seconds (this run)


def pytest_addoption(parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help="airflow-eo: write each module's time of this run into tests/durations.json")


def pytest_configure(config) -> None:
    for area, words in AREAS.items():
        config.addinivalue_line("markers", f"{area}: the {area} area (tests whose path or name holds "
                                           f"{', '.join(words)}; ./dev test area {area})")
    config._airflow_eo_startup = {}  # what each worker reported: name -> [count, total, max]
    config.pluginmanager.register(StartupProbe(), "airflow-eo-startup-probe")


def lane_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def areas_of(nodeid: str) -> list[str]:
    """The areas whose words the node id (path and name) holds."""
    where = nodeid.lower()
    return [area for area, words in AREAS.items() if any(word in where for word in words)]


def weights(modules) -> dict[str, float]:
    """Each module's seconds from tests/durations.json, a module not there its lane's median."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    by_lane = defaultdict(list)
    for module, seconds in known.items():
        by_lane[lane_of(module)].append(seconds)
    medians = {lane: statistics.median(values) for lane, values in by_lane.items()}
    return {m: known.get(m, medians.get(lane_of(m), 1.0)) for m in modules}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        for area in areas_of(item.nodeid):
            item.add_marker(area)
    # longest modules first; the order within a module stays the file's (sorted() is stable)
    weight = weights({module_of(item.nodeid) for item in items})
    items[:] = sorted(items, key=lambda item: -weight[module_of(item.nodeid)])
    if any(lane_of(item.nodeid) != "unit" for item in items) and _runs_tests(config):
        from airflow_eo.testing.spark import ClassArchive

        archive = ClassArchive()
        archive.apply()
        config._airflow_eo_archive = archive


def _runs_tests(config) -> bool:
    """This process runs tests: not an xdist controller, and not only collecting."""
    return not config.getoption("collectonly") and not (config.pluginmanager.has_plugin("dsession"))


class StartupProbe:
    """Each session, package and module fixture's set-up time (a plugin of its own: a conftest's hooks do not
    see the session's own fixtures, whose node is above tests/)."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        started = time.perf_counter()
        yield
        if fixturedef.scope in ("session", "package", "module"):
            took = time.perf_counter() - started
            entry = _SETUP_PROBE.setdefault(f"{fixturedef.scope} {fixturedef.argname}", [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += took
            entry[2] = max(entry[2], took)


def pytest_runtest_logreport(report) -> None:
    """Each phase of each test, here or (with xdist) as a worker sends it: its module's time."""
    _MODULE_TIMES[module_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session) -> None:
    config = session.config
    archive = getattr(config, "_airflow_eo_archive", None)
    if archive is not None:
        archive.stop()
        _SETUP_PROBE["(JVM class archive: " + archive.state + ")"] = [0, 0.0, 0.0]
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller reports
        config.workeroutput["airflow_eo_startup"] = json.dumps(_SETUP_PROBE)
        return
    _merge(config, _SETUP_PROBE)
    if config.getoption("store_durations") and _MODULE_TIMES:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({m: round(s, 1) for m, s in _MODULE_TIMES.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


def _merge(config, probe: dict) -> None:
    for name, (count, total, longest) in probe.items():
        entry = config._airflow_eo_startup.setdefault(name, [0, 0.0, 0.0])
        entry[0] += count
        entry[1] += total
        entry[2] = max(entry[2], longest)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist worker ended: its start-up times join the report."""
    sent = getattr(node, "workeroutput", {}).get("airflow_eo_startup")
    if sent:
        _merge(node.config, json.loads(sent))


def pytest_terminal_summary(terminalreporter, config) -> None:
    startup = getattr(config, "_airflow_eo_startup", {})
    if not startup:
        return
    terminalreporter.write_sep("=", "start-up: session and module fixtures (set-up seconds, over all workers)")
    for name, (count, total, longest) in sorted(startup.items(), key=lambda kv: -kv[1][1]):
        if count == 0:
            terminalreporter.write_line(name)
        elif total >= 0.5:
            terminalreporter.write_line(f"{total:8.1f} s  {count:3d}x  longest {longest:6.1f} s  {name}")
