"""Kafka helpers that need no broker: the portable client config, starting offsets, bad configs."""

from __future__ import annotations

import pytest

from airflow_eo import kafka
from airflow_eo.core.errors import ConfigError
from airflow_eo.kafka import KafkaOffsets, client_config
from airflow_eo.core.planning import StartingPosition
from airflow_eo.core.offsets import PartitionBounds, TopicPartition
from tests.unit.fakes import FakeKafka

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)
BOUNDS = {A: PartitionBounds(A, 10, 50), B: PartitionBounds(B, 0, 0)}


def upper(config_str: str) -> tuple[str, float]:
    """A callback a connection names by its path."""
    return config_str.upper(), 1.0


def test_client_config_imports_callback_paths_and_sets_a_log_level():
    config = client_config({"bootstrap.servers": "b:9092", "oauth_cb": f"{__name__}.upper"})
    assert config["oauth_cb"] is upper and config["log_level"] == 3
    assert client_config({"bootstrap.servers": "b:9092", "oauth_cb": f"{__name__}:upper"})["oauth_cb"] is upper
    assert client_config({"bootstrap.servers": "b:9092", "log_level": "7"})["log_level"] == 7


def test_the_msk_region_is_bound_into_the_callback_and_removed_from_the_config(monkeypatch):
    seen = []
    monkeypatch.setattr(kafka, "msk_iam_oauth_cb", lambda region, config_str="": seen.append(region) or ("t", 1.0))
    config = client_config({"bootstrap.servers": "b:9098", "oauth_cb": kafka.MSK_IAM_CALLBACK,
                            kafka.MSK_IAM_REGION: "eu-west-1"})
    assert kafka.MSK_IAM_REGION not in config
    assert config["oauth_cb"]("") == ("t", 1.0) and seen == ["eu-west-1"]


def test_a_callable_in_the_config_is_kept_as_it_is():
    assert client_config({"bootstrap.servers": "b:9092", "error_cb": upper})["error_cb"] is upper


@pytest.mark.parametrize("config, message", [
    ({}, "has no 'bootstrap.servers'"),
    ({"bootstrap.servers": ""}, "has no 'bootstrap.servers'"),
    ({"bootstrap.servers": "b:9092", "oauth_cb": "no_such_module_here.cb"}, "cannot be imported here"),
    ({"bootstrap.servers": "b:9092", "stats_cb": f"{__name__}.missing"}, "stats_cb=.*cannot be imported"),
])
def test_a_bad_client_config_is_a_one_line_config_error(config, message):
    with pytest.raises(ConfigError, match=message) as err:
        client_config(config)
    assert "\n" not in str(err.value)


def test_an_unknown_librdkafka_property_is_a_config_error_before_any_connection():
    with pytest.raises(ConfigError, match="not valid.*librdkafka property names"):
        KafkaOffsets({"bootstrap.servers": "127.0.0.1:9", "no.such.property": "1"})


@pytest.mark.parametrize("position, expected", [
    (StartingPosition("earliest"), {A: 10, B: 0}),
    (StartingPosition("latest"), {A: 50, B: 0}),
    (StartingPosition.parse('{"orders": {"0": 20}}'), {A: 20, B: 0}),  # B not listed: earliest
    (StartingPosition.parse({"orders": {"0": -1, "1": -2}}), {A: 50, B: 0}),  # -1 latest, -2 earliest
])
def test_resolve_starts_without_asking_kafka(position, expected):
    fake = FakeKafka(orders=2)
    assert fake.resolve_starts(position, [A, B], BOUNDS) == expected
    assert fake.asked == []


def test_a_timestamp_start_asks_kafka_and_a_partition_without_later_records_starts_at_its_end():
    fake = FakeKafka(orders=2)
    fake.produce(A, *range(1000, 1050))
    fake.delete_records(A, 10)
    found = fake.resolve_starts(StartingPosition("timestamp", timestamp_ms=1030), [A, B],
                                {A: PartitionBounds(A, 10, 50), B: PartitionBounds(B, 0, 0)})
    assert found == {A: 30, B: 0} and fake.asked == ["offsets_for_timestamp(1030)"]


def test_an_explicit_start_outside_the_partition_is_refused():
    with pytest.raises(ConfigError, match=r"starting offset 5 for orders\[0\] is outside what Kafka holds \[10, 50\)"):
        FakeKafka(orders=2).resolve_starts(StartingPosition.parse({"orders": {"0": 5}}), [A], BOUNDS)


class _Metadata:
    """What ``list_topics`` answers: topic → partitions."""

    def __init__(self, topics: dict[str, int]):
        from types import SimpleNamespace

        self.topics = {t: SimpleNamespace(error=None, partitions={p: None for p in range(n)}) for t, n in topics.items()}


def test_a_pinned_client_asks_each_question_once_for_every_table_and_thread(monkeypatch):
    """A run's tables plan side by side on one pinned client: the first question of bounds (or ids) asks
    it of every partition of the run's topics at once, threads asking together get one answer (the
    first), and the lags' client asks them all at once again."""
    import threading
    import time

    asked: list[tuple] = []
    refunds = TopicPartition("refunds", 0)

    def bounds(self, tps):
        asked.append(("bounds", tuple(tps)))
        time.sleep(0.02)  # a slow broker: the threads below ask while the first question is out
        return {tp: PartitionBounds(tp, 0, 10 * len(asked)) for tp in tps}

    monkeypatch.setattr(KafkaOffsets, "metadata", lambda self: _Metadata({"orders": 2, "refunds": 1, "other": 1}))
    monkeypatch.setattr(KafkaOffsets, "bounds", bounds)
    monkeypatch.setattr(KafkaOffsets, "topic_ids", lambda self, topics: asked.append(("ids", tuple(topics))) or
                        dict.fromkeys(topics))
    pinned = kafka.PinnedKafka({"bootstrap.servers": "127.0.0.1:1"})
    pinned.expect(["orders", "gone", "refunds", "orders"])  # a topic that does not exist is its table's to report
    assert asked == []  # no I/O until asked
    seen: list[dict] = []
    threads = [threading.Thread(target=lambda: seen.append(pinned.bounds([A, B]))) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert asked == [("bounds", (A, B, refunds))]  # once, for every expected partition
    assert len(seen) == 16 and all(s == seen[0] for s in seen) and seen[0][A].end == 10
    assert pinned.bounds([refunds])[refunds].end == 10 and len(asked) == 1
    pinned.topic_ids(["refunds"])
    pinned.bounds([TopicPartition("other", 0)])  # not expected: asked alone
    assert asked[1:] == [("ids", ("refunds", "orders")), ("bounds", (TopicPartition("other", 0),))]
    current = pinned.current()
    assert current.bounds([A])[A].end == 40 and pinned.current() is current
    assert asked[3:] == [("bounds", (A, B, refunds))]  # after the commits: all of them at once again
    pinned.ask_anew()  # after a wait for the run's turn: every question is asked again, of every expected topic
    assert asked[4:] == [] and pinned.bounds([A])[A].end == 50 and pinned.current() is not current
    assert asked[4:] == [("bounds", (A, B, refunds))]
