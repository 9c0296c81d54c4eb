"""Smoke run of ``benchmarks/benchmark.py`` on a tiny data set: every section is measured
and its numbers are sane. Real broker, real spark-submit (three of them), real Spark Connect
servers (the warm path's, the fan-out's and the routing part's), real Delta tables.

Kept small (5,000 records, one repetition, no scaling, 10x memory or large warm batch, a 200-commit
planning table with a 5-commit tail, a 300-commit long log, 2,000 changes merged into 20,000
rows, a racing backfill of 2 intervals, a fan-out of 3,000 records, 3 routed topics of 1,000 records,
2,000 rows in each of Avro, Protobuf and JSON Schema)
so it fits a ~6 minute budget on an idle 2-core machine (the fan-out and routing parts start a
Connect server each).
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "benchmark.py"), "--records", "5000",
           "--repetitions", "1", "--scales", "1", "--memory-multiplier", "0", "--planning-commits", "200",
           "--planning-repetitions", "1", "--checkpoint-tail", "5", "--long-log-commits", "300", "--cache-dir", str(tmp_path / "cache"),
           "--small-records", "100", "--server-batches", "12", "--warm-scale", "0", "--decode-records", "2000", "--maintenance-files", "200", "--dedup-rows", "20000", "--dedup-files", "20", "--dedup-batch", "2000",
           "--maintenance-rows", "20000", "--audit-multiplier", "2",
           "--merge-rows", "20000", "--merge-changes", "2000", "--merge-files", "10",
           "--merge-spread-files", "4", "--out", str(out)]
    cmd += ["--ui-tables", "3", "--ui-commits", "120"]  # the UI page's list: 3 tables of 120 commits
    cmd += ["--racing-intervals", "2", "--racing-records", "600"]  # 2 intervals at once, then one after another
    cmd += ["--fanout-records", "3000", "--routing-topics", "3", "--routing-records", "1000"]  # one ingest, several tables
    cmd += ["--formats-records", "2000"]  # Protobuf and JSON Schema against Avro
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    print("seconds per part:", report["part_seconds"])  # shown with -rP: what to trim when the suite grows
    assert {"warm", "cold", "throughput", "fanout", "routing", "formats"} <= set(report["part_seconds"])

    times = report["times"]
    for key in ("raw_fetch", "reader_fetch", "at_least_once", "at_least_once.in_spark", "exactly_once.x1",
                "exactly_once.x1.in_spark", "committed_rerun.small_table", "planning.200.at_checkpoint",
                "planning.200.checkpoint_plus_5", "planning.long_log.300", "planning.interval_mode.new_table", "planning.offsets_mode.new_table",
                "committed_rerun.200_commits", "warm.first", "warm.first.raw", "warm.steady", "warm.steady.raw",
                "warm.small", "warm.small_spark", "warm.in_process_eo", "warm.in_process_alo", "cold.full", "cold.full.raw",
                "cold.small", "cold.small_spark",
                "unreachable_broker", "decode.json", "decode.avro", "dedup.plain", "dedup.dedup"):
        assert key in times, key
        assert 0 < times[key]["min"] <= times[key]["median"] <= times[key]["max"] < 600, (key, times[key])
    # a Spark run costs at least the JVM start; a committed rerun starts no Spark at all
    assert times["exactly_once.x1"]["median"] > times["committed_rerun.small_table"]["median"]
    assert times["at_least_once.in_spark"]["median"] < times["at_least_once"]["median"]

    ratios = report["ratios"]
    assert ratios["eo_over_alo"] > 0 and ratios["raw_rate_records_per_s"] > 0
    assert ratios["decode_avro_rate_over_json_rate"] > 0
    assert set(report["targets"]) >= {"eo_over_alo<=1.03", "eo_rate/raw>=0.70", "committed_rerun<=3s"}
    build = report["planning_tables"]["200"]
    assert build["commits"] == 200 and build["checkpoints"] >= 1  # delta-rs checkpoints by itself
    assert report["machine"]["cpus"] >= 1
    # the warm path: no JVM start per batch, and the server's memory was sampled after 10 and 12 batches
    assert times["warm.small"]["median"] < times["cold.small"]["median"]
    assert set(report["warm_server_pss_mb"]) == {"after_10", "after_12"}
    # the paths' table: every row of docs/performance.md's first table but the large batch (--warm-scale 0)
    rows = {row["metric"]: row for row in report["rows"]}
    targets = {metric: row for metric, row in rows.items() if row["must"]}
    assert len(targets) == 11 and all(row["met"] in (True, False) for row in targets.values())
    # beside them, without a target: the small batches run as Spark tasks (the driver reads them otherwise),
    # the fan-out's tables as ingests of their own and the routed topics' ingests started at once
    assert {metric for metric, row in rows.items() if row["met"] is None} == {
        *(f"{path}, 100-record batch as Spark tasks (--driver-read-max-offsets 0)" for path in ("warm", "cold")),
        "fan-out, the same 3 tables as 3 ingests one after another / one append",
        "routing, 3 topics x 1,000 records into 3 tables, 3 ingest --remote at once: raw / wall",
        "routing, 3 topics x 1,000 records into 3 tables: the same command again, nothing new in any table",
        *(m for m in rows if m.startswith("JSON Schema, 2,000 rows"))}
    assert rows["warm, 5,000 records, steady state: raw / whole command"]["raw"]  # the raw time beside the ratio
    # the first batch starts when the fresh server's ready file appears (what a deployment's restart sees)
    assert "warm, first 5,000-record batch from ready (a fresh server's ready file) / steady batch" in targets
    assert "unreachable broker, until the error" in done.stdout and "[raw " in done.stdout
    assert report["other_load"] and "load average at the end" in done.stdout
    assert "exactly_once.x1" in done.stdout  # the printed table
    maintenance = report["maintenance"]  # 200 files of 100 rows compacted into one, read before and after
    assert maintenance["rows"] == 20000 and maintenance["files_after"] == 1
    assert maintenance["compaction"]["numFilesRemoved"] == 200 and maintenance["peak_rss_mb"] > 0
    assert maintenance["read_speedup"] > 0 and "read_after_compaction>=5x_faster" in report["targets"]
    audit = report["audit"]  # the audit against the ingest of the same 5,000 records, per path, and its memory
    assert {"audit.local.ingest", "audit.local.audit", "audit.local_spark.audit", "audit.connect.ingest",
            "audit.connect.audit", "audit.connect_spark.audit", "audit.raw_single_consumer"} <= set(times)
    assert audit["ratios"]["connect_audit_over_ingest"] > 0 and set(audit["memory"]) == {"in_process", "local_spark"}
    assert audit["memory"]["in_process"]["x2"]["records"] == 10000 and audit["memory_growth"]["in_process"] > 0
    merge = report["merge"]  # 2,000 changes into 20,000 rows z-ordered into ~10 files, both distributions
    for key in ("merge.recent_heavy.append", "merge.recent_heavy.merge", "merge.uniform.merge"):
        assert 0 < times[key]["median"] < 600, key
    recent, uniform = merge["distributions"]["recent_heavy"], merge["distributions"]["uniform"]
    # racing runs of one table (each side checked by the part: every run committed, every record once)
    assert 0 < times["racing.racing"]["median"] < 600 and 0 < times["racing.sequential"]["median"] < 600
    assert ratios["racing_over_sequential"] > 0 and "racing/sequential<=1.2" in report["targets"]
    assert report["racing"]["intervals"] == 2 and report["racing"]["records"] == 600
    assert recent["inserted"] == 200 and recent["deleted"] > 0 and uniform["files_rewritten"] == uniform["files_before"]
    assert recent["files_rewritten"] < recent["before_z_order"]["files_rewritten"]  # z-ordering narrowed it
    assert "merge/append<=3x(recent_heavy)" in report["targets"]
    for key in ("ui.list_first_view", "ui.list", "ui.table_page_first_view", "ui.table_page"):  # through Airflow's app
        assert 0 < times[key]["min"] <= times[key]["max"] < 600, (key, times[key])
    assert report["ui"]["tables"] == 3 and "ui_list_3x120<1s" in report["targets"]
    # one ingest into several tables (each side checked by the part: every table's rows, the merge table's keys)
    for key in ("fanout.fanout", "fanout.append", "fanout.separate", "routing.one_ingest", "routing.separate_at_once"):
        assert 0 < times[key]["median"] < 600 and 0 < times[f"{key}.raw"]["median"] < 600, key
    assert report["fanout"]["records"] == 3000 and report["fanout"]["keys"] == 300
    assert ratios["fanout_over_append"] > 0 and ratios["routing_raw_over_one_ingest"] > 0
    assert ratios["merge_over_append"] > 0 and 0 < times["routing.nothing_new"]["median"] < 600
    assert {"fanout(3 tables)/append<=1.8", "merge/append<=1.5", "routing raw/command>=0.8"} <= set(report["targets"])
    assert rows["fan-out, 3,000 records into 3 tables (append, projected, merge) in one ingest / one append"]["raw"]
    # Protobuf and JSON Schema against Avro through the registry (each side's rows checked by the command)
    for key in ("formats.avro", "formats.protobuf", "formats.json_schema", "formats.json_schema_unvalidated"):
        assert 0 < times[key]["median"] < 600 and 0 < times[f"{key}.raw"]["median"] < 600, key
    assert ratios["protobuf_over_avro"] > 0 and ratios["json_schema_validated_over_unvalidated"] > 0
    assert "protobuf/avro<=1.5" in report["targets"] and report["formats"]["value_bytes"]["protobuf"] > 100
