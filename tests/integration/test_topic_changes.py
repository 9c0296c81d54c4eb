"""A topic that changes under a table, on the real broker, as a user meets it through the CLI: a
partition added after a ``latest`` start, a topic deleted and created again (docs/concepts/guarantees.md).

These batches are small, so the CLI's driver reads them itself (no Spark job): what is tested is the
plan, the ledger and the commit."""

from __future__ import annotations

import json

from airflow_eo.cli import main
from airflow_eo.table.ledger import Ledger
from airflow_eo.testing.kafka import TestBroker
from tests.helpers import add_partitions, broker_records, duplicates, keys_of, new_topic, produce, read_table


def ingest(kafka_config, table: str, topic: str, capsys, *extra: str, run_key: str = "") -> tuple[int, dict | str]:
    """``airflow-eo ingest`` of ``topic`` into ``table``: the exit code and the JSON summary (or the error line)."""
    code = main(["ingest", "--table", table, "--ingest-id", "it", "--topics", topic,
                 "--bootstrap-servers", kafka_config["bootstrap.servers"], "--master", "local[1]", "--json",
                 *(["--run-key", run_key] if run_key else []), *extra])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.err.strip().splitlines()[-1])


def rows_of(table: str) -> list[tuple[str, int, int]]:
    return sorted(keys_of(read_table(table, ["topic", "partition", "offset"])))


def test_a_partition_added_after_a_latest_start_lands_every_record_once(kafka_config, tmp_path, capsys):
    topic, table = new_topic(kafka_config, 1), str(tmp_path / "lt")
    produce(kafka_config, topic, 5, partitions=1)
    code, first = ingest(kafka_config, table, topic, capsys, "--starting-offsets", "latest")
    assert code == 0 and first["rows"] == 0  # latest: the first batch starts at the end
    produce(kafka_config, topic, 10, partitions=1, start=5)
    assert ingest(kafka_config, table, topic, capsys, "--starting-offsets", "latest")[1]["rows"] == 10
    add_partitions(kafka_config, topic, 2)
    produce(kafka_config, topic, 100, partitions=2, start=1000)  # 50 to the new partition 1
    produce(kafka_config, topic, 100, partitions=1, start=2000)  # and more to the old one
    # the preview says where the new partition starts, and why
    assert main(["plan", "--table", table, "--ingest-id", "it", "--topics", topic, "--starting-offsets", "latest",
                 "--bootstrap-servers", kafka_config["bootstrap.servers"]]) == 0
    assert f"new partition: {topic}[1], new partition, from its start (offset 0)" in capsys.readouterr().out
    code, third = ingest(kafka_config, table, topic, capsys, "--starting-offsets", "latest")
    assert code == 0 and third["rows"] == 200  # 150 more on partition 0, 50 on the new one
    expected = sorted(k for k in broker_records(kafka_config["bootstrap.servers"], topic) if k[1] == 1 or k[2] >= 5)
    assert rows_of(table) == expected and len([k for k in expected if k[1] == 1]) == 50
    assert duplicates(read_table(table, ["topic", "partition", "offset"])) == {}


def test_a_recreated_topic_is_refused_then_with_reset_read_once_from_its_start(kafka_config, tmp_path, capsys):
    topic, table = new_topic(kafka_config, 1), str(tmp_path / "rc")
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    produce(kafka_config, topic, 10, partitions=1)
    assert ingest(kafka_config, table, topic, capsys)[1]["rows"] == 10
    before = Ledger.open(table).version

    broker.recreate_topic(topic, 1)
    produce(kafka_config, topic, 25, partitions=1, prefix="new")  # more than the table read: offsets 0..25
    code, error = ingest(kafka_config, table, topic, capsys)
    assert code == 2 and error.startswith("airflow-eo: TopicRecreatedError: ")
    assert f"topic {topic!r} was deleted and created again" in error and "record 9 at " in error
    assert "on_topic_recreated='reset'" in error and "the table is unchanged" in error
    assert Ledger.open(table).version == before and len(rows_of(table)) == 10

    # shorter than what the table read: refused as well, by the offsets alone
    broker.recreate_topic(topic, 1)
    produce(kafka_config, topic, 4, partitions=1, prefix="newer")
    code, error = ingest(kafka_config, table, topic, capsys)
    assert code == 2 and "TopicRecreatedError" in error and "ending at offset 4" in error

    produce(kafka_config, topic, 21, partitions=1, prefix="newer", start=4)
    code, reset = ingest(kafka_config, table, topic, capsys, "--on-topic-recreated", "reset", run_key="reset-1")
    assert code == 0 and reset["rows"] == 25
    ledger = Ledger.open(table)
    record = ledger.find_batch("it", run_key="reset-1")
    assert record is not None and [(r.partition, r.committed, r.start) for r in record.meta.resets] == [(0, 10, 0)]
    assert ledger.last_reset("it", topic) == record.meta.batch
    new = read_table(table, ["topic", "partition", "offset", "value"])
    assert sorted(v.decode() for (k, v) in zip(keys_of(new), new["value"].to_pylist()) if k[2] >= 0
                  and v.startswith(b"newer")) == sorted(f"newer{i}" for i in range(25))
    # the new topic is now the table's: the next run reads on from it, without the option
    produce(kafka_config, topic, 3, partitions=1, prefix="later", start=25)
    code, after = ingest(kafka_config, table, topic, capsys)
    assert code == 0 and after["rows"] == 3
    # the audit compares the batches since the reset with Kafka, and says why not the earlier ones
    assert main(["audit", table, "--ingest-id", "it", "--bootstrap-servers", kafka_config["bootstrap.servers"],
                 "--all", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drift"] == 0 and "was deleted and created again" in report["note"]


def test_routing_by_topic_leaves_only_the_recreated_topics_table_behind_on_every_run(kafka_config, tmp_path, capsys):
    """``{topic}`` routing with ``airflow-eo ingest --spec``: topic ``a`` is deleted and created again; its
    table is refused at planning (without retry) on every run while ``b``'s table commits each time."""
    a, b = new_topic(kafka_config, 1), new_topic(kafka_config, 1)
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    spec = tmp_path / "routed.json"
    spec.write_text(json.dumps({"ingest_id": "routed", "topics": [a, b],
                                "sinks": [{"table_uri": str(tmp_path / "{topic}")}]}))

    def run(*extra: str) -> tuple[int, str]:
        code = main(["ingest", "--spec", str(spec), "--bootstrap-servers", kafka_config["bootstrap.servers"],
                     "--master", "local[1]", "--json", *extra])
        out = capsys.readouterr()
        return code, out.out if code == 0 else out.err.strip().splitlines()[-1]

    for topic in (a, b):
        produce(kafka_config, topic, 10, partitions=1)
    assert run()[0] == 0
    broker.recreate_topic(a, 1)
    for i in range(2):
        produce(kafka_config, a, 20, partitions=1, prefix=f"new{i}-")
        produce(kafka_config, b, 5, partitions=1, start=10 + 5 * i)
        code, error = run()
        assert code == 2 and error.startswith(f"airflow-eo: TopicRecreatedError: {tmp_path / a}: topic {a!r}")
        assert len(rows_of(str(tmp_path / a))) == 10  # a's table as it was
        assert len(rows_of(str(tmp_path / b))) == 15 + 5 * i  # b's table went on
    code, out = run("--on-topic-recreated", "reset")
    assert code == 0
    tables = {t["table_uri"]: t for t in json.loads(out)["tables"]}
    assert tables[str(tmp_path / a)]["rows"] == 40 and tables[str(tmp_path / b)]["status"] == "nothing_new"
