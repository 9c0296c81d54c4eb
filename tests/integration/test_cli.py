"""``airflow-eo ingest`` / ``status`` as a user runs them: real spark-submit, real broker and table."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from airflow_eo.cli import main
from tests.helpers import new_topic, read_table


def test_cli_ingest_with_dead_letters_then_status(kafka_config, tmp_path, capsys):
    topic = new_topic(kafka_config, 1)
    producer = Producer(kafka_config)
    for value in [b'{"id": 1}', b"{broken", b'{"id": 2}']:
        producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    table, dead = str(tmp_path / "orders"), str(tmp_path / "orders_dead")
    common = ["--bootstrap-servers", kafka_config["bootstrap.servers"]]

    code = main(["ingest", "--table", table, "--ingest-id", "cli", "--topics", topic, *common,
                 "--master", "local[1]", "--value-schema", "id INT", "--dead-letter-table", dead,
                 "--transform-sql", "SELECT topic, partition, offset, data.id AS id FROM source",
                 "--run-key", "cli-1", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["status"] == "committed" and summary["rows"] == 2
    assert sorted(read_table(table, ["id"])["id"].to_pylist()) == [1, 2]
    letters = read_table(dead, ["offset", "reason"])
    assert letters["offset"].to_pylist() == [1] and "value_schema" in letters["reason"][0].as_py()

    assert main(["status", table, "--ingest-id", "cli", *common, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_batch"] == 1
    assert status["partitions"] == [{"topic": topic, "partition": 0, "committed": 3, "end": 3, "lag": 0}]

    assert status["layout"]["files"] == 1 and status["layout"]["due"] == []

    # maintenance of both tables, every action: the offsets and the rows stay
    assert main(["maintain", table, "--dead-letter-table", dead, "--retain-hours", "0"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert set(done) == {"table", "dead_letter_table"}
    assert done["table"]["layout"]["versions_since_checkpoint"] == 0 and "records_removed" in done["table"]
    assert main(["status", table, "--ingest-id", "cli", *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partitions"][0]["committed"] == 3
    assert sorted(read_table(table, ["id"])["id"].to_pylist()) == [1, 2]

    # bad input: one line naming the cause, exit code 2, nothing changed
    assert main(["status", str(tmp_path / "nowhere"), "--ingest-id", "cli", "--json"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert main(["maintain", table, "--vacuum", "--retain-hours", "-1"]) == 2
    assert "--retain-hours -1" in capsys.readouterr().err


def test_cli_ingest_avro_through_the_registry_with_credentials_from_the_environment(kafka_config, tmp_path, capsys,
                                                                                    monkeypatch):
    from tests.helpers import produce_avro
    from airflow_eo.testing.registry import RegistryDouble

    schema = json.dumps({"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]})
    registry = RegistryDouble(user_info="cli:registry-pass").start()
    try:
        topic = new_topic(kafka_config, 1)
        produce_avro(kafka_config, topic, [{"id": i} for i in range(7)], schema,
                     {"url": registry.url, "basic.auth.user.info": "cli:registry-pass"}, 1)
        table, dead = str(tmp_path / "events"), str(tmp_path / "events_dead")
        args = ["ingest", "--table", table, "--ingest-id", "cli_avro", "--topics", topic, "--master", "local[1]",
                "--bootstrap-servers", kafka_config["bootstrap.servers"], "--value-format", "avro",
                "--dead-letter-table", dead, "--transform-sql", "SELECT topic, partition, offset, data.id FROM source",
                "--run-key", "cli-avro-1", "--json"]
        # credentials in the URL would show in the process list: refused, nothing written
        assert main([*args, "--schema-registry", registry.url.replace("http://", "http://cli:registry-pass@")]) == 2
        assert "credentials in its URL" in capsys.readouterr().err and not (tmp_path / "events").exists()
        monkeypatch.setenv("AIRFLOW_EO_SCHEMA_REGISTRY_CONFIG", json.dumps({"basic.auth.user.info": "cli:registry-pass"}))
        assert main([*args, "--schema-registry", registry.url]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["status"] == "committed" and summary["rows"] == 7
        assert sorted(read_table(table, ["id"])["id"].to_pylist()) == list(range(7))
    finally:
        registry.stop()


def test_cli_ingest_into_a_partitioned_table_and_the_refusal_of_another_layout(kafka_config, tmp_path, capsys):
    from deltalake import DeltaTable

    from tests.helpers import produce

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 8, partitions=2)
    table = str(tmp_path / "orders")
    args = ["ingest", "--table", table, "--ingest-id", "cli", "--topics", topic, "--bootstrap-servers",
            kafka_config["bootstrap.servers"], "--master", "local[1]", "--json", "--transform-sql",
            "SELECT topic, partition, offset, to_date(timestamp) AS date, partition % 2 AS shard FROM source"]
    assert main([*args, "--partition-by", "date", "--partition-by", "shard"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 8
    assert DeltaTable(table).metadata().partition_columns == ["date", "shard"]
    assert sorted(read_table(table, ["shard"])["shard"].to_pylist()) == [0] * 4 + [1] * 4

    produce(kafka_config, topic, 2, partitions=2, start=8)
    assert main([*args, "--partition-by", "date"]) == 2  # a configuration error: one line, nothing changed
    assert "is partitioned by ['date', 'shard']" in capsys.readouterr().err
    assert main([*args, "--partition-by", "date,shard"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 2


def test_cli_interval_mode_with_dedup_then_status(kafka_config, tmp_path, capsys):
    import time

    hour = 3_600_000
    base = (int(time.time() * 1000) // hour - 5) * hour
    topic = new_topic(kafka_config, 1)
    producer = Producer(kafka_config)
    # events 1, 2, 1 again (a resend) inside the hour, then one after it that closes the hour
    for event, ts in [(1, base + 1), (2, base + 2), (1, base + 3), (3, base + hour + 1)]:
        producer.produce(topic, value=f"e{event}".encode(), partition=0, timestamp=ts,
                         headers=[("event-id", str(event).encode())])
    producer.flush(30)
    table = str(tmp_path / "hourly")
    common = ["--bootstrap-servers", kafka_config["bootstrap.servers"]]
    args = ["ingest", "--table", table, "--ingest-id", "cli", "--topics", topic, *common, "--master", "local[1]",
            "--dedup-key", "CAST(headers['event-id'] AS STRING)", "--json"]
    assert main([*args, "--interval-start", str(base)]) == 2  # both ends or neither: one line, nothing run
    capsys.readouterr()
    assert main([*args, "--interval-start", str(base), "--interval-end", str(base + hour)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "committed" and summary["rows"] == 2 and summary["duplicates"] == 1
    assert summary["interval"] == {"start_ms": base, "end_ms": base + hour}
    assert sorted(read_table(table, ["_dedup_key"])["_dedup_key"].to_pylist()) == ["1", "2"]
    assert main(["status", table, "--ingest-id", "cli", *common]) == 0
    out = capsys.readouterr().out
    assert "intervals: 1 committed, 0 gap(s)" in out


def test_cli_ingest_with_a_spec_file_writes_each_sink_once_and_plan_previews_each(kafka_config, tmp_path, capsys):
    """``--spec`` with two sinks: one spark-submit reads the topic once into a raw table and a
    merge table; a flag beside the file overrides its key; ``plan`` previews each table; each table
    is an ordinary one for ``status``."""
    topic = new_topic(kafka_config, 1)
    producer = Producer(kafka_config)
    for i in range(12):
        producer.produce(topic, key=str(i % 3).encode(), value=f'{{"n": {i}}}'.encode(), partition=0)
    producer.flush(30)
    raw, latest = str(tmp_path / "raw"), str(tmp_path / "latest")
    spec = tmp_path / "events.json"
    spec.write_text(json.dumps({"topics": [topic], "ingest_id": "cli_fan", "max_records_per_run": 5, "sinks": [
        {"table_uri": raw},
        {"table_uri": latest, "write_mode": "merge", "merge_key": "id",
         "transform_sql": "SELECT CAST(key AS STRING) AS id, topic, partition, offset, "
                           "CAST(value AS STRING) AS body FROM source"}]}))
    common = ["--spec", str(spec), "--bootstrap-servers", kafka_config["bootstrap.servers"], "--json"]

    assert main(["plan", *common, "--max-records-per-run", "100"]) == 0
    previews = json.loads(capsys.readouterr().out)["tables"]
    assert [(p["sinks"][0]["uri"], p["offsets"]) for p in previews] == [(latest, 12), (raw, 12)]
    assert not (tmp_path / "raw").exists()  # a preview writes nothing

    assert main(["ingest", *common, "--max-records-per-run", "100", "--master", "local[1]", "--run-key", "fan-1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "committed" and summary["table_uris"] == [latest, raw]
    assert [(t["status"], t["rows"], t["write_mode"]) for t in summary["tables"]] == \
        [("committed", 3, "merge"), ("committed", 12, "append")]  # 12 records, not the file's 5
    assert sorted(read_table(latest, ["id"])["id"].to_pylist()) == ["0", "1", "2"]
    assert read_table(raw).num_rows == 12
    for table in (raw, latest):
        assert main(["status", table, "--ingest-id", "cli_fan", "--bootstrap-servers",
                     kafka_config["bootstrap.servers"], "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["partitions"][0]["committed"] == 12
