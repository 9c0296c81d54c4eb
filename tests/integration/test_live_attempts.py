"""A batch slower than ``staging_grace_seconds`` is not taken for dead by another host's run.

Another host is a real one as far as the rule can tell: the orphan collector runs in a UTS namespace
of its own (``unshare --uts``, hostname ``worker-2``), so the attempt's marker names a host it cannot
check processes on, and only time (the grace, or the attempt's heartbeat) can tell. The batch runs
as Spark tasks through real spark-submit: its JVM alone outlasts a grace of 2 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from airflow_eo.cli import main
from tests.delta_tables import duckdb_rows
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce, read_table

COLLECTOR = textwrap.dedent("""
    import os, sys, time
    from airflow_eo.table.staging import collect_orphans
    table, stop = sys.argv[1], sys.argv[2]
    removed = []
    while not os.path.exists(stop):
        removed += collect_orphans(table, None, grace_seconds=2)
        time.sleep(0.1)
    print(",".join(removed))
""")


def test_a_slow_batch_on_another_host_keeps_its_staged_files_and_commits_them(kafka_config, tmp_path, capsys):
    topic, table, stop = new_topic(kafka_config, 2), str(tmp_path / "slow"), tmp_path / "stop"
    produce(kafka_config, topic, 200, partitions=2)
    (tmp_path / "slow").mkdir()
    collector = subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", 'hostname worker-2 && exec "$0" -c "$1" "$2" "$3"', sys.executable,
         COLLECTOR, table, str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        code = main(["ingest", "--table", table, "--ingest-id", "slow", "--topics", topic, "--json",
                     "--bootstrap-servers", kafka_config["bootstrap.servers"], "--master", "local[1]",
                     "--conf", "spark.ui.enabled=false", "--driver-read-max-offsets", "0",
                     "--staging-grace-seconds", "2"])
        result = json.loads(capsys.readouterr().out) if code == 0 else None
    finally:
        stop.touch()
        removed = collector.communicate(timeout=60)[0].strip()
    assert collector.returncode == 0
    assert code == 0 and result is not None and result["seconds"] > 2, "the batch was not slower than the grace"
    assert removed == "", f"another host's run collected a live attempt's files: {removed}"
    # what was committed is readable, by our reader and by an independent one
    rows = read_table(table)
    assert duplicates(rows) == {} and set(keys_of(rows)) == set(broker_records(kafka_config["bootstrap.servers"], topic))
    assert duckdb_rows(table, "SELECT count(*) FROM t") == [(200,)]
