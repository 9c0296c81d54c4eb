"""Racing runs of one table: a backfill of ``--racing-intervals`` (6) hourly intervals started at once
against the same runs one after another, each a whole ``airflow-eo ingest`` command on spark-submit
(Spark tasks).

The racing runs take turns on the table's lease before they plan (airflow_eo.table.lease): no run
starts a Spark job only to lose its commit, so the racing backfill should cost about what the
one-after-another one costs (target: at most 1.2 times its wall time). Each side ingests into a
fresh table and is checked: one batch per interval committed, every record once, every attempt
committed (no Spark job of a loser). The sides alternate which goes first.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

from confluent_kafka import Producer

import bench_kafka
from airflow_eo.attempt import Env, Secrets
from airflow_eo.demo.broker import EmbeddedBroker
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from bench_paths import AIRFLOW_EO, SPARK_TASKS

TOPIC = "bench-racing"
HOUR_MS = 3_600_000


def load(kafka_config: dict, records: int, partitions: int, value_bytes: int, intervals: int) -> int:
    """``records`` stamped evenly over ``intervals`` hours that ended an hour ago, then one record per
    partition after them (which closes the last interval); returns the first hour's start (ms)."""
    base = (int(time.time() * 1000) // HOUR_MS - intervals - 1) * HOUR_MS
    producer = Producer({**kafka_config, "linger.ms": 20, "enable.idempotence": True})
    value = b"x" * value_bytes
    step = intervals * HOUR_MS / records
    for i in range(records):
        bench_kafka.produce(producer, TOPIC, value=value, partition=i % partitions, timestamp=base + int(i * step))
        if i % 10_000 == 0:
            producer.poll(0)
    for p in range(partitions):
        producer.produce(TOPIC, value=value, partition=p, timestamp=base + intervals * HOUR_MS + 1)
    producer.flush(120)
    return base


def command(table_uri: str, base: int, hour: int, master: str) -> list[str]:
    start = base + hour * HOUR_MS
    return [AIRFLOW_EO, "ingest", "--table", table_uri, "--ingest-id", "bench", "--topics", TOPIC,
            "--run-key", f"bench/{os.path.basename(table_uri)}/{hour}", "--interval-start", str(start),
            "--interval-end", str(start + HOUR_MS), "--json", *SPARK_TASKS, "--master", master,
            "--conf", "spark.ui.enabled=false"]


def side(table_uri: str, base: int, intervals: int, kafka_config: dict, master: str, at_once: bool) -> float:
    """The runs of ``intervals`` hours into a fresh table, at once or one after another: wall seconds (checked)."""
    env = {**os.environ, **Secrets(kafka_config).to_env(), Env.SPARK_LOCAL_IP: "127.0.0.1"}
    started = time.perf_counter()
    outputs = []
    if at_once:
        processes = [subprocess.Popen(command(table_uri, base, h, master), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for h in range(intervals)]
        for process in processes:
            out, err = process.communicate()
            outputs.append((process.returncode, out, err))
    else:
        for h in range(intervals):
            done = subprocess.run(command(table_uri, base, h, master), env=env, capture_output=True, text=True)
            outputs.append((done.returncode, done.stdout, done.stderr))
    seconds = time.perf_counter() - started
    failed = [err[-2000:] for code, _, err in outputs if code != 0]
    if failed:
        raise RuntimeError(f"{'racing' if at_once else 'sequential'} run failed:\n{failed[0]}")
    statuses = [json.loads(out.strip().splitlines()[-1])["status"] for _, out, _ in outputs]
    markers = StagingArea(TableLocation.of(table_uri)).markers()
    if statuses != ["committed"] * intervals or len(markers) != intervals or not all(m.committed for m in markers):
        raise RuntimeError(f"expected {intervals} committed runs and attempts: {statuses}, "
                           f"{[(m.batch, m.committed) for m in markers]}")
    return seconds


def rows_of(table_uri: str) -> int:
    return sum(b.meta.rows for b in Ledger.open(table_uri).batches("bench", limit=None))


def run(bench, say) -> dict:
    """Interleaved repetitions of both sides; the racing/sequential ratio of the medians."""
    a = bench.args
    bench.broker = EmbeddedBroker(data_dir=tempfile.mkdtemp(prefix="broker-", dir=bench.work)).start()
    try:
        bench_kafka.create_topic(bench.broker.config, TOPIC, a.partitions)
        say(f"racing: loading {a.racing_records:,} records over {a.racing_intervals} hours")
        base = load(bench.kafka_config, a.racing_records, a.partitions, a.record_bytes - 12, a.racing_intervals)
        times: dict[str, list[float]] = {"sequential": [], "racing": []}
        for rep in range(a.repetitions):
            for name in (("sequential", "racing") if rep % 2 == 0 else ("racing", "sequential")):
                uri = bench.fresh(f"racing-{name}")
                seconds = side(uri, base, a.racing_intervals, bench.kafka_config, a.master, at_once=name == "racing")
                if rows_of(uri) != a.racing_records:
                    raise RuntimeError(f"{name}: {rows_of(uri)} rows, expected {a.racing_records}")
                times[name].append(seconds)
                bench.record(f"racing.{name}", seconds)
                say(f"rep {rep + 1}/{a.repetitions}: {a.racing_intervals} intervals {name}: {seconds:.1f}s")
    finally:
        bench.stop_broker()
    return {"intervals": a.racing_intervals, "records": a.racing_records, "seconds": times}
