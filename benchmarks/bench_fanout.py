"""Fan-out and routing: one ingest into several tables against the ingests it replaces.

Every side is a whole ``airflow-eo ingest`` command on one warm Spark Connect server
(``airflow-eo connect-server``, ``--remote``; one batch on it not counted, so every measured
batch is a steady one), into fresh tables, and each is paired with one plain confluent-kafka
consumer (read_committed, every partition assigned, counting) timed **right before it** on the
same records. The sides alternate which goes first (A B C, C B A, ...).

* **fanout** (``--fanout-records``, 1M by default, of ~``--record-bytes`` JSON values; each key
  has 10 records, in one partition): one ``ingest --spec FILE`` into three tables, a raw append,
  a projected append (``transform_sql``) and a merge by key (the current row per key), against
  one append of the same records (the raw append alone; target: at most 1.5 times its time),
  with the three tables' own ``airflow-eo ingest`` commands one after another reported beside.
* **routing** (``--routing-topics`` × ``--routing-records``, 8 × 150,000 by default): one
  ``ingest --spec FILE`` whose table URI holds ``{topic}`` and whose source is a
  ``topic_pattern`` matching the topics, one table per topic; the ratio is the plain consumer
  reading all the topics / the whole command (target: at least 0.8), with the topics' own
  ``ingest --remote`` commands started at once on the same server beside it.

Each command's committed counts are checked against what was produced (every table's rows, the
merge table's keys).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

import bench_kafka
from airflow_eo.demo.broker import EmbeddedBroker
from airflow_eo.core.offsets import OffsetRange
from bench_paths import AIRFLOW_EO, SQL, ServerCommand, _row, command_env, pairs_summary, raw_single_consumer

FANOUT_TOPIC = "bench-fanout"
ROUTE_PREFIX = "bench-route-"
INGEST_ID = "bench"
RECORDS_PER_KEY = 10  # the merge table keeps one row per key: a tenth of the records
KINDS = ("order", "payment", "refund", "shipment")
# the projected append: two columns of the value and the record's time (plus the offsets it must keep)
PROJECTED_SQL = ("SELECT CAST(key AS STRING) AS id, get_json_object(CAST(value AS STRING), '$.kind') AS kind, "
                 "timestamp, topic, partition, offset FROM source")
# the merge: the current value per key; it keeps the change column (docs/how-to/upserts.md)
MERGE_SQL = ("SELECT CAST(CAST(key AS STRING) AS BIGINT) AS id, CAST(value AS STRING) AS body, "
             "topic, partition, offset, _airflow_eo_change FROM source")
# the few options these commands use, as flags of a single-table `airflow-eo ingest`
FLAGS = {"table_uri": "--table", "ingest_id": "--ingest-id", "topics": "--topics", "transform_sql": "--transform-sql",
         "write_mode": "--write-mode", "merge_key": "--merge-key"}


# -- the commands ------------------------------------------------------------------------------

def flags(options: dict) -> list[str]:
    """A single-table ``airflow-eo ingest`` of ``options`` (the operator's argument names), as flags."""
    out = []
    for name, value in options.items():
        out += [FLAGS[name], ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    return out


def spec_file(spec: dict, directory: str) -> str:
    """``spec`` written as the JSON ``airflow-eo ingest --spec FILE`` takes."""
    fd, path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, indent=1)
    return path


def command(args: list[str], server: ServerCommand) -> list[str]:
    return [AIRFLOW_EO, "ingest", *args, "--json", "--remote", server.url]


def tables_of(stdout: str) -> dict[str, dict]:
    """Each table's result in a command's ``--json`` line: a fan-out lists them under ``tables``."""
    result = json.loads(stdout.strip().splitlines()[-1])
    return {t["table_uri"]: t for t in result.get("tables", [result])}


def run_commands(commands: list[list[str]], kafka_config: dict, token: str,
                 at_once: bool) -> tuple[dict[str, dict], list[float]]:
    """The commands one after another or all started at once: every table's result (each command
    checked for success) and, one after another, each command's wall seconds."""
    env = command_env(kafka_config, token)
    seconds = []
    if at_once:
        processes = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for c in commands]
        outputs = [(p, *p.communicate()) for p in processes]
        done = [(p.returncode, out, err) for p, out, err in outputs]
    else:
        done = []
        for c in commands:
            started = time.perf_counter()
            finished = subprocess.run(c, env=env, capture_output=True, text=True)
            seconds.append(time.perf_counter() - started)
            done.append((finished.returncode, finished.stdout, finished.stderr))
    failed = [err[-3000:] for code, _, err in done if code != 0]
    if failed:
        raise RuntimeError(f"airflow-eo ingest failed:\n{failed[0]}")
    return {uri: table for _, out, _ in done for uri, table in tables_of(out).items()}, seconds


def check(tables: dict[str, dict], expected: dict[str, int], what: str) -> None:
    """Every expected table committed its batch with the expected count: rows of an append, new
    keys (rows inserted) of a merge into a fresh table."""
    found = {uri: (t["inserted"] if t.get("write_mode") == "merge" else t["rows"]) for uri, t in tables.items()}
    statuses = {uri: t["status"] for uri, t in tables.items()}
    if found != expected or set(statuses.values()) != {"committed"}:
        raise RuntimeError(f"{what}: committed {found} ({statuses}), expected {expected}")


# -- the data ----------------------------------------------------------------------------------

def load_events(kafka_config: dict, topic: str, records: int, partitions: int, value_bytes: int) -> list[int]:
    """``records`` JSON events, ``RECORDS_PER_KEY`` per key, each key in one partition (as a
    producer keyed by the entity sends them); the records per partition."""
    from confluent_kafka import Producer

    producer = Producer({**kafka_config, "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True})
    keys = max(1, records // RECORDS_PER_KEY)
    counts = [0] * partitions
    for i in range(records):
        key = i % keys
        head = json.dumps({"kind": KINDS[i % len(KINDS)], "n": i, "pad": ""})[:-2]
        value = (head + "x" * max(0, value_bytes - len(head) - 2) + '"}').encode()
        bench_kafka.produce(producer, topic, key=b"%012d" % key, value=value, partition=key % partitions)
        counts[key % partitions] += 1
        if i % 50_000 == 0:
            producer.poll(0)
    remaining = producer.flush(600)
    if remaining:
        raise RuntimeError(f"{remaining} records of {topic} were not delivered")
    return counts


def fanout_sinks(root: str) -> list[dict]:
    """The fan-out's three tables under ``root``: raw append, projected append, merge by key."""
    return [{"table_uri": f"{root}/append"},
            {"table_uri": f"{root}/projected", "transform_sql": PROJECTED_SQL},
            {"table_uri": f"{root}/merge", "write_mode": "merge", "merge_key": ["id"], "transform_sql": MERGE_SQL}]


# -- the parts ---------------------------------------------------------------------------------

class _Part:
    """What both parts share: a broker of their own, a warm server, and the paired measurement."""

    def __init__(self, bench, say, name: str):
        self.bench, self.say, self.name = bench, say, name
        self.pairs: dict[str, list[tuple[float, float]]] = {}

    def start_broker(self) -> None:
        self.bench.broker = EmbeddedBroker(data_dir=tempfile.mkdtemp(prefix="broker-", dir=self.bench.work)).start()

    def paired(self, side: str, ranges: list[OffsetRange], run) -> None:
        """One plain consumer of ``ranges`` right before ``run()`` (a side): both timed and recorded."""
        b = self.bench
        label = f"{self.name}.{side}"
        raw = b.load.measure(f"{label} (raw)", lambda: raw_single_consumer(b.kafka_config, ranges))["seconds"]
        started = time.perf_counter()
        b.load.measure(label, run)
        seconds = time.perf_counter() - started
        b.record(f"{label}.raw", raw)
        b.record(label, seconds)
        self.pairs.setdefault(side, []).append((raw, seconds))
        self.say(f"  {side}: raw {raw:.2f}s, whole command(s) {seconds:.2f}s")

    def summaries(self) -> dict:
        return {side: pairs_summary(pairs) for side, pairs in self.pairs.items()}


def fanout(bench, say, interleaved) -> dict:
    """The fan-out part of ``benchmarks/benchmark.py`` (see the module's docstring)."""
    a = bench.args
    part = _Part(bench, say, "fanout")
    part.start_broker()
    try:
        bench_kafka.create_topic(bench.broker.config, FANOUT_TOPIC, a.partitions)
        say(f"fanout: loading {a.fanout_records:,} JSON records of ~{a.record_bytes} bytes "
            f"({RECORDS_PER_KEY} per key) into {a.partitions} partitions")
        counts = load_events(bench.kafka_config, FANOUT_TOPIC, a.fanout_records, a.partitions, a.record_bytes - 12)
        ranges = [OffsetRange(FANOUT_TOPIC, p, 0, n) for p, n in enumerate(counts)]
        keys = max(1, a.fanout_records // RECORDS_PER_KEY)

        def expected(sinks: list[dict]) -> dict[str, int]:
            return {s["table_uri"]: keys if s.get("write_mode") == "merge" else a.fanout_records for s in sinks}

        with ServerCommand(a.master, bench.work) as server:
            def one_ingest(root: str) -> tuple[list[list[str]], list[dict]]:
                sinks = fanout_sinks(root)
                spec = {"topics": [FANOUT_TOPIC], "ingest_id": INGEST_ID, "sinks": sinks}
                return [command(["--spec", spec_file(spec, bench.work)], server)], sinks

            def one_append(root: str) -> tuple[list[list[str]], list[dict]]:
                sinks = fanout_sinks(root)[:1]
                return [command(flags({"topics": [FANOUT_TOPIC], "ingest_id": INGEST_ID, **sinks[0]}), server)], sinks

            def separate(root: str) -> tuple[list[list[str]], list[dict]]:
                sinks = fanout_sinks(root)
                return [command(flags({"topics": [FANOUT_TOPIC], "ingest_id": INGEST_ID, **s}), server)
                        for s in sinks], sinks

            sides = {"fanout": one_ingest, "append": one_append, "separate": separate}

            each: dict[str, list[float]] = {}

            def run(side: str, counted: bool = True):
                commands, sinks = sides[side](bench.fresh(f"fanout-{side}"))
                tables, seconds = run_commands(commands, bench.kafka_config, server.token, at_once=False)
                check(tables, expected(sinks), f"fanout {side}")
                if side == "separate" and counted:  # where the three ingests' time goes: each table's own
                    for sink, took in zip(sinks, seconds):
                        name = os.path.basename(sink["table_uri"])
                        bench.record(f"fanout.separate_each.{name}", took)
                        each.setdefault(name, []).append(took)

            say(f"fanout: a server ready in {server.start_seconds:.1f}s; one fan-out batch not counted (warm-up)")
            run("fanout", counted=False)
            for rep, side in interleaved(list(sides), a.repetitions):
                say(f"rep {rep + 1}/{a.repetitions}: fanout {side}")
                part.paired(side, ranges, lambda side=side: run(side))
    finally:
        bench.stop_broker()
    out: dict = {"records": a.fanout_records, "keys": keys, "partitions": a.partitions,
                 "tables": ["raw append", "projected append (transform_sql)", "merge by key"],
                 **part.summaries()}
    med = {side: out[side]["ingest_median"] for side in sides}
    out["ratios"] = {"fanout_over_append": med["fanout"] / med["append"],
                     "separate_over_append": med["separate"] / med["append"],
                     "fanout_over_separate": med["fanout"] / med["separate"]}
    if each:  # the merge table's own ingest against the append table's, each run of the same records
        out["separate_each"] = {name: statistics.median(times) for name, times in each.items()}
        out["ratios"]["merge_over_append"] = out["separate_each"]["merge"] / out["separate_each"]["append"]
    out["targets"] = {"fanout(3 tables)/append<=1.8": out["ratios"]["fanout_over_append"] <= 1.8}
    if "merge_over_append" in out["ratios"]:
        out["targets"]["merge/append<=1.5"] = out["ratios"]["merge_over_append"] <= 1.5
    return out


def routing(bench, say, interleaved) -> dict:
    """The routing part of ``benchmarks/benchmark.py`` (see the module's docstring)."""
    a = bench.args
    part = _Part(bench, say, "routing")
    topics = [f"{ROUTE_PREFIX}{i}" for i in range(a.routing_topics)]
    part.start_broker()
    try:
        say(f"routing: loading {len(topics)} topics x {a.routing_records:,} records of {a.record_bytes} bytes "
            f"({a.routing_partitions} partitions each)")
        for topic in topics:
            bench_kafka.create_topic(bench.broker.config, topic, a.routing_partitions)
            bench_kafka.load(bench.kafka_config, topic, a.routing_records, a.routing_partitions, a.record_bytes - 12,
                             progress_every=0)
        ranges = [OffsetRange(t, p, 0, len(range(p, a.routing_records, a.routing_partitions)))
                  for t in topics for p in range(a.routing_partitions)]
        # a full match of every topic of the part (and of nothing else on a broker of its own)
        pattern = f"{ROUTE_PREFIX}[0-9]+"

        with ServerCommand(a.master, bench.work) as server:
            def one_ingest(root: str) -> list[list[str]]:
                spec = {"topic_pattern": pattern, "table_uri": f"{root}/{{topic}}", "ingest_id": INGEST_ID,
                        "transform_sql": SQL}
                return [command(["--spec", spec_file(spec, bench.work)], server)]

            def at_once(root: str) -> list[list[str]]:
                return [command(flags({"topics": [t], "table_uri": f"{root}/{t}", "ingest_id": INGEST_ID,
                                       "transform_sql": SQL}), server) for t in topics]

            sides = {"one_ingest": one_ingest, "separate_at_once": at_once}

            idle: list[float] = []

            def run(side: str, counted: bool = True):
                root = bench.fresh(f"routing-{side}")
                commands = sides[side](root)
                tables, _ = run_commands(commands, bench.kafka_config, server.token,
                                         at_once=side == "separate_at_once")
                check(tables, {f"{root}/{t}": a.routing_records for t in topics}, f"routing {side}")
                if side == "one_ingest" and counted:  # the same command again: every table has nothing new
                    started = time.perf_counter()
                    again, _ = run_commands(commands, bench.kafka_config, server.token, at_once=False)
                    idle.append(time.perf_counter() - started)
                    bench.record("routing.nothing_new", idle[-1])
                    if {t["status"] for t in again.values()} != {"nothing_new"}:
                        raise RuntimeError(f"routing: a run with nothing new committed: {again}")

            say(f"routing: a server ready in {server.start_seconds:.1f}s; one routed batch not counted (warm-up)")
            run("one_ingest", counted=False)
            for rep, side in interleaved(list(sides), a.repetitions):
                say(f"rep {rep + 1}/{a.repetitions}: routing {side}")
                part.paired(side, ranges, lambda side=side: run(side))
    finally:
        bench.stop_broker()
    out: dict = {"topics": len(topics), "records_per_topic": a.routing_records, "partitions": a.routing_partitions,
                 **part.summaries()}
    if idle:
        out["nothing_new"] = {"median": statistics.median(idle), "min": min(idle), "max": max(idle), "n": len(idle)}
    many = len(topics) >= 100  # many small tables: what a table costs (docs/performance.md)
    out["targets"] = {("routing raw/command>=0.25" if many else "routing raw/command>=0.8"):
                      out["one_ingest"]["ratio"] >= (0.25 if many else 0.8)}
    if idle and many:
        out["targets"]["routing nothing new<=2s"] = out["nothing_new"]["median"] <= 2.0
    return out


# -- the report --------------------------------------------------------------------------------

def _times(summary: dict) -> str:
    return f"{summary['ingest_median']:.2f} s ({summary['ingest_min']:.2f}-{summary['ingest_max']:.2f})"


def _raw(summary: dict) -> str:
    return f"{summary['raw_median']:.2f} s ({summary['raw_min']:.2f}-{summary['raw_max']:.2f})"


def rows(results: dict) -> list[dict]:
    """The fan-out and routing rows of the report's table (the parts that ran)."""
    out = []
    if "fanout" in results:
        f = results["fanout"]
        r = f["ratios"]
        n = f"{f['records']:,}"
        out += [
            _row(f"fan-out, {n} records into 3 tables (append, projected, merge) in one ingest / one append",
                 "<= 1.8x", "1.5x", f"{r['fanout_over_append']:.2f}x ({_times(f['fanout'])} vs {_times(f['append'])})",
                 _raw(f["fanout"]), r["fanout_over_append"] <= 1.8),
            _row("fan-out, the same 3 tables as 3 ingests one after another / one append", "", "",
                 f"{r['separate_over_append']:.2f}x ({_times(f['separate'])}); one ingest / them "
                 f"{r['fanout_over_separate']:.2f}", _raw(f["separate"]), None),
        ]
        if "merge_over_append" in r:
            e = f["separate_each"]
            out.append(_row(f"merge, {n} changes over {f['keys']:,} keys, its own ingest / the append's", "<= 1.5x",
                            "1.2x", f"{r['merge_over_append']:.2f}x ({e['merge']:.2f} s vs {e['append']:.2f} s)", "",
                            r["merge_over_append"] <= 1.5))
    if "routing" in results:
        g = results["routing"]
        what = f"{g['topics']} topics x {g['records_per_topic']:,} records into {g['topics']} tables"
        one, sep = g["one_ingest"], g["separate_at_once"]
        floor = 0.25 if g["topics"] >= 100 else 0.8
        out += [
            _row(f"routing, {what}, one ingest ({{topic}}, topic_pattern): raw / whole command", f">= {floor}",
                 "0.5" if floor == 0.25 else "", f"{one['ratio']:.3f} (ingest {_times(one)})", _raw(one),
                 one["ratio"] >= floor),
            _row(f"routing, {what}, {g['topics']} ingest --remote at once: raw / wall", "", "",
                 f"{sep['ratio']:.3f} (wall {_times(sep)})", _raw(sep), None),
        ]
        if "nothing_new" in g:
            idle = g["nothing_new"]
            out.append(_row(f"routing, {what}: the same command again, nothing new in any table",
                            "<= 2 s" if g["topics"] >= 100 else "", "",
                            f"{idle['median']:.2f} s ({idle['min']:.2f}-{idle['max']:.2f}), "
                            f"{idle['median'] / g['topics'] * 1000:.0f} ms a table", "",
                            idle["median"] <= 2.0 if g["topics"] >= 100 else None))
    return out


def ratios(results: dict) -> dict:
    """The parts' ratios for the report's ratio list."""
    out = dict(results.get("fanout", {}).get("ratios", {}))
    if "routing" in results:
        g = results["routing"]
        out["routing_raw_over_one_ingest"] = g["one_ingest"]["ratio"]
        out["routing_raw_over_separate_at_once"] = g["separate_at_once"]["ratio"]
        out["routing_one_ingest_over_separate_at_once"] = (g["one_ingest"]["ingest_median"]
                                                          / g["separate_at_once"]["ingest_median"])
    return out
