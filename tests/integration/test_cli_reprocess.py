"""``airflow-eo reprocess`` as a user runs it: real spark-submit, real broker and table.

The reprocess itself (airflow_eo.loop.reprocess) is tested in test_reprocess.py; here: the command
names a batch by run key or by its offset ranges, replaces exactly that batch's rows once, and
refuses what the operator refuses with one line, a non-zero exit and the table unchanged.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from deltalake import DeltaTable

from airflow_eo.cli import main
from airflow_eo.table.plan_log import ReprocessLog
from airflow_eo.table.storage import TableLocation
from tests.helpers import committed_offsets, duplicates, keys_of, new_topic, produce, read_table

PLAIN = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"
UPPER = "SELECT topic, partition, offset, upper(CAST(value AS STRING)) AS body FROM source"


def bodies(table_uri: str) -> dict:
    t = read_table(table_uri)
    assert duplicates(t) == {}
    return dict(zip(keys_of(t), t["body"].to_pylist()))


def in_ranges(key, ranges) -> bool:
    return any(r["topic"] == key[0] and r["partition"] == key[1] and r["start"] <= key[2] < r["end"] for r in ranges)


def test_cli_reprocess_by_run_key_and_by_range_and_its_refusals(kafka_config, tmp_path, capsys):
    topic = new_topic(kafka_config, 2)
    table = str(tmp_path / "orders")
    common = ["--ingest-id", "cli", "--topics", topic, "--bootstrap-servers", kafka_config["bootstrap.servers"],
              "--master", "local[1]", "--json"]
    produce(kafka_config, topic, 20, partitions=2)
    assert main(["ingest", "--table", table, *common, "--transform-sql", PLAIN, "--run-key", "run-1"]) == 0
    first = json.loads(capsys.readouterr().out)
    produce(kafka_config, topic, 10, partitions=2, start=20)
    assert main(["ingest", "--table", table, *common, "--transform-sql", PLAIN, "--run-key", "run-2"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (first["rows"], second["rows"]) == (20, 10)
    offsets = committed_offsets(table, "cli", topic, 2)

    # by run key: exactly run-1's rows are replaced, once; offsets and run-2's rows stay
    reprocess = ["reprocess", table, *common, "--transform-sql", UPPER]
    assert main([*reprocess, "--run-key", "run-1", "--request-key", "fix-1"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["status"] == "reprocessed" and done["batch"] == first["batch"] and done["rows"] == 20
    after = bodies(table)
    assert len(after) == 30 and committed_offsets(table, "cli", topic, 2) == offsets
    assert {k for k, v in after.items() if v.startswith("V")} == {k for k in after if in_ranges(k, first["ranges"])}
    version = DeltaTable(table).version()
    # killed after its commit, before it noted the request done: the same request again reports
    # the commit and replaces nothing twice (the window is made by marking the request not done)
    requests = ReprocessLog(TableLocation.of(table))
    requests.record(replace(requests.load("fix-1"), done=False))
    assert main([*reprocess, "--run-key", "run-1", "--request-key", "fix-1"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["status"] == "already_reprocessed" and not replayed["spark_started"]
    assert DeltaTable(table).version() == version and bodies(table) == after

    # by range: the ranges of run-2's batch as `status` prints them
    assert main(["status", table, "--ingest-id", "cli", "--bootstrap-servers", kafka_config["bootstrap.servers"],
                 "--json"]) == 0
    listed = {b["batch"]: b["ranges"] for b in json.loads(capsys.readouterr().out)["batches"]}
    by_range = [a for r in listed[second["batch"]] for a in ("--range", r)]
    assert main([*reprocess, *by_range]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["status"] == "reprocessed" and done["batch"] == second["batch"] and done["rows"] == 10
    after = bodies(table)
    assert len(after) == 30 and all(v.startswith("V") for v in after.values())
    assert committed_offsets(table, "cli", topic, 2) == offsets


@pytest.mark.parametrize("choice, message", [
    (["--run-key", "no-such-run"], "nothing to reprocess: no batch was planned for run 'no-such-run'"),
    (["--range", "{topic}[0] 0..5"], "no committed batch of ingest cli"),  # part of a batch
    (["--range", "{topic}[0] 0..10", "--range", "{topic}[1] 0..10", "--range", "{topic}[1] 10..15"],
     "no committed batch of ingest cli"),  # a batch and more
    (["--range", "{topic}[0] 7"], "is not TOPIC[PARTITION] START..END"),
    (["--range", "{topic}[0] 5..5"], "is not TOPIC[PARTITION] START..END"),
    (["--run-key", "run-1", "--range", "{topic}[0] 0..10"], "by --run-key KEY or by its --range options, not both"),
    ([], "by --run-key KEY or by its --range options, not both"),
])
def test_cli_reprocess_refusals_are_one_line_and_change_nothing(kafka_config, capsys, choice, message, refusal_table):
    table, topic = refusal_table
    log_dir = Path(table) / "_delta_log"
    log_before = sorted(p.name for p in log_dir.iterdir())
    rows_before = bodies(table)
    capsys.readouterr()  # the fixture's ingest summary
    code = main(["reprocess", table, "--ingest-id", "cli", "--topics", topic, "--bootstrap-servers",
                 kafka_config["bootstrap.servers"], "--master", "local[1]", "--transform-sql", UPPER,
                 *[c.format(topic=topic) for c in choice]])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("airflow-eo:")]
    assert code == 2 and len(errors) == 1 and message in errors[0] and captured.out == ""
    assert sorted(p.name for p in log_dir.iterdir()) == log_before
    assert bodies(table) == rows_before


@pytest.fixture(scope="module")
def refusal_table(kafka_config, tmp_path_factory):
    """One committed batch (10 records on each of 2 partitions), shared by the refusal cases."""
    root = tmp_path_factory.getbasetemp() / "refusals"
    root.mkdir(exist_ok=True)
    table = str(root / "orders")
    if not (root / "orders").exists():
        topic = new_topic(kafka_config, 2)
        produce(kafka_config, topic, 20, partitions=2)
        assert main(["ingest", "--table", table, "--ingest-id", "cli", "--topics", topic, "--bootstrap-servers",
                     kafka_config["bootstrap.servers"], "--master", "local[1]", "--transform-sql", PLAIN,
                     "--run-key", "run-1", "--json"]) == 0
        (root / "topic").write_text(topic)
    return table, (root / "topic").read_text()


def test_cli_reprocess_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reprocess", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--run-key" in out and "--range" in out and "--request-key" in out
