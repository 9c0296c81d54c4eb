"""``airflow-eo ingest|plan --spec FILE``: the operator's arguments as JSON, the flags typed beside it
overriding their keys, secrets refused in the file; with ``sinks`` (or ``topic_pattern``) the command
runs the fan-out (its class replaced at the boundary: no broker, no Spark), without them one table."""

from __future__ import annotations

import json
import signal

import pytest

from airflow_eo import cli
from airflow_eo.loop import ingest as fanout_module
from airflow_eo.attempt import Env, Secrets
from airflow_eo.loop.ingest import FanOutResult
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.result import IngestResult
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.submit.spark_submit import LocalSparkSubmit

SINKS = [{"table_uri": "/data/orders_raw"},
         {"table_uri": "/data/orders_now", "write_mode": "merge", "merge_key": "id",
          "transform_sql": "SELECT CAST(key AS STRING) AS id, topic, partition, offset, "
                           "CAST(value AS STRING) AS body FROM source"}]


def spec_file(tmp_path, content, name="spec.json") -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def options(*argv: str) -> dict:
    return cli._options(cli.parser().parse_args(list(argv)))


def test_the_file_gives_the_options_and_each_flag_typed_beside_it_overrides_its_key(tmp_path):
    path = spec_file(tmp_path, {"topics": ["orders"], "ingest_id": "orders", "max_records_per_run": 1000,
                                "schema_evolution": True, "partition_by": ["day"], "sinks": SINKS})
    assert options("ingest", "--spec", path) == {"topics": ["orders"], "ingest_id": "orders",
                                                 "max_records_per_run": 1000, "schema_evolution": True,
                                                 "partition_by": ["day"], "sinks": SINKS}
    given = options("ingest", "--spec", path, "--max-records-per-run", "5", "--partition-by", "hour",
                    "--topics", "orders,refunds", "--master", "local[2]")
    assert (given["max_records_per_run"], given["partition_by"], given["topics"]) == ("5", ["hour"], "orders,refunds")
    # a flag not typed (every flag defaults to None, a switch to off) leaves the file's value
    assert given["schema_evolution"] is True and given["ingest_id"] == "orders" and given["sinks"] == SINKS
    for command in ("ingest", "plan"):  # plan previews what ingest would do: the same file, the same merge
        assert options(command, "--spec", path, "--ingest-id", "other")["ingest_id"] == "other"


def test_without_sinks_the_file_is_the_one_table_of_today(tmp_path):
    path = spec_file(tmp_path, {"table_uri": "/data/orders", "ingest_id": "orders", "topics": "orders",
                                "starting_offsets": "earliest"})
    args = cli.parser().parse_args(["plan", "--spec", path, "--bootstrap-servers", "b:9092",
                                    "--starting-offsets", "latest"])
    ingest = cli._ingest_of(args, cli._options(args), None)
    (config,) = ingest.configs()
    assert ingest.one_table and (config.table_uri, config.ingest_id, config.topics) == ("/data/orders", "orders",
                                                                                        ("orders",))
    assert config.spec.source.starting_offsets.kind == "latest"  # the flag over the file's earliest
    assert config.kafka_config == {"bootstrap.servers": "b:9092"}
    # the flags alone, as before: the same config
    flags = cli.parser().parse_args(["plan", "--table", "/data/orders", "--ingest-id", "orders", "--topics", "orders",
                                     "--bootstrap-servers", "b:9092", "--starting-offsets", "latest"])
    (same,) = cli._ingest_of(flags, cli._options(flags), None).configs()
    assert same.spec == config.spec


def test_a_schema_given_as_a_file_is_read_beside_the_spec_file(tmp_path):
    schema = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.avsc").write_text(json.dumps(schema))
    path = spec_file(tmp_path, {"table_uri": "/t", "ingest_id": "i", "topics": "t", "value_format": "avro",
                                "avro_schema": "@schemas/order.avsc", "dead_letter_table_uri": "/dlq"})
    assert json.loads(options("ingest", "--spec", path)["avro_schema"]) == schema


@pytest.mark.parametrize("content, says", [
    ({"topics": "t", "kafka_config": {"sasl.password": "x"}},
     "kafka_config does not go in a spec file: it may hold secrets: give it by --kafka-config @file.json or "
     f"${Env.KAFKA_CONFIG}"),
    ({"topics": "t", "storage_options": {"AWS_SECRET_ACCESS_KEY": "x"}},
     f"storage_options does not go in a spec file: they may hold credentials: give them by --storage-options "
     f"@file.json or ${Env.STORAGE_OPTIONS}"),
    ({"topics": "t", "kafka_conn_id": "kafka_default"}, "kafka_conn_id does not go in a spec file: a command line "
     "has no Airflow connections"),
    ({"topic": "t"}, "topic is not an argument of the operator (did you mean topics?)"),
    ({"topics": "t", "run_key": "k"}, "run_key is not an argument of the operator"),
    ({"topics": "t", "sinks": [{"table_uri": "/a"}, {"table_uri": "/b", "storage_options": {}}]},
     "sink 2: storage_options does not go in a spec file"),
    ({"topics": "t", "sinks": [{"table_uri": "/a", "sinks": []}]}, "sink 1: sinks is not an argument of the operator"),
    ({"topics": "t", "sinks": {"table_uri": "/a"}}, "sinks must be a list of objects, one per table"),
    ({"topics": "t", "sinks": ["/a"]}, "sinks must be a list of objects, one per table"),
    (["orders"], "holds a JSON list: write one object of the operator's arguments"),
    ('{"topics": "t",}', "is not JSON ("),  # the parser's own words differ between Python versions
], ids=["kafka-config", "storage-options", "connection", "typo", "cli-only", "sink-secret", "nested-sinks",
        "sinks-object", "sinks-strings", "list", "not-json"])
def test_a_bad_spec_file_is_one_line_naming_the_key_and_the_fix_and_writes_nothing(tmp_path, capsys, content, says):
    path = spec_file(tmp_path, content)
    table = tmp_path / "orders"
    assert cli.main(["ingest", "--spec", path, "--table", str(table), "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"airflow-eo: ConfigError: --spec {path}") and says in err[0], err
    assert not table.exists()


def test_a_missing_spec_file_is_one_line(tmp_path, capsys):
    assert cli.main(["plan", "--spec", str(tmp_path / "nope.json")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"airflow-eo: ConfigError: --spec {tmp_path / 'nope.json'}: cannot read it (No such file or directory)"


def test_without_a_spec_file_the_required_options_are_still_required(capsys):
    assert cli.main(["ingest", "--topics", "orders", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "missing required option(s) table_uri" in line and "--table" in line


class RecordingFanOut:
    """The fan-out loop at its boundary: records what the command built and returns a result of two
    tables (one committed, one with nothing new)."""

    made: list["RecordingFanOut"] = []

    def __init__(self, spec, credentials, submitter, kafka=None):
        self.spec, self.credentials, self.submitter, self.runs = spec, credentials, submitter, []
        RecordingFanOut.made.append(self)

    def run(self, run, interval=None):
        self.runs.append((run, interval))
        return FanOutResult(tables=(
            IngestResult(RunStatus.COMMITTED, "orders", "/data/orders_now", run.run_key, batch=3, version=7, rows=40,
                         write_mode="merge", inserted=30, updated=10),
            IngestResult(RunStatus.NOTHING_NEW, "orders", "/data/orders_raw", run.run_key)))


@pytest.fixture
def fan_out(monkeypatch):
    RecordingFanOut.made = []
    monkeypatch.setattr(fanout_module, "FanOut", RecordingFanOut)
    handler = signal.getsignal(signal.SIGTERM)  # the command stops Spark on SIGTERM: not pytest's process
    yield RecordingFanOut.made
    signal.signal(signal.SIGTERM, handler)


def test_ingest_with_sinks_runs_one_fan_out_and_prints_its_result(tmp_path, capsys, monkeypatch, fan_out):
    monkeypatch.setenv(Env.KAFKA_CONFIG, json.dumps({"security.protocol": "SASL_SSL", "sasl.password": "s3cr3t"}))
    monkeypatch.setenv(Env.STORAGE_OPTIONS, json.dumps({"AWS_SECRET_ACCESS_KEY": "s3cr3t-too"}))
    path = spec_file(tmp_path, {"topics": ["orders"], "ingest_id": "orders", "max_records_per_run": 1000,
                                "sinks": SINKS})
    assert cli.main(["ingest", "--spec", path, "--max-records-per-run", "50", "--bootstrap-servers", "b:9092",
                     "--master", "local[2]", "--run-key", "nightly-1", "--json"]) == 0
    (made,) = fan_out
    assert isinstance(made.spec, FanOutSpec)
    assert made.spec == FanOutSpec.of(sinks=SINKS, topics=["orders"], ingest_id="orders", max_records_per_run="50")
    assert made.credentials == Secrets({"security.protocol": "SASL_SSL", "sasl.password": "s3cr3t",
                                        "bootstrap.servers": "b:9092"}, {"AWS_SECRET_ACCESS_KEY": "s3cr3t-too"})
    assert isinstance(made.submitter, LocalSparkSubmit) and made.submitter.master == "local[2]"
    assert made.runs == [(RunIdentity("nightly-1"), None)]
    printed = json.loads(capsys.readouterr().out)
    assert printed == made.run(RunIdentity("nightly-1")).to_dict()
    assert [t["table_uri"] for t in printed["tables"]] == ["/data/orders_now", "/data/orders_raw"]
    assert printed["status"] == "committed" and printed["tables"][0]["inserted"] == 30
    assert "s3cr3t" not in json.dumps(made.spec.to_dict())  # the spec holds no secret


def test_a_topic_pattern_fans_out_and_the_interval_reaches_the_run(tmp_path, capsys, fan_out):
    path = spec_file(tmp_path, {"table_uri": "/data/events_{topic}", "ingest_id": "events"})
    assert cli.main(["ingest", "--spec", path, "--topic-pattern", "events\\..*", "--bootstrap-servers", "b:9092",
                     "--interval-start", "2026-11-27T00:00:00+00:00", "--interval-end", "2026-11-27T01:00:00+00:00"]) == 0
    (made,) = fan_out
    assert made.spec.topic_pattern == "events\\..*" and made.spec.shared["mode"] == "interval"
    ((run, interval),) = made.runs
    assert run.run_key.startswith("cli-") and (interval.end_ms - interval.start_ms) == 3_600_000
    assert json.loads(capsys.readouterr().out)["tables"][1]["status"] == "nothing_new"
