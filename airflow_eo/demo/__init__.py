"""``airflow-eo demo``: the whole pipeline on the embedded broker, in one command.

A development extra (``pip install 'airflow-eo[demo]'``, which brings the noida-db broker):
the CLI imports this package only for ``airflow-eo demo``; nothing in the library does.

Starts noida-db on 127.0.0.1, produces sample order events (and an aborted transaction),
ingests them into a local Delta table through the example Airflow DAG (``dag.test()``, real
spark-submit), produces more, ingests again, clears the second run (a verified no-op), then
tells the table's offsets and lag and checks that it holds every record exactly once. Its
terminal output is that story; Airflow's and Spark's own output goes to ``<dir>/demo.log``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

DEMO_TOPIC = "orders"
DEMO_INGEST_ID = "orders"  # the example DAG's ingest_id


def produce_orders(config: dict, count: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 20})
    for i in range(start, start + count):
        event = {"order_id": i, "customer": f"c{i % 97}", "amount": round(10 + (i % 500) * 0.37, 2)}
        producer.produce(DEMO_TOPIC, key=str(i).encode(), value=json.dumps(event).encode(), partition=i % 3)
        if i % 5000 == 0:
            producer.poll(0)
    producer.flush(60)
    tx = Producer({**config, "transactional.id": f"demo-{start}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce(DEMO_TOPIC, value=b'{"order_id": -1, "note": "aborted: never ingested"}', partition=0)
    tx.flush(30)  # on the broker before the abort (abort_transaction drops what is still queued)
    tx.abort_transaction()


def run_demo(directory: str, records: int = 10_000) -> int:
    """The demo; its story on stdout (≤ 30 lines), everything else in ``<directory>/demo.log``.
    Everything it makes stays in ``directory`` (the broker's data, Airflow's home, temporary and
    Spark scratch files); the processes it starts end with it. 0 when the table holds every record
    exactly once."""
    import traceback

    from airflow_eo.demo.story import Story

    directory = os.path.abspath(directory)
    paths = DemoPaths.of(directory)
    # Each demo starts a fresh broker whose offsets restart at 0: a table from an earlier demo
    # would (rightly) be refused as "topic recreated", so its table starts afresh too.
    for stale in (paths.table, paths.broker, paths.scratch):
        shutil.rmtree(stale, ignore_errors=True)
    for needed in (paths.broker, paths.scratch):
        os.makedirs(needed)
    _keep_inside(paths)
    with Story(paths.log) as story:
        try:
            return _tell(story, paths, records)
        except Exception as exc:
            traceback.print_exc()  # into the log
            story.say(f"the demo failed: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            story.say(f"full Airflow and Spark log: {paths.log}", stamp=False)
            return 1
        finally:
            shutil.rmtree(paths.scratch, ignore_errors=True)


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps what it makes: all inside its data directory."""

    directory: str
    table: str
    broker: str
    airflow_home: str
    scratch: str
    log: str

    @classmethod
    def of(cls, directory: str) -> "DemoPaths":
        def inside(name: str) -> str:
            return os.path.join(directory, name)

        return cls(directory, inside("orders_table"), inside("broker"), inside("airflow"), inside("tmp"),
                   inside("demo.log"))


def _keep_inside(paths: DemoPaths) -> None:
    """Temporary files of this process and its children (Airflow, spark-submit, the Spark driver and
    its attempts' scratch) go to the demo's own directory, removed when it ends, not to /tmp."""
    import tempfile

    os.environ["TMPDIR"] = paths.scratch
    tempfile.tempdir = None  # tempfile caches the directory it chose first
    os.environ["AIRFLOW_HOME"] = paths.airflow_home  # the demo's, never a home set for real work


def _tell(story, paths: DemoPaths, records: int) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    from airflow_eo.demo.airflow import prepare_airflow_env
    from airflow_eo.demo.broker import EmbeddedBroker
    from airflow_eo.status import table_status

    story.say(f"airflow-eo demo in {paths.directory}: Kafka → Airflow → Spark → Delta Lake, exactly once",
              stamp=False)
    first, second = records // 2, records - records // 2
    with EmbeddedBroker(data_dir=paths.broker) as broker:
        story.say(f"started Kafka: the embedded noida-db broker at {broker.bootstrap_servers}")
        admin = AdminClient(broker.config)  # must outlive the futures
        for f in admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1)]).values():
            f.result()
        prepare_airflow_env(paths.table, broker.bootstrap_servers, DEMO_TOPIC)
        story.say(f"started Airflow in this process (SQLite in {paths.airflow_home}): DAG kafka_to_delta_scheduled, "
                  "sensor → ingest, each ingest a spark-submit on local[2]")
        produce_orders(broker.config, first)
        story.say(f"produced {first} order events to topic '{DEMO_TOPIC}' (3 partitions) + 1 aborted transaction")
        run1 = _run(story, "run 1", paths, broker)
        produce_orders(broker.config, second, start=first)
        story.say(f"produced {second} more + 1 aborted transaction")
        run2 = _run(story, "run 2", paths, broker)
        _clear(story, paths, broker, run2)
        status = table_status(paths.table, DEMO_INGEST_ID, broker.config)
    verdict = _verdict(paths.table, records, run1.summary, run2.summary)
    story.say(f"Delta table {paths.table}: version {status.version}, {verdict.rows} rows", stamp=False)
    for p in status.partitions:
        story.say(f"  {p.topic}[{p.partition}]  committed offset {p.committed:>6}  end {p.end:>6}  lag {p.lag}",
                  stamp=False)
    story.say(verdict.line, stamp=False)
    story.say(f"look further: airflow-eo status {paths.table} --ingest-id {DEMO_INGEST_ID}", stamp=False)
    story.say(f"              AIRFLOW_HOME={paths.airflow_home} airflow dags list-runs kafka_to_delta_scheduled",
              stamp=False)
    story.say(f"full Airflow and Spark log: {paths.log}", stamp=False)
    return 0 if verdict.exactly_once else 1


def _run(story, name: str, paths: DemoPaths, broker):
    """One run of the example DAG, told as its plan and its commit."""
    from airflow_eo.demo.airflow import run_demo_via_airflow

    started = time.monotonic()
    with story.working(f"{name}: Airflow and Spark at work"):
        run = run_demo_via_airflow(paths.table, broker.bootstrap_servers, topic=DEMO_TOPIC)
    s = run.summary
    story.say(f"{name} ({run.run_id}): plan batch {s['batch']}: {_ranges(s)}")
    story.say(f"{name}: {s['status']} batch {s['batch']} → table version {s['version']}: {s['rows']} rows in "
              f"{s['seconds']:.1f} s (Spark job included; the whole Airflow run {time.monotonic() - started:.1f} s)")
    return run


def _clear(story, paths: DemoPaths, broker, run) -> None:
    """Run 2's ingest task again under the same run id, as a clear does: a verified no-op."""
    from airflow_eo.demo.airflow import run_demo_via_airflow

    with story.working("clear of run 2: its ingest task again"):
        again = run_demo_via_airflow(paths.table, broker.bootstrap_servers, topic=DEMO_TOPIC,
                                     logical_date=run.logical_date, ingest_only=True)
    s, before = again.summary, run.summary
    no_op = (s["status"] == "already_committed" and s["version"] == before["version"] and not s["spark_started"])
    story.say(f"clear of run 2 (its ingest task again, same run id): {s['status']} batch {s['batch']}, table "
              f"version {s['version']}, Spark {'started' if s['spark_started'] else 'not started'}"
              f"{': a no-op' if no_op else ': NOT a no-op'}")


def _ranges(summary: dict) -> str:
    return ", ".join(f"{r['topic']}[{r['partition']}] {r['start']}..{r['end']}" for r in summary["ranges"])


@dataclass(frozen=True)
class Verdict:
    """Whether the table holds every produced record once and no aborted one."""

    rows: int
    exactly_once: bool
    line: str


def _verdict(table_uri: str, records: int, *summaries: dict) -> Verdict:
    import pyarrow.compute as pc
    import pyarrow.dataset as pads
    from deltalake import DeltaTable

    table = pads.dataset(DeltaTable(table_uri).file_uris(), format="parquet").to_table(
        columns=["topic", "partition", "offset", "body"])
    keys = {(t, p, o) for t, p, o in zip(*(table[c].to_pylist() for c in ("topic", "partition", "offset")))}
    aborted = pc.sum(pc.match_substring(table["body"], "aborted")).as_py() or 0
    committed = sum(s["rows"] for s in summaries)
    ok = table.num_rows == records == committed and len(keys) == table.num_rows and aborted == 0
    line = (f"exactly once: {records} records produced, {committed} committed by 2 runs, {table.num_rows} rows, "
            f"{table.num_rows - len(keys)} duplicates, {aborted} aborted records")
    return Verdict(table.num_rows, ok, line if ok else "NOT exactly once: " + line.split(": ", 1)[1])
