"""The cost of exactly-once: one run that measures every side on the same records.

Starts the embedded broker, loads a fixed data set and measures, interleaving repetitions
(A B C D, then D C B A, ...) so a noisy machine hits every side alike:

* raw fetch rate (confluent-kafka alone, one process per partition) and the project's reader;
* at-least-once baseline (same Spark read + Parquet write, no ledger/plan/commit);
* exactly-once run (``Ingestion(config, LocalSparkSubmit()).run``), at 1x, 2x, 4x records;
* planning latency against tables with 1,000 and 10,000 commits over 100 partitions, and at
  100,000 commits (``--long-log-commits``; built with deltalake's own commits, ``bench_ledger``);
* committed rerun (already-committed run key: no Spark);
* peak memory (PSS) of the Spark process tree for a run ``--memory-multiplier`` times larger;
* the warm and cold paths (``bench_paths``, ``--only warm``, ``--only cold``): whole
  ``airflow-eo ingest`` commands — on a fresh ``airflow-eo connect-server`` (its first batch,
  steady batches, a small batch, the exactly-once overhead, a larger batch's time per million and
  the server's memory) and through spark-submit — each 1M batch paired with one plain consumer
  timed right before it; an unreachable broker; what else loaded the machine during each step;
* decoding (``bench_decode``): the same nested records as Avro (Schema Registry wire format,
  fastavro in the tasks) and as JSON (Spark's ``from_json``), each one exactly-once ingest;
* dedup by key (``bench_dedup``): one batch with ``dedup_key`` and a one-day horizon against the
  same batch without, into copies of a 10M-row table;
* maintenance (``bench_maintenance``): reading a table of 10k small batch files before and
  after ``maintain``'s compaction, and the compaction's wall time and peak memory;
* the audit (``bench_audit``): auditing the table against ingesting it on the same Spark path,
  and the audit's peak memory at 1x and ``--audit-multiplier`` x the records;
* the UI page (``bench_ui``): the table list of 50 tables of 10,000 commits each through
  Airflow's API app, its first view and the views after it;
* merge by key (``bench_merge``): 100,000 changes (10 % deletes) merged into a 10M-row table
  against the same batch appended, recent-heavy and uniform keys, files rewritten after
  ``maintain --z-order``;
* shared tables (``bench_shared``): the 1x batch into a table with CHECK constraints and a NOT NULL
  column against the same batch without them, and a merge batch into a table with the change data
  feed on against the same batch without it;
* racing runs (``bench_racing``): a backfill of 6 hourly intervals of one table started at once
  against the same 6 ``airflow-eo ingest`` commands one after another (spark-submit);
* fan-out and routing (``bench_fanout``, warm server, whole commands, each after one plain consumer):
  1M records into three tables (append, projected append, merge) in one ``ingest --spec`` against one
  append of them and against the three tables' own ingests; 8 topics x 150,000 records routed into
  a table per topic (``{topic}``, ``topic_pattern``) in one ingest against 8 ingests started at once;
* formats (``bench_formats``, warm server, whole commands, each after one plain consumer): 1M rows as
  Protobuf against the same rows as Avro through the Schema Registry (target: at most 1.5 times Avro's
  time), and as JSON Schema with validation on against off.

Prints the paths' table (raw time beside each ratio, warnings when the machine was busy), then
medians and min-max of everything, and writes the same as JSON (``--out``)::

    .venv/bin/python benchmarks/benchmark.py                       # full default run
    .venv/bin/python benchmarks/benchmark.py --records 5000 --repetitions 1 \\
        --planning-commits 200 --memory-multiplier 0                # smoke run
    .venv/bin/python benchmarks/benchmark.py --only warm            # the warm-path part alone (./dev bench --only warm)
    .venv/bin/python benchmarks/benchmark.py --only cold            # spark-submit and the unreachable broker
    .venv/bin/python benchmarks/benchmark.py --only racing --racing-records 6000 --repetitions 1  # racing, small
    .venv/bin/python benchmarks/benchmark.py --only fanout --only routing --fanout-records 20000 \\
        --routing-topics 3 --routing-records 5000 --repetitions 1        # fan-out and routing, small
    .venv/bin/python benchmarks/benchmark.py --only formats --formats-records 20000 --repetitions 1  # formats, small
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402

import bench_kafka  # noqa: E402
import bench_ledger  # noqa: E402
import bench_memory  # noqa: E402
import bench_spark  # noqa: E402
import bench_decode  # noqa: E402
import bench_dedup  # noqa: E402
import bench_maintenance  # noqa: E402
import bench_audit  # noqa: E402
import bench_merge  # noqa: E402
import bench_shared  # noqa: E402
import bench_paths  # noqa: E402
import bench_racing  # noqa: E402
import bench_ui  # noqa: E402
import bench_fanout  # noqa: E402
import bench_formats  # noqa: E402
from bench_report import print_table, ratios, summary, targets  # noqa: E402
from airflow_eo.demo.broker import EmbeddedBroker  # noqa: E402
from airflow_eo.driver.session import classic_process  # noqa: E402
from airflow_eo.core.offsets import Interval, OffsetRange  # noqa: E402
from airflow_eo.submit.spark_submit import LocalSparkSubmit  # noqa: E402

DATA_TOPIC = "bench-data"
# The parts, in the order a full run takes them: each a method of Bench (a new part is a method and a name here)
PARTS = ["warm", "cold", "throughput", "planning", "memory", "decode", "dedup", "maintenance", "ui", "audit", "merge",
         "shared", "racing", "fanout", "routing", "formats"]


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def interleaved(steps: list, repetitions: int):
    """ABCD, DCBA, ABCD, ...: each side runs early and late equally often."""
    for rep in range(repetitions):
        for step in (steps if rep % 2 == 0 else steps[::-1]):
            yield rep, step


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000, help="default data set size (1x)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--record-bytes", type=int, default=200, help="key (12 bytes) + value")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--scales", default="1,2,4", help="exactly-once run sizes, multiples of --records")
    p.add_argument("--planning-commits", default="1000,10000")
    p.add_argument("--planning-partitions", type=int, default=100)
    p.add_argument("--planning-repetitions", type=int, default=5)
    p.add_argument("--long-log-commits", type=int, default=100_000,
                   help="planning at a table of this many commits (with checkpoints); 0 skips")
    p.add_argument("--checkpoint-tail", type=int, default=99,
                   help="all-partition commits added past the last checkpoint (99 = the worst case)")
    p.add_argument("--memory-multiplier", type=int, default=10, help="0 skips the large run")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--small-records", type=int, default=1000, help="the small batch of the warm/cold comparison")
    p.add_argument("--server-batches", type=int, default=500, help="small batches for the server memory check")
    p.add_argument("--decode-records", type=int, default=1_000_000, help="records of the Avro/JSON decode run")
    p.add_argument("--maintenance-files", type=int, default=10_000, help="small files of the maintenance table")
    p.add_argument("--maintenance-rows", type=int, default=1_000_000, help="rows of the maintenance table")
    p.add_argument("--ui-tables", type=int, default=50, help="tables of the UI page's list")
    p.add_argument("--ui-commits", type=int, default=10_000, help="commits of each of them")
    p.add_argument("--audit-multiplier", type=int, default=4, help="the audit's memory check: table size multiple")
    p.add_argument("--only", choices=PARTS, action="append", help="run only these parts (repeatable; default: all)")
    p.add_argument("--warm-scale", type=int, default=10,
                   help="the warm path's large batch, a multiple of --records (time per million, server memory); 0 skips")
    p.add_argument("--dedup-rows", type=int, default=10_000_000, help="rows of the table dedup checks against")
    p.add_argument("--dedup-files", type=int, default=100)
    p.add_argument("--dedup-batch", type=int, default=200_000, help="records of the measured batch")
    p.add_argument("--merge-rows", type=int, default=10_000_000, help="rows of the table the merge batch changes")
    p.add_argument("--merge-changes", type=int, default=100_000, help="records of the measured merge batch")
    p.add_argument("--merge-delete-share", type=float, default=0.1)
    p.add_argument("--merge-files", type=int, default=100, help="files of the merge table after z-ordering")
    p.add_argument("--merge-spread-files", type=int, default=20, help="files the merge table is built in")
    p.add_argument("--shared-merge-rows", type=int, default=1_000_000, help="rows of the change-data-feed merge table")
    p.add_argument("--shared-merge-changes", type=int, default=100_000, help="records of its merge batch")
    p.add_argument("--racing-intervals", type=int, default=6, help="hourly intervals of the racing part's backfill")
    p.add_argument("--racing-records", type=int, default=600_000, help="records of all the racing part's intervals")
    p.add_argument("--fanout-records", type=int, default=1_000_000,
                   help="records the fan-out part ingests into three tables (10 per key)")
    p.add_argument("--routing-topics", type=int, default=8, help="topics (and tables) of the routing part")
    p.add_argument("--routing-records", type=int, default=150_000, help="records of each routed topic")
    p.add_argument("--routing-partitions", type=int, default=4, help="partitions of each routed topic")
    p.add_argument("--formats-records", type=int, default=1_000_000,
                   help="rows of the formats part (each as Avro, Protobuf and JSON Schema)")
    p.add_argument("--out", default="bench-results/benchmark.json")
    p.add_argument("--cache-dir", default="bench-results/cache", help="built planning tables (reused)")
    return p.parse_args(argv)


class Bench:
    def __init__(self, args: argparse.Namespace, work: str):
        self.args, self.work = args, work
        self.submitter = LocalSparkSubmit(master=args.master)  # the settings both sides share
        self.times: dict[str, list[float]] = {}
        self.results: dict = {}
        self.broker: EmbeddedBroker | None = None
        self.counter = 0
        self.load = bench_paths.Load()  # what else ran on the machine during each timed step

    # -- helpers ---------------------------------------------------------------------
    @property
    def kafka_config(self) -> dict:
        return {**self.broker.config, **bench_kafka.CLIENT_EXTRA}

    def fresh(self, name: str) -> str:
        self.counter += 1
        return os.path.join(self.work, f"{name}-{self.counter}")

    def record(self, key: str, value: float | None) -> None:
        if value is not None:
            self.times.setdefault(key, []).append(value)

    def start_broker(self, topic: str, records: int) -> None:
        self.broker = EmbeddedBroker(data_dir=tempfile.mkdtemp(prefix="broker-", dir=self.work)).start()
        bench_kafka.create_topic(self.broker.config, topic, self.args.partitions)
        say(f"loading {records:,} records of {self.args.record_bytes} bytes into {self.args.partitions} partitions")
        took = bench_kafka.load(self.broker.config, topic, records, self.args.partitions, self.args.record_bytes - 12)
        say(f"loaded in {took:.1f}s")

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.kill()  # its state is throwaway: no multi-second save of a large JSON file
            self.broker = None

    @contextlib.contextmanager
    def classic_spark(self, part: str):
        """A broker of the part's own and a classic local SparkSession, both stopped after it (the
        warm part's Connect client marked this process: these parts run classic Spark)."""
        from airflow_eo.driver.session import build_session

        classic_process()
        self.broker = EmbeddedBroker(data_dir=tempfile.mkdtemp(prefix="broker-", dir=self.work)).start()
        spark = build_session(f"airflow-eo bench {part}", {"spark.master": self.args.master,
                                                           "spark.ui.enabled": "false",
                                                           "spark.ui.showConsoleProgress": "false"})
        try:
            yield spark
        finally:
            spark.stop()
            self.stop_broker()

    # -- 1-3 and 6: fetch, at-least-once, exactly-once, scaling ------------------------
    def throughput(self) -> None:
        a = self.args
        scales = [int(s) for s in a.scales.split(",")]
        self.start_broker(DATA_TOPIC, a.records * max(scales))
        ranges = {s: bench_spark.planned_ranges(bench_spark.eo_config(self.fresh("probe"), DATA_TOPIC,
                                                                       self.kafka_config, a.records * s))
                  for s in scales}
        steps = [("raw_fetch", 1), ("reader_fetch", 1), ("at_least_once", 1)] + [("exactly_once", s) for s in scales]
        last_eo = None
        for rep, (side, scale) in interleaved(steps, a.repetitions):
            say(f"rep {rep + 1}/{a.repetitions}: {side} x{scale} ({a.records * scale:,} records)")
            if side in ("raw_fetch", "reader_fetch"):
                out = bench_kafka.fetch_rate(self.kafka_config, ranges[scale], "bare" if side == "raw_fetch" else "reader")
                self.record(side, out["seconds"])
            elif side == "at_least_once":
                out = bench_spark.run_alo(self.submitter, self.kafka_config, ranges[scale], self.fresh("alo"),
                                          self.fresh("events"))
                self.record(side, out["seconds"])
                self.record(side + ".in_spark", out["in_spark_seconds"])
                self.record(side + ".spark_jobs", out["spark_jobs_seconds"])
            else:
                config = bench_spark.eo_config(self.fresh("eo"), DATA_TOPIC, self.kafka_config, a.records * scale)
                out, result = bench_spark.run_eo(a.master, {k: v for k, v in self.submitter.conf.items()},
                                                 config, self.fresh("events"))
                if out["rows"] != a.records * scale:
                    raise RuntimeError(f"exactly-once run committed {out['rows']} rows, expected {a.records * scale}")
                self.record(f"exactly_once.x{scale}", out["seconds"])
                self.record(f"exactly_once.x{scale}.in_spark", out["in_spark_seconds"])
                self.record(f"exactly_once.x{scale}.spark_jobs", out["spark_jobs_seconds"])
                last_eo = (config, result.run_key)
            say(f"  {out['seconds']:.2f}s" + (f" (in Spark {out['in_spark_seconds']:.2f}s)"
                                             if out.get("in_spark_seconds") else ""))
        # 5: committed rerun of the last exactly-once run (a one-commit table)
        for _ in range(a.repetitions):
            self.record("committed_rerun.small_table",
                        bench_spark.committed_rerun(*last_eo, {self.broker.process.pid})["seconds"])
        self.stop_broker()

    # -- 4, 5 and 6: planning and committed rerun on many-commit tables -----------------
    def planning(self) -> None:
        a = self.args
        commit_counts = [int(c) for c in a.planning_commits.split(",")]
        per_partition = bench_ledger.records_needed(max(*commit_counts, a.long_log_commits) + a.checkpoint_tail,
                                                    a.planning_partitions)
        self.broker = EmbeddedBroker(data_dir=tempfile.mkdtemp(prefix="broker-", dir=self.work)).start()
        bench_kafka.create_topic(self.broker.config, bench_ledger.PLANNING_TOPIC, a.planning_partitions)
        bench_kafka.load(self.broker.config, bench_ledger.PLANNING_TOPIC, per_partition * a.planning_partitions,
                         a.planning_partitions, 8, progress_every=0)
        tables, builds = {}, {}
        for commits in commit_counts:
            say(f"planning table with {commits:,} commits x {a.planning_partitions} partitions (cached in {a.cache_dir})")
            cached, builds[commits] = bench_ledger.cached_table(a.cache_dir, commits, a.planning_partitions)
            tables[commits] = self.fresh(f"planning-{commits}")
            shutil.copytree(cached, tables[commits])
        tail = f"checkpoint_plus_{a.checkpoint_tail}"
        for position in ("at_checkpoint", tail):
            if position == tail:
                for commits in commit_counts:
                    say(f"adding {a.checkpoint_tail} all-partition commits past the checkpoint of the {commits:,} table")
                    bench_ledger.extend_table(tables[commits], bench_ledger.PLANNING_TOPIC, a.planning_partitions,
                                              commits, a.checkpoint_tail, bench_ledger.RERUN_KEY)
            for _, commits in interleaved(commit_counts, a.planning_repetitions):
                ingestion = bench_ledger.planning_ingestion(tables[commits], bench_ledger.PLANNING_TOPIC,
                                                            self.broker.config, LocalSparkSubmit())
                seconds, _ = bench_ledger.time_plan(ingestion, "bench-plan-probe")
                self.record(f"planning.{commits}.{position}", seconds)
        for _, commits in interleaved(commit_counts, a.planning_repetitions):
            config = bench_ledger.planning_ingestion(tables[commits], bench_ledger.PLANNING_TOPIC,
                                                     self.broker.config, None).config
            self.record(f"committed_rerun.{commits}_commits",
                        bench_spark.committed_rerun(config, bench_ledger.RERUN_KEY, {self.broker.process.pid})["seconds"])
        if a.long_log_commits:
            say(f"planning at {a.long_log_commits:,} commits (with checkpoints; cached in {a.cache_dir})")
            cached, builds["long_log"] = bench_ledger.cached_table(a.cache_dir, a.long_log_commits,
                                                                   a.planning_partitions, long_log=True)
            ingestion = bench_ledger.planning_ingestion(cached, bench_ledger.PLANNING_TOPIC, self.broker.config, None)
            for _ in range(a.planning_repetitions):
                self.record(f"planning.long_log.{a.long_log_commits}", bench_ledger.time_plan(ingestion, "probe")[0])
        # interval mode's planning against offset mode's, same topic, a new table: what the
        # timestamp lookups (ListOffsets by time for both ends) add to a run
        say("interval planning against offset planning (new table, same topic)")
        now_ms = int(time.time() * 1000)
        interval = Interval(now_ms - 2 * 3_600_000, now_ms - 3_600_000)  # closed: the topic's records are newer
        modes = {mode: bench_ledger.planning_ingestion(self.fresh(f"interval-{mode}"), bench_ledger.PLANNING_TOPIC,
                                                       self.broker.config, None, mode=mode)
                 for mode in ("offsets", "interval")}
        for _, mode in interleaved(list(modes), a.planning_repetitions):
            self.record(f"planning.{mode}_mode.new_table",
                        bench_ledger.time_plan(modes[mode], "probe", interval if mode == "interval" else None)[0])
        self.results["planning_tables"] = builds
        self.stop_broker()

    # -- 7: peak memory --------------------------------------------------------------
    def memory(self) -> None:
        a = self.args
        if a.memory_multiplier <= 0:
            return
        big = a.records * a.memory_multiplier
        self.start_broker(DATA_TOPIC, big)
        peaks = {}
        for multiple, records in ((1, a.records), (a.memory_multiplier, big)):
            config = bench_spark.eo_config(self.fresh("eo-mem"), DATA_TOPIC, self.kafka_config, records)
            say(f"peak memory: exactly-once run of {records:,} records")
            with bench_memory.TreeRss(exclude={self.broker.process.pid}) as rss:
                out, _ = bench_spark.run_eo(a.master, self.submitter.conf, config, self.fresh("events"))
            peaks[f"x{multiple}"] = {"records": records, "seconds": out["seconds"],
                                     "peak_pss_mb": {k: v / 2**20 for k, v in rss.peak.items()}}
            say(f"  {out['seconds']:.1f}s, peak PSS {rss.peak['total'] / 2**20:.0f} MB")
        self.results["memory"] = peaks
        self.stop_broker()


    # -- the warm path (Spark Connect) and the cold path against one raw consumer (bench_paths) ----
    def ranges(self, records: int) -> list[OffsetRange]:
        a = self.args
        return [OffsetRange(DATA_TOPIC, p, 0, records // a.partitions) for p in range(a.partitions)]

    def tail(self, records: int) -> dict[int, int]:
        """Where the newest ``records`` of the --records data topic start, per partition: the small
        batch is what a table that keeps up reads in a run. (From the topic's start, on noida-db,
        whose fetch answers with the whole rest of a partition, it would fetch the whole topic.)"""
        a = self.args
        return {p: (a.records - records) // a.partitions for p in range(a.partitions)}

    def raw_seconds(self, label: str, records: int, starts: dict[int, int] | None = None) -> float:
        """One plain consumer reading the ``records`` of the data topic an ingest of ``records``
        reads (the first ones, or from ``starts``), timed."""
        ranges = [OffsetRange(r.topic, r.partition, r.start + (starts or {}).get(r.partition, 0),
                              r.end + (starts or {}).get(r.partition, 0)) for r in self.ranges(records)]
        raw = self.load.measure(f"{label} (raw)", lambda: bench_paths.raw_single_consumer(
            self.kafka_config, ranges))["seconds"]
        self.record(f"{label}.raw", raw)
        return raw

    def paired(self, label: str, run_ingest, records: int) -> tuple[float, float]:
        """The raw consumer on the same records right before an ingest: (raw, ingest) seconds."""
        raw = self.raw_seconds(label, records)
        out = self.load.measure(label, run_ingest)
        say(f"  raw {raw:.2f}s, ingest {out['seconds']:.2f}s" + (f" {out['phases']}" if out.get("phases") else ""))
        self.record(label, out["seconds"])
        return raw, out["seconds"]

    def warm(self) -> None:
        """Each repetition on a fresh `airflow-eo connect-server`: its first 1M batch, then (in
        interleaved order) a steady 1M batch, a small batch, and the exactly-once / at-least-once pair."""
        a = self.args
        self.start_broker(DATA_TOPIC, a.records)
        out: dict = {"first_over_steady": [], "first_seconds": [], "small_seconds": [], "eo_over_alo": [],
                     "server_start_seconds": [], "small_spark_seconds": [], "small_raw_seconds": []}
        steady, phases = [], []
        steps = ["steady", "small", "small_spark", "alo_eo"]
        for rep in range(a.repetitions):
            # the first batch starts the moment the server is ready, as a deployment's would after a
            # restart: its plain consumer runs before the server starts, not between ready and the batch
            first_raw = self.raw_seconds("warm.first", a.records)
            with bench_paths.ServerCommand(a.master, self.work) as server:
                out["server_start_seconds"].append(server.start_seconds)
                say(f"rep {rep + 1}/{a.repetitions}: a fresh connect-server, ready in {server.start_seconds:.1f}s; "
                    "the first 1M batch from ready")

                def ingest(records: int, server=server, extra: tuple[str, ...] = (), starts=None):
                    return bench_paths.cli_ingest(self.fresh("eo"), DATA_TOPIC, self.kafka_config, records,
                                                  remote=server.url, token=server.token, extra=extra, starts=starts)

                took = self.load.measure("warm.first", lambda: ingest(a.records))
                first = took["seconds"]
                self.record("warm.first", first)
                say(f"  raw (before the server started) {first_raw:.2f}s, ingest {first:.2f}s {took['phases']}")
                for step in (steps if rep % 2 == 0 else steps[::-1]):
                    say(f"  {step}")
                    if step == "steady":
                        steady.append(self.paired("warm.steady", lambda: ingest(a.records), a.records))
                        out["first_over_steady"].append(first / steady[-1][1])
                        out["first_seconds"].append(first)
                    elif step == "small":
                        tail = self.tail(a.small_records)
                        out["small_raw_seconds"].append(self.raw_seconds("warm.small", a.small_records, tail))
                        small = self.load.measure("warm.small", lambda tail=tail: ingest(a.small_records, starts=tail))
                        phases.append(small["phases"])
                        out["small_seconds"].append(small["seconds"])
                        self.record("warm.small", small["seconds"])
                        say(f"  {small['seconds']:.2f}s {small['phases']}")
                    elif step == "small_spark":
                        small = self.load.measure("warm.small_spark", lambda: ingest(
                            a.small_records, extra=bench_paths.SPARK_TASKS, starts=self.tail(a.small_records)))
                        out["small_spark_seconds"].append(small["seconds"])
                        self.record("warm.small_spark", small["seconds"])
                        say(f"  {small['seconds']:.2f}s {small['phases']}")
                    else:
                        pair = ["alo", "eo"] if rep % 2 == 0 else ["eo", "alo"]
                        took = {}
                        for side in pair:
                            took[side] = self.load.measure(f"warm.{side}", lambda side=side: (
                                bench_paths.warm_at_least_once(server.url, server.token, self.kafka_config,
                                                               self.ranges(a.records), self.fresh("alo"))
                                if side == "alo" else
                                bench_paths.warm_exactly_once(server.url, server.token, self.fresh("eo"), DATA_TOPIC,
                                                              self.kafka_config, a.records)))["seconds"]
                            self.record(f"warm.in_process_{side}", took[side])
                        out["eo_over_alo"].append(took["eo"] / took["alo"])
                        say(f"  exactly-once {took['eo']:.2f}s, at-least-once {took['alo']:.2f}s")
                if rep == a.repetitions - 1 and a.server_batches:
                    say(f"server memory: {a.server_batches} small batches on one server")
                    self.results["warm_server_pss_mb"] = bench_paths.server_memory(
                        server.url, server.token, server.pid, self.work, DATA_TOPIC, self.kafka_config, a.server_batches)
        out["steady_1m"] = bench_paths.pairs_summary(steady)
        out["small_phases"] = {k: statistics.median(p[k] for p in phases if k in p) for k in phases[0]} if phases else {}
        self.stop_broker()
        if a.warm_scale > 1:
            out["scale"] = self.warm_scale(out["steady_1m"]["ingest_median"])
        self.results["warm_paths"] = out

    def warm_scale(self, steady_seconds: float) -> dict:
        """A batch of --warm-scale times --records on a warm server, --repetitions times: its time per
        million (median) against the steady batches' (``steady_seconds``, on a broker holding --records),
        and the server's peak memory against a --records batch on the same server and broker (the
        two sizes interleaved, each after one plain consumer on the same records). Not the time of
        the --records batch: noida-db answers a fetch with the whole rest of the partition, so on a
        broker holding the large set a small batch fetches as much as the large one."""
        a = self.args
        big = a.records * a.warm_scale
        self.start_broker(DATA_TOPIC, big)
        took: dict[str, list[float]] = {"1m": [], "big": []}
        raw: dict[str, list[float]] = {"1m": [], "big": []}
        peak: dict[str, float] = {}
        with bench_paths.ServerCommand(a.master, self.work) as server:
            bench_paths.cli_ingest(self.fresh("eo"), DATA_TOPIC, self.kafka_config, a.records, remote=server.url,
                                   token=server.token)  # a warm-up: every measured batch is a steady one
            for rep, label in interleaved(["1m", "big"], a.repetitions):
                records = a.records if label == "1m" else big
                raw[label].append(self.raw_seconds(f"warm.scale.{label}", records))  # the broker's own scaling
                with bench_memory.PeakPss(server.pid) as pss:
                    took[label].append(self.load.measure(f"warm.scale.{label}", lambda records=records: bench_paths.cli_ingest(
                        self.fresh("eo"), DATA_TOPIC, self.kafka_config, records, remote=server.url,
                        token=server.token))["seconds"])
                peak[label] = max(peak.get(label, 0.0), pss.peak)
                say(f"  rep {rep + 1}/{a.repetitions}: {records:,} records: {took[label][-1]:.1f}s (raw "
                    f"{raw[label][-1]:.1f}s), server peak PSS {pss.peak:.0f} MB")
        self.stop_broker()
        med = {k: statistics.median(v) for k, v in took.items()}
        return {"records": big, "seconds": med["big"], "seconds_all": took["big"], "seconds_1m": steady_seconds,
                "peak_pss_mb": peak["big"], "peak_pss_mb_1m": peak["1m"], "seconds_1m_same_broker": med["1m"],
                "per_million_ratio": (med["big"] / big) / (steady_seconds / a.records),
                "raw_seconds": statistics.median(raw["big"]),
                "raw_seconds_1m_same_broker": statistics.median(raw["1m"])}

    def cold(self) -> None:
        """spark-submit: a 1M batch (with the raw consumer right before it) and a small batch,
        interleaved; then an unreachable broker."""
        a = self.args
        self.start_broker(DATA_TOPIC, a.records)
        out: dict = {"small_seconds": [], "small_spark_seconds": [], "small_raw_seconds": [], "unreachable_seconds": []}
        full, steps = [], ["full", "small", "small_spark"]

        def ingest(records: int, extra: tuple[str, ...] = (), starts=None):
            return bench_paths.cli_ingest(self.fresh("eo"), DATA_TOPIC, self.kafka_config, records, master=a.master,
                                          extra=extra, starts=starts)

        for rep in range(a.repetitions):
            for step in (steps if rep % 2 == 0 else steps[::-1]):
                say(f"rep {rep + 1}/{a.repetitions}: cold {step}")
                if step == "full":
                    full.append(self.paired("cold.full", lambda: ingest(a.records), a.records))
                else:
                    label, extra = f"cold.{step}", bench_paths.SPARK_TASKS if step == "small_spark" else ()
                    tail = self.tail(a.small_records)
                    if step == "small":
                        out["small_raw_seconds"].append(self.raw_seconds(label, a.small_records, tail))
                    small = self.load.measure(label, lambda extra=extra, tail=tail: ingest(a.small_records, extra, tail))
                    out[f"{step}_seconds"].append(small["seconds"])
                    self.record(label, small["seconds"])
                    say(f"  {small['seconds']:.2f}s {small['phases']}")
        self.stop_broker()
        for _ in range(a.repetitions):
            took = self.load.measure("unreachable", lambda: bench_paths.unreachable_broker(self.work))
            out["unreachable_seconds"].append(took["seconds"])
            self.record("unreachable_broker", took["seconds"])
            say(f"unreachable broker: {took['seconds']:.2f}s: {took['error'][:120]}")
        out["full_1m"] = bench_paths.pairs_summary(full)
        self.results["cold_paths"] = out


    # -- decoding: Avro (registry) against JSON, same records, same path ------------------
    def decode(self) -> None:
        from airflow_eo.testing.registry import RegistryDouble

        a = self.args
        with contextlib.ExitStack() as stack:
            registry = RegistryDouble().start()
            stack.callback(registry.stop)
            spark = stack.enter_context(self.classic_spark("decode"))
            for topic in ("decode-json", "decode-avro"):
                bench_kafka.create_topic(self.broker.config, topic, a.partitions)
            say(f"loading {a.decode_records:,} nested records as JSON and as Avro")
            say(f"loaded in {bench_decode.load(self.kafka_config, registry.url, 'decode-json', 'decode-avro', a.decode_records, a.partitions):.1f}s")
            for side in ("json", "avro"):  # not counted: the JVM's first jobs compile what both sides run
                bench_decode.ingest(spark, self.kafka_config, self.fresh(f"decode-{side}"), f"decode-{side}", side,
                                    registry.url)
            for rep, side in interleaved(["json", "avro"], a.repetitions):
                out = bench_decode.ingest(spark, self.kafka_config, self.fresh(f"decode-{side}"), f"decode-{side}",
                                          side, registry.url)
                if out["rows"] != a.decode_records or out["dead_letters"]:
                    raise RuntimeError(f"decode {side}: {out}")
                self.record(f"decode.{side}", out["seconds"])
                say(f"rep {rep + 1}/{a.repetitions}: decode {side} {out['seconds']:.2f}s")
            self.results["decode_records"] = a.decode_records

    # -- dedup by key: a batch with dedup_key (one-day horizon) against the same batch without --
    def dedup(self) -> None:
        a = self.args
        with self.classic_spark("dedup") as spark:
            built = os.path.join(self.work, "dedup-table")
            say(f"building a table of {a.dedup_rows:,} rows in {a.dedup_files} files (keys over 30 days)")
            bench_dedup.build(built, a.dedup_files, a.dedup_rows, int(time.time() * 1000))
            bench_kafka.create_topic(self.broker.config, "dedup", a.partitions)
            resent = bench_dedup.recent_keys(a.dedup_rows, a.dedup_files, max(1, a.dedup_batch // 100))
            bench_dedup.load(self.kafka_config, "dedup", a.dedup_batch, a.partitions, resent)
            sides = ["plain", "dedup", "dedup_join_back"]  # join_back: the transform leaves _dedup_key out
            for rep, side in [(None, s) for s in sides] + list(interleaved(sides, a.repetitions)):
                out = bench_dedup.ingest(spark, self.kafka_config, bench_dedup.copy(built, self.fresh(f"dedup-{side}")),
                                         "dedup", side != "plain", side == "dedup_join_back")
                if rep is None:
                    continue  # not counted: the session's first jobs of each kind
                expected_dups = len(resent) if side != "plain" else 0
                if out["duplicates"] != expected_dups or out["rows"] + out["duplicates"] != a.dedup_batch:
                    raise RuntimeError(f"dedup {side}: {out}, expected {expected_dups} duplicates")
                self.record(f"dedup.{side}", out["seconds"])
                say(f"rep {rep + 1}/{a.repetitions}: {side} {out['seconds']:.2f}s ({out['duplicates']} duplicates)")
            self.results["dedup"] = {"table_rows": a.dedup_rows, "table_files": a.dedup_files,
                                     "batch_records": a.dedup_batch, "resent": len(resent), "horizon": "1d"}

    # -- maintenance: reading before / after compaction, and the compaction's cost ----------
    def maintenance(self) -> None:
        a = self.args
        self.results["maintenance"] = bench_maintenance.run(self.work, a.maintenance_files, a.maintenance_rows,
                                                            a.repetitions, say)

    # -- the UI page: the table list of --ui-tables tables of --ui-commits commits -----------
    def ui(self) -> None:
        a = self.args
        out = bench_ui.run(self.work, a.cache_dir, a.ui_tables, a.ui_commits, a.repetitions, say)
        for key in ("list", "table_page"):
            self.record(f"ui.{key}_first_view", out[f"{key}_first_view_seconds"])
            for seconds in out[f"{key}_seconds"]:
                self.record(f"ui.{key}", seconds)
        self.results["ui"] = {k: out[k] for k in ("tables", "commits", "log_files")}


    # -- the audit against the ingest of the same records, and its memory (bench_audit) -----------
    def audit(self) -> None:
        self.results["audit"] = bench_audit.run(self, say)

    # -- merge by key: a batch merged against the same batch appended (bench_merge) ------------
    def merge(self) -> None:
        with self.classic_spark("merge") as spark:
            found = bench_merge.run(self.args, self.work, self.kafka_config, spark, say, self.record, interleaved)
            self.results["merge"] = {**found, **bench_merge.ratios_and_targets(found, self.times)}

    # -- shared tables: constraints checked, a merge on a table with the change data feed ----------
    def shared(self) -> None:
        a = self.args
        with self.classic_spark("shared") as spark:
            bench_kafka.create_topic(self.broker.config, "shared-data", a.partitions)
            say(f"shared: loading {a.records:,} records of {a.record_bytes} bytes")
            bench_kafka.load(self.broker.config, "shared-data", a.records, a.partitions, a.record_bytes - 12)
            found = bench_shared.run(a, self.work, self.kafka_config, "shared-data", spark, say, self.record,
                                     interleaved)
            self.results["shared"] = {**found, **bench_shared.ratios_and_targets(self.times)}

    # -- racing runs of one table: 6 intervals at once against one after another (bench_racing) --------
    def racing(self) -> None:
        self.results["racing"] = bench_racing.run(self, say)

    # -- one ingest into several tables: fan-out and routing against the ingests they replace --------
    def fanout(self) -> None:
        self.results["fanout"] = bench_fanout.fanout(self, say, interleaved)

    def routing(self) -> None:
        self.results["routing"] = bench_fanout.routing(self, say, interleaved)

    # -- Protobuf and JSON Schema against Avro through the registry (bench_formats) --------------------
    def formats(self) -> None:
        self.results["formats"] = bench_formats.formats(self, say, interleaved)


def machine() -> dict:
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "processor": platform.processor()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = tempfile.mkdtemp(prefix="airflow-eo-bench-")
    bench = Bench(args, work)
    started, part_seconds = time.monotonic(), {}
    try:
        for part in args.only or PARTS:
            begun = time.monotonic()
            getattr(bench, part)()
            part_seconds[part] = round(time.monotonic() - begun, 1)  # where a run's (and the smoke test's) time goes
    finally:
        bench.stop_broker()
        shutil.rmtree(work, ignore_errors=True)
    r = {**ratios(bench.times, args), **bench_fanout.ratios(bench.results), **bench_formats.ratios(bench.results)}
    report = {"machine": machine(), "args": vars(args), "seconds_total": time.monotonic() - started,
              "part_seconds": part_seconds,
              "load_average_at_end": os.getloadavg(), "times": {k: summary(v) for k, v in bench.times.items()},
              "ratios": r, **bench.results}
    report["targets"] = targets(r, bench.times, bench.results)
    report["rows"] = (bench_paths.rows({**bench.results, "records": args.records, "small_records": args.small_records})
                      + bench_fanout.rows(bench.results) + bench_formats.rows(bench.results))
    # (the paths', fan-out's, routing's and formats' table: docs/performance.md)
    report["other_load"] = bench.load.steps
    report["warnings"] = bench_paths.warnings(bench.results, bench.load)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print_table(report)
    print(f"\nwritten to {args.out} ({report['seconds_total']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
