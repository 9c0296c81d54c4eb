"""End to end through a real ``airflow standalone``: the example DAG driven over the REST API.

One server per module (fresh AIRFLOW_HOME, SQLite, 127.0.0.1 on a free port, parallelism 4),
the DAGs folder holding a copy of ``dags/kafka_to_delta_scheduled.py`` pointed at a fresh
topic of the session's embedded broker and a fresh table, the connections set by
environment variables as a deployment would. The tests run in file order and build on each
other, as a user of the UI would: unpause (the scheduler then makes the run of the latest
hourly tick), trigger manual runs, clear a finished run, backfill three hours of
2026-01-01; finally the table is checked against the broker and every run's XCom summary
against the Delta log.

Records are produced whenever a run's sensor is still to pass and the table has caught up
with the broker, so every run ingests something; a sensor that defers anyway (the real
path: the triggerer polls every 10 s) is woken by the same feeding.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from datetime import datetime

import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from airflow_eo.demo.airflow import DEMO_DAG_FILE
from airflow_eo.table.ledger import Ledger
from tests.system.airflow.standalone import FINISHED_TI_STATES, StandaloneAirflow, StandaloneError, session_pids
from tests.helpers import broker_records, committed_offsets, duplicates, keys_of, new_topic, produce, read_table

DAG_ID = "kafka_to_delta_scheduled"
INGEST_ID = "orders"  # the DAG's ingest_id
PARTITIONS = 3
CHUNK = 90  # records produced per feeding: 30 per partition
BACKFILL_DATES = ["2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00+00:00"]


class Feeder:
    """Keeps a backlog for runs whose sensor has still to pass."""

    def __init__(self, config: dict, topic: str, table_uri: str):
        self.config, self.topic, self.table_uri = config, topic, table_uri
        self.produced = 0
        self.consumer = Consumer({**config, "group.id": "airflow-eo-standalone-test", "enable.auto.commit": False})

    def ends(self) -> dict[int, int]:
        return {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}

    def committed(self) -> dict[int, int | None]:
        if not os.path.isdir(os.path.join(self.table_uri, "_delta_log")):
            return {p: None for p in range(PARTITIONS)}
        return committed_offsets(self.table_uri, INGEST_ID, self.topic, PARTITIONS)

    def backlog(self) -> int:
        committed = self.committed()
        return sum(end - (committed[p] or 0) for p, end in self.ends().items())

    def produce(self, count: int = CHUNK) -> None:
        produce(self.config, self.topic, count, partitions=PARTITIONS, start=self.produced)
        self.produced += count

    def ensure_backlog(self) -> None:
        if self.backlog() == 0:
            self.produce()

    def tick(self, api, active_runs: list[dict]) -> None:
        """Feed when a run not finished has its sensor still to pass and nothing is waiting."""
        for run in active_runs:
            tis = api.task_instances(DAG_ID, run["dag_run_id"])
            sensor = tis.get("wait_for_records")
            if sensor is None or sensor["state"] not in FINISHED_TI_STATES:
                self.ensure_backlog()
                return

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture(scope="module")
def world(kafka_config):
    root = tempfile.mkdtemp(prefix="airflow-eo-standalone-test-")
    dags, table = os.path.join(root, "dags"), os.path.join(root, "orders")
    os.makedirs(dags)
    shutil.copy(DEMO_DAG_FILE, dags)
    topic = new_topic(kafka_config, PARTITIONS)
    lineage = os.path.join(root, "lineage")
    os.makedirs(lineage)
    server = StandaloneAirflow(dags, home=os.path.join(root, "home"), extra_env={
        # the OpenLineage provider at its defaults (it forks the task process per event) with a
        # file transport: a file per event under `lineage`
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": os.path.join(lineage, "ev")}),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": kafka_config["bootstrap.servers"]}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_EO_TABLE_URI": table,
        "AIRFLOW_EO_TOPIC": topic,
    })
    os.makedirs(server.home, exist_ok=True)
    feeder = Feeder(kafka_config, topic, table)
    state = {"server": server, "feeder": feeder, "topic": topic, "table": table, "config": kafka_config,
             "runs": {}, "started": time.monotonic(), "lineage": lineage}
    try:
        server.start()
        server.wait_ready()
        state["api"] = server.client()
        yield state
    finally:
        try:
            server.stop()
        finally:
            feeder.close()
            print(f"\nairflow standalone module: {time.monotonic() - state['started']:.0f}s")
            if not os.environ.get("AIRFLOW_EO_KEEP_STANDALONE"):
                shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def debug_on_failure(world):
    """On failure print the tail of the standalone log and of the logs of unfinished or
    failed tasks (or, if none, of the newest task logs)."""
    try:
        yield
    except BaseException as exc:
        # CI shows the end of the output: the server's log first, then the task logs, and last
        # a short summary of every run's task states and the error itself
        server = world["server"]
        print(server.log_tail(60))
        paths, states = [], []
        with contextlib.suppress(Exception):
            api = world["api"]
            for run in api.dag_runs(DAG_ID):
                tis = api.task_instances(DAG_ID, run["dag_run_id"])
                states.append(f"  {run['dag_run_id']}: {run['state']}; " + ", ".join(
                    f"{t}={ti['state']} (try {ti['try_number']})" for t, ti in sorted(tis.items())))
                for task_id, ti in tis.items():
                    if ti["state"] not in ("success", "skipped"):
                        paths += server.task_logs(DAG_ID, run["dag_run_id"], task_id)[-1:]
        for path in paths or server.task_logs(DAG_ID)[-2:]:
            print(server.task_log_tail(path, 40))
        print("runs and task states at the failure:\n" + "\n".join(states))
        print(f"failure: {exc.__class__.__name__}: {str(exc)[:2000]}")
        raise


def wait(world, run_ids, **kwargs) -> set[str]:
    """Wait for ``run_ids``, feeding their sensors; return the other runs seen active meanwhile
    (hourly runs the scheduler made when the clock passed a full hour: they take part)."""
    api, feeder, others = world["api"], world["feeder"], set()

    def tick(active):
        others.update(r["dag_run_id"] for r in active if r["dag_run_id"] not in run_ids)
        feeder.tick(api, active)

    api.wait_runs(DAG_ID, run_ids, tick=tick, **kwargs)
    if others:
        print(f"runs {sorted(others)} were active while waiting for {run_ids}")
        world["overlap"] = True
    return others


def settle(world) -> list[dict]:
    """Wait for the runs still going (an hourly run the scheduler made meanwhile) and return
    the DAG's runs, all finished. The scheduler makes an hourly run only once no run of the
    DAG is active (max_active_runs=1), so one may appear the moment the last run ends: the
    runs returned are a snapshot in which every run has finished, and a run made after it
    takes part in what follows as an overlap."""
    while True:
        runs = world["api"].dag_runs(DAG_ID)
        unfinished = [r["dag_run_id"] for r in runs if r["state"] not in ("success", "failed")]
        if not unfinished:
            return runs
        print(f"waiting for runs {unfinished} first")
        world["overlap"] = True
        wait(world, unfinished)


def _instant(iso: str):
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def start_backfill(api, body: dict) -> dict:
    """``POST /api/v2/backfills``, as a user clicking Backfill would. Airflow allows one running backfill per
    DAG: a 409 names the one running. If it is this request's own (a request the client sent again after a
    "database is locked" 503 may have been written the first time), it is the result; another one is waited
    for (up to 60 s) and the request sent again."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return api.post("/api/v2/backfills", json=body)
        except StandaloneError as exc:
            if "already a running backfill" not in str(exc):
                raise
        running = [b for b in api.get("/api/v2/backfills", params={"dag_id": body["dag_id"]})["backfills"]
                   if b["completed_at"] is None]
        mine = [b for b in running if (_instant(b["from_date"]), _instant(b["to_date"])) ==
                (_instant(body["from_date"]), _instant(body["to_date"]))
                and b.get("dag_run_conf") == body.get("dag_run_conf", {})]
        if mine:
            return mine[0]
        assert time.monotonic() < deadline, f"another backfill kept running: {running}"
        time.sleep(2)


def summary_of(world, run_id) -> dict:
    return world["api"].xcom(DAG_ID, run_id, "ingest")


def assert_summary_matches_log(summary, table_uri):
    """The batch, version, ranges and rows a run reports are those of a commit in the log."""
    record = Ledger.open(table_uri).find_batch(INGEST_ID, attempt_id=summary["attempt_id"])
    assert record is not None, f"no commit of attempt {summary['attempt_id']} in the Delta log"
    assert (record.meta.batch, record.version, record.meta.rows) == \
        (summary["batch"], summary["version"], summary["rows"])
    assert [r.__dict__ for r in record.meta.ranges if r.end > r.start] == summary["ranges"]
    history = {h["version"] for h in DeltaTable(table_uri).history()}
    assert summary["version"] in history


def assert_follows(previous: dict, summary: dict):
    """``summary``'s ranges start where ``previous``'s ended (per partition it read)."""
    ends = {(r["topic"], r["partition"]): r["end"] for r in previous["ranges"]}
    for r in summary["ranges"]:
        key = (r["topic"], r["partition"])
        if key in ends:
            assert r["start"] == ends[key], (previous, summary)


def attempts(table_uri) -> list[str]:
    path = os.path.join(table_uri, "_airflow_eo", "attempts")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def listening_sockets(sid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets listened on by the processes of session ``sid``."""
    inodes = set()
    for pid in session_pids(sid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, st, inode = fields[1], fields[3], fields[9]
                if st != "0A" or inode not in inodes:  # 0A = LISTEN
                    continue
                addr_hex, port_hex = local.split(":")
                if width == 8:
                    addr = ".".join(str(int(addr_hex[i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    loopback6 = "0" * 24 + "01000000"
                    addr = "::" if set(addr_hex) == {"0"} else ("::1" if addr_hex == loopback6 else addr_hex)
                found.append((addr, int(port_hex, 16)))
    return found


# -- the scenario ---------------------------------------------------------------------------

def test_server_is_up_on_loopback_with_the_dag(world):
    server, api = world["server"], world["api"]
    with debug_on_failure(world):
        deadline = time.monotonic() + 120
        while True:  # the DAG processor parses the folder once it is up
            dag = api.get(f"/api/v2/dags/{DAG_ID}", expect=(200, 404))
            if dag.get("dag_id") == DAG_ID:
                break
            assert time.monotonic() < deadline, f"{DAG_ID} never appeared: {api.get('/api/v2/importErrors')}"
            time.sleep(2)
        assert dag["is_paused"] is True  # dags_are_paused_at_creation
        assert api.get("/api/v2/importErrors")["total_entries"] == 0
        env = server.env
        log_ports = {int(env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]),
                     int(env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"])}
        sockets = listening_sockets(server.process.pid)
        assert ("127.0.0.1", server.port) in sockets
        # every socket is on loopback but the two log servers, which Airflow 3.3 binds on all
        # interfaces (not configurable): they are at least on the free ports chosen here
        exposed = {(a, p) for a, p in sockets if a not in ("127.0.0.1", "::1")}
        assert {p for _, p in exposed} <= log_ports, sockets
        assert not {8080, 8793, 8794} & {p for _, p in sockets}


def test_manual_runs_each_commit_the_next_batch(world):
    api, feeder = world["api"], world["feeder"]
    with debug_on_failure(world):
        feeder.ensure_backlog()
        api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False})
        # unpausing makes the scheduler create the run of the latest hourly tick (catchup=False)
        deadline, scheduled = time.monotonic() + 30, []
        while not scheduled and time.monotonic() < deadline:
            scheduled = [r["dag_run_id"] for r in api.dag_runs(DAG_ID) if r["run_type"] == "scheduled"]
            time.sleep(1)
        summaries, overlap = [], set()
        if scheduled:
            overlap |= wait(world, scheduled)
            summaries.append(summary_of(world, scheduled[0]))
            assert summaries[0]["status"] == "committed" and summaries[0]["rows"] > 0, summaries[0]
        manual = []
        for _ in range(2):
            feeder.ensure_backlog()
            run = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None})
            assert run["logical_date"] is None and run["run_type"] == "manual"
            overlap |= wait(world, [run["dag_run_id"]])
            manual.append(run["dag_run_id"])
            summary = summary_of(world, run["dag_run_id"])
            assert summary["status"] == "committed" and summary["rows"] > 0, summary
            assert summary["run_key"] == f"{DAG_ID}/{run['dag_run_id']}/ingest/-1"
            assert summary["spark_started"] is True
            summaries.append(summary)
        for previous, summary in zip(summaries, summaries[1:]):
            assert summary["batch"] > previous["batch"] and summary["version"] > previous["version"]
            if not overlap:  # no hourly run in between: consecutive batches and ranges
                assert summary["batch"] == previous["batch"] + 1
                assert_follows(previous, summary)
        for summary in summaries:
            assert_summary_matches_log(summary, world["table"])
        world["runs"]["manual"] = manual
        world["runs"]["first_manual_summary"] = summaries[-2]


def test_clear_of_finished_run_is_a_noop(world):
    api, feeder, table = world["api"], world["feeder"], world["table"]
    run_id, before = world["runs"]["manual"][0], world["runs"]["first_manual_summary"]
    with debug_on_failure(world):
        settle(world)
        tries = {t: ti["try_number"] for t, ti in api.task_instances(DAG_ID, run_id).items()}
        version, offsets, files = DeltaTable(table).version(), feeder.committed(), attempts(table)
        feeder.ensure_backlog()  # new records are there: the cleared run must not take them
        backlog = feeder.backlog()
        cleared = api.post(f"/api/v2/dags/{DAG_ID}/clearTaskInstances", json={
            "dag_run_id": run_id, "only_failed": False, "dry_run": False})
        assert {ti["task_id"] for ti in cleared["task_instances"]} == {"wait_for_records", "ingest"}
        deadline = time.monotonic() + 60
        while api.dag_run(DAG_ID, run_id)["state"] == "success":  # the clear resets the run
            assert time.monotonic() < deadline, "the cleared run never left state success"
            time.sleep(1)
        overlap = wait(world, [run_id])
        tis = api.task_instances(DAG_ID, run_id)
        assert tis["ingest"]["state"] == "success" and tis["ingest"]["try_number"] == tries["ingest"] + 1
        summary = summary_of(world, run_id)
        assert summary["status"] == "already_committed", summary
        assert (summary["batch"], summary["version"], summary["attempt_id"], summary["ranges"], summary["rows"]) == \
            (before["batch"], before["version"], before["attempt_id"], before["ranges"], before["rows"])
        assert summary["spark_started"] is False
        assert_summary_matches_log(summary, table)
        if not overlap:  # no hourly run meanwhile: nothing at all happened to the table
            assert DeltaTable(table).version() == version
            assert feeder.committed() == offsets and feeder.backlog() == backlog
            assert attempts(table) == files  # no Spark attempt was started


def test_backfill_runs_take_the_next_ranges(world):
    api, feeder, table = world["api"], world["feeder"], world["table"]
    with debug_on_failure(world):
        last = max((summary_of(world, r["dag_run_id"]) for r in settle(world)), key=lambda s: s["batch"] or 0)
        feeder.ensure_backlog()
        backfill = start_backfill(api, {
            "dag_id": DAG_ID, "from_date": BACKFILL_DATES[0], "to_date": BACKFILL_DATES[-1],
            "max_active_runs": 1, "reprocess_behavior": "none"})
        deadline, runs = time.monotonic() + 60, []
        while len(runs) < len(BACKFILL_DATES):
            runs = [r for r in api.dag_runs(DAG_ID) if r["run_type"] == "backfill"]
            assert time.monotonic() < deadline, f"backfill {backfill['id']} created {runs}"
            time.sleep(1)
        assert sorted(r["logical_date"].replace("Z", "+00:00") for r in runs) == BACKFILL_DATES
        run_ids = [r["dag_run_id"] for r in sorted(runs, key=lambda r: r["logical_date"])]
        overlap = wait(world, run_ids)
        deadline = time.monotonic() + 60
        while api.get(f"/api/v2/backfills/{backfill['id']}")["completed_at"] is None:
            assert time.monotonic() < deadline, "the backfill never completed"
            time.sleep(2)
        summaries = [summary_of(world, r) for r in run_ids]
        for summary in summaries:
            if overlap and summary["status"] == "nothing_new":  # an hourly run took its records
                continue
            assert summary["status"] == "committed" and summary["rows"] > 0, summary
            assert_summary_matches_log(summary, table)
        if not overlap:  # no hourly run came in between: the backfill took the next batches
            summaries.sort(key=lambda s: s["batch"])
            assert [s["batch"] for s in summaries] == [last["batch"] + i for i in (1, 2, 3)]
            for previous, summary in zip([last, *summaries], summaries):
                assert_follows(previous, summary)
        world["runs"]["backfill"] = run_ids


def test_table_holds_the_broker_exactly_once_and_summaries_match_the_log(world):
    feeder, table, topic = world["feeder"], world["table"], world["topic"]
    with debug_on_failure(world):
        runs = settle(world)
        rows = read_table(table)
        assert duplicates(rows) == {}
        records = broker_records(world["config"]["bootstrap.servers"], topic)
        assert set(keys_of(rows)) == set(records) and rows.num_rows == len(records) == feeder.produced
        assert feeder.committed() == feeder.ends()
        assert all(r["state"] == "success" for r in runs), [(r["dag_run_id"], r["state"]) for r in runs]
        by_batch: dict[int, list[dict]] = {}
        for run in runs:
            summary = summary_of(world, run["dag_run_id"])
            if summary["status"] == "nothing_new":
                # only when runs overlapped: the sensor of one saw the records another run's
                # ingest had already planned
                assert world.get("overlap") and run["dag_run_id"] not in world["runs"]["manual"], summary
                assert summary["batch"] is None and summary["rows"] == 0 and summary["ranges"] == []
                continue
            assert summary["status"] in ("committed", "already_committed"), (run["dag_run_id"], summary)
            assert summary["run_key"] == f"{DAG_ID}/{run['dag_run_id']}/ingest/-1"
            assert_summary_matches_log(summary, table)
            by_batch.setdefault(summary["batch"], []).append(summary)
        last = Ledger.open(table).last_batch(INGEST_ID)
        assert sorted(by_batch) == list(range(1, last + 1))  # every batch reported by a run
        assert all(len(s) == 1 for s in by_batch.values()), by_batch  # and by one run only
        assert sum(s[0]["rows"] for s in by_batch.values()) == rows.num_rows
        kinds = sorted(r["run_type"] for r in runs)
        assert kinds.count("manual") == 2 and kinds.count("backfill") == 3, kinds


def test_a_successful_ingest_log_is_short_and_tells_plan_rate_and_commit(world):
    """What the user reads in the UI: our lines (plan, rate, commit, lag), not Spark's INFO chatter."""
    server, run_id = world["server"], world["runs"]["backfill"][-1]
    with debug_on_failure(world):
        assert summary_of(world, run_id)["status"] == "committed"
        path = server.task_logs(DAG_ID, run_id, "ingest")[-1]
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        text = "\n".join(lines)
        assert len(lines) < 40, server.task_log_tail(path, 200)
        assert ": plan " in text and " offsets)" in text, text  # the plan: ranges and offsets
        assert "rows/s" in text and "committed batch" in text, text  # rate and the commit
        # the summary: its table (a fan-out's lines name theirs), batch and lag
        assert f"airflow-eo committed: table {world['table']}, batch " in text and "lag {" in text, text
        # Spark's INFO output stops once spark.log.level=WARN applies: at most its start-up banner
        spark_info = [line for line in lines if " INFO " in line and "airflow_eo." not in line]
        assert len(spark_info) <= 5, "\n".join(spark_info)
        assert "DeprecationWarning" not in text, text


def test_a_backfill_with_reprocess_conf_replaces_one_past_runs_rows(world):
    """Airflow 3's way to reprocess a past run (clear takes no conf): a backfill of its date
    with ``reprocess_behavior`` and the run conf ``{"reprocess": true}``."""
    api, feeder, table = world["api"], world["feeder"], world["table"]
    run_id, date = world["runs"]["backfill"][1], BACKFILL_DATES[1]
    with debug_on_failure(world):
        settle(world)
        before = summary_of(world, run_id)
        rows_before, offsets = read_table(table).num_rows, feeder.committed()
        feeder.ensure_backlog()  # the run's sensor passes as in a real deployment
        start_backfill(api, {
            "dag_id": DAG_ID, "from_date": date, "to_date": date, "max_active_runs": 1,
            "reprocess_behavior": "completed", "dag_run_conf": {"reprocess": True}})
        deadline = time.monotonic() + 60
        while api.dag_run(DAG_ID, run_id)["state"] == "success":  # the backfill clears the run first
            assert time.monotonic() < deadline, "the backfill never re-ran the finished run"
            time.sleep(1)
        overlap = wait(world, [run_id])
        summary = summary_of(world, run_id)
        if before["status"] != "committed":  # an hourly run took that run's records: nothing to reprocess
            assert overlap and api.task_instances(DAG_ID, run_id)["ingest"]["state"] == "failed"
            return
        assert summary["status"] == "reprocessed", summary
        assert (summary["batch"], summary["ranges"], summary["rows"]) == (before["batch"], before["ranges"],
                                                                          before["rows"])
        table_rows = read_table(table)
        assert duplicates(table_rows) == {}
        if not overlap:
            assert table_rows.num_rows == rows_before and feeder.committed() == offsets  # offsets did not move


def lineage_events(world) -> list[dict]:
    events = []
    for name in sorted(os.listdir(world["lineage"])):
        with open(os.path.join(world["lineage"], name)) as f:
            events += [json.loads(line) for line in f if line.strip()]
    return events


def test_lineage_of_every_ingest_run_and_no_error_in_the_task_logs(world):
    """Every ingest run emits START and COMPLETE with the topic in and the table out (and its
    columns), and no task log holds an error line, a deltalake fork panic or an OpenLineage child
    killed at the provider's timeout (the provider runs at its defaults: a forked child per event)."""
    api, server, table, topic = world["api"], world["server"], world["table"], world["topic"]
    host, port = world["config"]["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    with debug_on_failure(world):
        runs = [r for r in settle(world) if api.task_instances(DAG_ID, r["dag_run_id"])["ingest"]["state"] == "success"]
        deadline = time.monotonic() + 30  # a forked child may still be writing its event
        while True:
            events = [e for e in lineage_events(world) if e.get("job", {}).get("name") == f"{DAG_ID}.ingest"]
            completes = [e for e in events if e["eventType"] == "COMPLETE"]
            if len(completes) >= len(runs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        starts = [e for e in events if e["eventType"] == "START"]
        assert len(starts) >= len(runs) and len(completes) >= len(runs), (len(starts), len(completes), len(runs))
        for event in starts:  # the operator's start facets: the table (Kafka is known once execute ran)
            assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [("file", table)], event
        for event in completes:
            assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(f"kafka://{host}:{port}", topic)], event
            (out,) = event["outputs"]
            assert (out["namespace"], out["name"]) == ("file", table), out
            assert [f["name"] for f in out["facets"]["schema"]["fields"]][:3] == ["topic", "partition", "offset"], out
        reported = {(e["run"]["facets"]["airflow_eo"]["status"], e["run"]["facets"]["airflow_eo"].get("batch"))
                    for e in completes}  # a facet leaves out what is None (a run with nothing new has no batch)
        for run in runs:
            summary = summary_of(world, run["dag_run_id"])
            assert (summary["status"], summary["batch"]) in reported, (summary, reported)
        for run in runs:
            for path in server.task_logs(DAG_ID, run["dag_run_id"], "ingest"):
                with open(path, errors="replace") as f:
                    text = f.read()
                bad = [line for line in text.splitlines()
                       if '"level":"error"' in line.replace(" ", "") or " ERROR " in line
                       or "Forked process detected" in line or "panicked" in line]
                assert not bad, "\n".join(bad[:10])
        for path in server.task_logs(DAG_ID):  # every task: no OpenLineage child hung until killed
            with open(path, errors="replace") as f:
                expired = [line for line in f if "expired and will be terminated" in line]
            assert not expired, (path, expired[:3])


def test_the_exactly_once_tables_page_opens_through_the_api_server_with_a_token(world):
    """The UI plugin's page, fetched as the UI's navigation entry opens it (its relative href under
    the API server's base URL), with a token and with the UI's session cookie; refused without.
    Independent of the tests above: if no run committed yet, it makes one."""
    import re
    from urllib.parse import urljoin

    import requests

    server, api, table = world["server"], world["api"], world["table"]
    with debug_on_failure(world):
        def committed_runs() -> int:
            return api.get("/api/v2/assets/events", params={"source_dag_id": DAG_ID, "limit": 1})["total_entries"]

        if not committed_runs():  # run alone: a run that commits (records for every waiting sensor)
            api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None})
            api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False})
            deadline, start = time.monotonic() + 600, 0
            while not committed_runs():
                assert time.monotonic() < deadline, f"no run of {DAG_ID} committed: {api.dag_runs(DAG_ID)}"
                produce(world["config"], world["topic"], PARTITIONS, partitions=PARTITIONS, prefix="ui", start=start)
                start += PARTITIONS
                time.sleep(10)
        (plugin,) = [p for p in api.get("/api/v2/plugins")["plugins"] if p["name"] == "airflow_eo"]
        (view,) = plugin["external_views"]
        assert view["name"] == "Exactly-once tables" and view["destination"] == "nav"
        page_url = urljoin(server.base_url + "/", view["href"])  # as the UI resolves it (its <base href>)
        headers = dict(api.session.headers)
        listed = requests.get(page_url, headers=headers, timeout=60)
        assert listed.status_code == 200, listed.text[:2000]
        assert listed.headers["content-type"].startswith("text/html")
        # what the page sets into long names so they wrap well: <wbr>, a path's segments
        text = re.sub(r'<span class="seg">([^<]*)</span>', r"\1", listed.text).replace("<wbr>", "")
        assert f">{table}</a>" in text and f"<code>{INGEST_ID}</code>" in text and DAG_ID in text
        href = next(h.replace("&amp;", "&") for h in re.findall(r'href="(table\?[^"]+)"', listed.text))
        detail = requests.get(urljoin(page_url, href), headers=headers, timeout=60)
        assert detail.status_code == 200, detail.text[:2000]
        assert "Recent batches" in detail.text and "Committed offsets" in detail.text
        for partition, offset in committed_offsets(table, INGEST_ID, world["topic"], PARTITIONS).items():
            if offset is not None:
                assert (f'<td data-label="Partition" class="num">{partition}</td>'
                        f'<td data-label="Next offset" class="num">{offset:,}</td>') in detail.text
        token = headers["Authorization"].split(" ", 1)[1]  # the UI's session cookie carries the same JWT
        assert requests.get(page_url, cookies={"_token": token}, timeout=60).status_code == 200
        refused = requests.get(page_url, timeout=60)
        assert refused.status_code == 401 and "orders" not in refused.text  # no table, not even a segment
