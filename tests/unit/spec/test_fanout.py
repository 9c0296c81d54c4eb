"""FanOutSpec: sinks over shared options, `{topic}` routing, topic patterns, and what is refused before a run."""

from __future__ import annotations

import pytest

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec import IngestSpec, WriteMode
from airflow_eo.spec.fanout import FanOutSpec, matching_topics


def test_without_sinks_the_spec_is_the_one_table_of_the_flat_options():
    spec = FanOutSpec.of(table_uri="/t", ingest_id="i", topics="a,b", max_records_per_run=5)
    (table,) = spec.tables(spec.topics)
    assert table == IngestSpec.of(table_uri="/t", ingest_id="i", topics="a,b", max_records_per_run=5)
    assert FanOutSpec.from_dict(spec.to_dict()) == spec


def test_each_sink_lays_its_options_over_the_shared_ones():
    spec = FanOutSpec.of(ingest_id="i", topics="a,b", starting_offsets="latest", sinks=[
        {"table_uri": "/raw"},
        {"table_uri": "/latest", "topics": "b", "write_mode": "merge", "merge_key": "key",
         "starting_offsets": "earliest", "ingest_id": "own"}])
    latest, raw = spec.tables(spec.topics)
    assert (raw.table_uri, raw.topics, raw.merge.write_mode, raw.source.starting_offsets.kind, raw.ingest_id) == \
        ("/raw", ("a", "b"), WriteMode.APPEND, "latest", "i")
    assert (latest.table_uri, latest.topics, latest.merge.write_mode, latest.source.starting_offsets.kind,
            latest.ingest_id) == ("/latest", ("b",), WriteMode.MERGE, "earliest", "own")
    assert latest.decode.tombstones and not raw.decode.tombstones
    assert FanOutSpec.from_dict(spec.to_dict()) == spec


def test_a_topic_template_makes_a_table_per_topic_and_its_dead_letters_follow():
    spec = FanOutSpec.of(ingest_id="i", topic_pattern=r"orders\..*", value_format="json", value_schema="id INT",
                         sinks=[{"table_uri": "/lake/{topic}", "dead_letter_table_uri": "/lake/{topic}_dead"}])
    tables = spec.tables(matching_topics(spec.topic_pattern or "", ["orders.eu", "orders.us", "refunds"]))
    assert [(t.table_uri, t.topics, t.dead_letters.table_uri) for t in tables] == [
        ("/lake/orders.eu", ("orders.eu",), "/lake/orders.eu_dead"),
        ("/lake/orders.us", ("orders.us",), "/lake/orders.us_dead")]
    assert spec.tables(()) == ()


def test_a_pattern_is_a_full_match_and_never_matches_internal_topics():
    assert matching_topics("orders", ["orders", "orders2", "my_orders"]) == ("orders",)
    assert matching_topics(".*", ["__consumer_offsets", "__transaction_state", "a"]) == ("a",)


def test_tables_of_several_topics_decode_by_the_sources_subjects_a_table_per_topic_by_its_own():
    spec = FanOutSpec.of(ingest_id="i", topics="a,b", value_format="avro", sinks=[
        {"table_uri": "/t/{topic}", "dead_letter_table_uri": "/dl/{topic}"},
        {"table_uri": "/all", "dead_letter_table_uri": "/dl/all"}])
    assert {t.table_uri: t.decode.value_subject for t in spec.tables(spec.topics)} == {
        "/t/a": "a-value", "/t/b": "b-value", "/all": "a-value"}


@pytest.mark.parametrize("sinks, options, message", [
    ([], {}, "sinks is empty"),
    ([{"table_uri": "/a"}], {"table_uri": "/b"}, "move table_uri into the sinks"),
    ([{"write_mode": "merge"}], {}, "sink 1 has no table_uri"),
    ([{"table_uri": "/a", "max_records_per_run": 3}], {}, "max_records_per_run belong.* to the source"),
    ([{"table_uri": "/a", "colour": "red"}], {}, "colour no sink takes"),
    ([{"table_uri": "/a"}, {"table_uri": "/a"}], {}, "two sinks write the same table"),
    ([{"table_uri": "/a", "topics": "c"}], {}, "sink 1 reads topic.* c the ingest does not"),
    ([{"table_uri": "/a", "write_mode": "merge"}], {}, r"sink 1 \(/a\): .*merge_key"),
    (["/a"], {}, "sink 1 is a str"),
])
def test_what_cannot_run_is_refused_naming_the_sink(sinks, options, message):
    with pytest.raises(ConfigError, match=message):
        FanOutSpec.of(ingest_id="i", topics="a,b", sinks=sinks, **options)


def test_a_debezium_sink_does_not_share_a_read_with_plain_decoded_sinks():
    with pytest.raises(ConfigError, match="cdc_format='debezium' sink cannot share"):
        FanOutSpec.of(ingest_id="i", topics="a", value_format="json", value_schema="id INT",
                      dead_letter_table_uri="/dl", sinks=[
                          {"table_uri": "/a", "dead_letter_table_uri": "/dl_a"},
                          {"table_uri": "/b", "write_mode": "merge", "merge_key": "id", "cdc_format": "debezium"}])


def test_sinks_mirroring_one_topic_into_one_consumer_group_are_refused_up_front():
    with pytest.raises(ConfigError, match=r"the tables /a and /b both mirror their offsets of topic 'a' to consumer "
                                          r"group 'lag'.*give each sink its own mirror_consumer_group"):
        FanOutSpec.of(ingest_id="i", topics="a,b", mirror_consumer_group="lag",
                      sinks=[{"table_uri": "/a"}, {"table_uri": "/b"}])
    # a group per sink, one table per topic, or disjoint topics: nothing to overwrite
    FanOutSpec.of(ingest_id="i", topics="a,b", sinks=[{"table_uri": "/a", "mirror_consumer_group": "lag-a"},
                                                      {"table_uri": "/b", "mirror_consumer_group": "lag-b"}])
    FanOutSpec.of(ingest_id="i", topics="a,b", mirror_consumer_group="lag", sinks=[{"table_uri": "/t/{topic}"}])
    FanOutSpec.of(ingest_id="i", topics="a,b", mirror_consumer_group="lag",
                  sinks=[{"table_uri": "/a", "topics": "a"}, {"table_uri": "/b", "topics": "b"}])
