"""The ingest spec: options parsed once into typed values, one generic round trip, one-line errors."""

from __future__ import annotations

import json

import pytest

from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import OnDataLoss, StartingPosition
from airflow_eo.core.offsets import TopicPartition
from airflow_eo.spec import (
    OPTIONS, DecodeSpec, IngestSpec, Mode, SparkSettings, Transform, all_options, default_of, dump_option,
    parse_option,
)

BASE = {"table_uri": "/data/orders", "ingest_id": "orders", "topics": "orders"}

# every option set to a non-default value, as a user would write it (raw)
EVERYTHING = {
    "table_uri": "file:///data/orders/", "ingest_id": "orders_raw", "topics": ["orders", "refunds"],
    "starting_offsets": '{"orders": {"0": 42, "1": -1}}', "on_data_loss": "skip", "mirror_consumer_group": "g",
    "mode": "interval", "close_after": "15m", "max_records_per_run": "1000", "schema_evolution": "true",
    "table_properties": ["delta.checkpointInterval=50"], "partition_by": ["date,hour"],
    "transform_sql": "SELECT *, to_date(timestamp) AS date, hour(timestamp) AS hour FROM source",
    "value_format": "avro", "avro_schema": '"long"', "key_format": "json", "key_schema": "id STRING",
    "value_schema_version": 3, "max_value_bytes": 1024, "dead_letter_table_uri": "/data/orders_dlq",
    "max_dead_letters": 5, "max_dead_letter_fraction": "0.5", "dedup_key": "headers['id']",
    "dedup_horizon": "10 batches", "duplicates_to_dead_letters": True,
}


def test_every_option_is_parsed_into_its_typed_value():
    spec = IngestSpec.of(**EVERYTHING)
    assert spec.table.table_uri == "/data/orders" and spec.table.schema_evolution is True
    assert spec.table.table_properties == {"delta.checkpointInterval": "50"}
    assert spec.table.partition_by == ("date", "hour")
    assert spec.source.topics == ("orders", "refunds")
    assert spec.source.starting_offsets == StartingPosition(
        "offsets", offsets={TopicPartition("orders", 0): 42, TopicPartition("orders", 1): -1})
    assert spec.source.on_data_loss is OnDataLoss.SKIP
    assert spec.planning.mode is Mode.INTERVAL and spec.planning.close_after == 900.0
    assert spec.planning.max_records_per_run == 1000
    assert spec.decode.value_schema_version == "3" and spec.decode.max_value_bytes == 1024
    assert spec.dead_letters.max_fraction == 0.5 and spec.dedup.horizon_batches() == 10


def test_the_generic_round_trip_keeps_every_option():
    spec = IngestSpec.of(**EVERYTHING)
    raw = spec.to_dict()
    assert IngestSpec.from_dict(json.loads(json.dumps(raw))) == spec  # JSON all the way
    assert raw["source"]["starting_offsets"] == {"orders": {"0": 42, "1": -1}}
    assert IngestSpec.from_dict(IngestSpec.of(**BASE).to_dict()) == IngestSpec.of(**BASE)


@pytest.mark.parametrize("name", sorted(set(OPTIONS) - set(BASE)))  # the required ones have no default
def test_each_default_survives_its_own_dump_and_parse(name):
    opt = next(o for o in all_options() if o.name == name)
    default = default_of(opt)
    assert parse_option(opt, dump_option(opt, default)) == default


def test_a_template_that_rendered_empty_means_not_set():
    spec = IngestSpec.of(**BASE, transform_sql="", value_schema="", dead_letter_table_uri="", starting_offsets="",
                         max_records_per_run="", mode="", dedup_key="")
    assert spec == IngestSpec.of(**BASE)


def test_none_means_not_set_for_every_optional_option():
    # what an operator argument written as `None` (or an unset Jinja variable) hands over
    unset = {o.name: None for o in all_options() if o.name not in BASE}
    assert IngestSpec.of(**BASE, **unset) == IngestSpec.of(**BASE)


def test_a_sub_spec_may_be_given_whole():
    spec = IngestSpec.of(**BASE, transform=Transform(sql="SELECT 1 AS x FROM source"))
    assert spec.transform.sql.startswith("SELECT 1") and spec.value("transform_sql") == spec.transform.sql
    assert IngestSpec.of(**BASE, transform="pkg.mod:fn").transform == Transform(callable="pkg.mod:fn")


def test_avro_through_a_registry_defaults_its_subjects_to_the_first_topic():
    spec = IngestSpec.of(**BASE, value_format="avro", key_format="avro", dead_letter_table_uri="/d")
    assert (spec.decode.value_subject, spec.decode.key_subject) == ("orders-value", "orders-key")
    with pytest.raises(ConfigError, match="Schema Registry"):
        IngestConfig(spec)
    assert IngestConfig(spec, schema_registry={"url": "http://r"}).spec is spec


def test_replace_parses_and_checks_again():
    spec = IngestSpec.of(**BASE)
    assert spec.replace(max_records_per_run="10", staging_grace_seconds=0).planning.max_records_per_run == 10
    assert spec.replace(spark=SparkSettings(5)).spark.max_offsets_per_task == 5
    with pytest.raises(ConfigError, match="dead_letter_table_uri"):
        spec.replace(value_schema="id INT")


@pytest.mark.parametrize("options, message", [
    ({"topics": ""}, "topics is empty"),
    ({"topics": " , "}, "topics is empty"),
    ({"ingest_id": "has space"}, "ingest_id"),
    ({"table_uri": ""}, "table_uri is empty"),
    ({"starting_offsets": "newest"}, "starting_offsets"),
    ({"on_data_loss": "ignore"}, "on_data_loss='ignore' is not understood.*fail, skip"),
    ({"mode": "daily"}, "mode='daily' is not a planning mode"),
    ({"close_after": "soon"}, "duration"),
    ({"max_records_per_run": "many"}, "max_records_per_run='many'"),
    ({"driver_read_max_offsets": -1}, "driver_read_max_offsets must be 0 .always Spark tasks. or positive"),
    ({"partition_by": ["offset"]}, "key column"),
    ({"partition_by": "a,a"}, "twice"),
    ({"table_properties": ["novalue"]}, "KEY=VALUE"),
    ({"table_properties": {"delta.setTransactionRetentionDuration": "interval 1 day"}}, "expire"),
    ({"value_format": "xml"}, "not supported"),
    ({"value_schema": "id INT"}, "needs a dead_letter_table_uri"),
    ({"dead_letter_table_uri": "/data/orders"}, "another path"),
    ({"dedup_horizon": "0 batches"}, "dedup_horizon"),
    ({"duplicates_to_dead_letters": True}, "needs a dedup_key"),
    ({"transform_sql": "SELECT 1", "transform": "m:f"}, "not both"),
    ({"max_dead_letter_fraction": 2}, "between 0 and 1"),
    ({"max_record_per_run": 5}, "unknown ingest option"),
    ({"write_mode": "upsert"}, "write_mode='upsert' is not a write mode"),
    ({"write_mode": "merge"}, "write_mode='merge' needs merge_key"),
    ({"merge_key": "id"}, "merge_key applies only with write_mode='merge'"),
    ({"delete_when": "value IS NULL", "cdc_format": "debezium"}, "delete_when, cdc_format apply only with"),
    ({"write_mode": "merge", "merge_key": "id,offset"}, "'offset' is a provenance column"),
    ({"write_mode": "merge", "merge_key": "id,id"}, "names a column twice"),
    ({"write_mode": "merge", "merge_key": "id", "dedup_key": "key"}, "dedup_key and merge_key do not go together"),
    ({"write_mode": "merge", "merge_key": "id", "cdc_format": "maxwell"}, "cdc_format='maxwell' is not supported"),
    ({"write_mode": "merge", "merge_key": "id", "cdc_format": "debezium"}, "needs value_schema"),
    ({"write_mode": "merge", "merge_key": "id", "cdc_format": "debezium", "value_format": "raw"}, "needs decoded"),
])
def test_bad_options_fail_with_one_line_naming_them(options, message):
    with pytest.raises(ConfigError, match=message) as failure:
        IngestSpec.of(**{**BASE, **options})
    assert "\n" not in str(failure.value)


def test_merge_options_parse_and_the_delete_rule_follows_the_format():
    spec = IngestSpec.of(**BASE, write_mode="merge", merge_key="id, tenant", delete_when="  ")
    assert spec.merge.enabled and spec.merge.key == ("id", "tenant") and spec.merge.delete_when is None
    assert spec.merge.delete_rule == "value IS NULL"
    assert IngestSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    cdc = IngestSpec.of(**BASE, write_mode="merge", merge_key=["id"], cdc_format="Debezium", value_format="avro",
                        dead_letter_table_uri="/d")
    assert cdc.merge.cdc_format.value == "debezium" and cdc.merge.delete_rule == "op = 'd'"
    assert cdc.replace(delete_when="op = 'd' OR __deleted = 'true'").merge.delete_rule.startswith("op = 'd' OR")
    assert not IngestSpec.of(**BASE).merge.enabled
    # in a merge a null value is a tombstone (a change), not a dead letter, whatever the value format
    import pyarrow as pa

    from airflow_eo.decoding.decoder import precheck

    json_merge = IngestSpec.of(**BASE, write_mode="merge", merge_key="id", value_schema="id INT", max_value_bytes=5,
                               dead_letter_table_uri="/d")
    assert json_merge.decode.tombstones and not json_merge.decode.value.null_is_bad
    assert precheck(pa.array([None, b"{}", b"toolong"]), json_merge.decode.value).to_pylist() == \
        [None, None, "value of 7 bytes exceeds max_value_bytes=5"]
    appended = json_merge.replace(write_mode="append", merge_key=None)
    assert not appended.decode.tombstones and appended.decode.value.null_is_bad
    # an attempt written before merging existed has no merge group: it appends
    old = IngestSpec.of(**BASE).to_dict()
    del old["merge"]
    assert IngestSpec.from_dict(old) == IngestSpec.of(**BASE)


def test_a_required_option_missing_names_its_flag():
    with pytest.raises(ConfigError, match="missing required option.*ingest_id.*--ingest-id"):
        IngestSpec.of(table_uri="/t", topics="a")


def test_an_ingest_reads_topics_or_a_pattern_one_of_them():
    with pytest.raises(ConfigError, match="give topics .* or topic_pattern .*neither was given"):
        IngestSpec.of(table_uri="/t", ingest_id="i")
    with pytest.raises(ConfigError, match="both were given"):
        IngestSpec.of(table_uri="/t", ingest_id="i", topics="a", topic_pattern="a.*")
    with pytest.raises(ConfigError, match="topic_pattern '\\(' is not a regular expression"):
        IngestSpec.of(table_uri="/t", ingest_id="i", topic_pattern="(")
    assert IngestSpec.of(table_uri="/t", ingest_id="i", topic_pattern="orders\\..*").source.topic_pattern == "orders\\..*"


def test_the_config_keeps_secrets_apart_and_reads_its_options_from_the_spec_typed():
    config = IngestConfig(**BASE, kafka_config={"bootstrap.servers": "b:9092", "sasl.password": "s3cr3t"},
                          storage_options={"AWS_SECRET_ACCESS_KEY": "k3y"}, starting_offsets="latest")
    assert "s3cr3t" not in repr(config) and "k3y" not in repr(config)
    assert "s3cr3t" not in json.dumps(config.spec.to_dict())
    assert config.spec.source.starting_offsets == StartingPosition("latest") and config.topics == ("orders",)
    assert config.spec.planning.mode == "offsets" and config.spec.table.staging_grace_seconds == 24 * 3600
    assert config.replace(mode="interval").spec.planning.mode is Mode.INTERVAL
    with pytest.raises(AttributeError):  # no option forwarded by name: the spec holds them, typed
        _ = config.mode


def test_an_inline_avro_schema_is_checked_when_the_config_is_built():
    with pytest.raises(ConfigError, match="Avro"):
        IngestConfig(**BASE, value_format="avro", avro_schema='{"type": "nope"}', dead_letter_table_uri="/d")


def test_decode_spec_alone_keeps_its_rules():
    assert DecodeSpec(value_format="avro", avro_schema='"long"').enabled
    with pytest.raises(ConfigError, match="key_schema"):
        DecodeSpec(key_format="json")
