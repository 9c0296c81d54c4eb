"""The audit's batch-header read (airflow_eo/audit/batches.py): which offsets a record batch's header
says a read_committed consumer is delivered, when a span must be read record by record instead, which
connection configs the batch read speaks, and how a fetch's errors end a read. Batches are built by
aiokafka's own batch builder; the broker is a fake at the client's boundary (``send``)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from airflow_eo.audit import batches
from airflow_eo.audit.batches import BatchOffsets, NeedRecords, batch_spans, client_options
from airflow_eo.audit.coordinates import KafkaCoordinates
from airflow_eo.core.errors import KafkaUnavailableError, ReadIncompleteError
from airflow_eo.core.offsets import TopicPartition

TP = TopicPartition("orders", 0)


def batch(base: int, count: int, *, producer: int = -1, transactional: bool = False, control: bool = False,
          last_delta: int | None = None, magic: int = 2) -> bytes:
    """A record batch of ``count`` records at ``base``, its header then set as a broker's would be."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(transactional),
                                  producer_id=producer, producer_epoch=0 if producer >= 0 else -1,
                                  base_sequence=-1, batch_size=1 << 20)
    for i in range(count):
        b.append(i, timestamp=0, key=None, value=b"v", headers=[])
    out = bytearray(b.build())
    struct.pack_into(">q", out, 0, base)
    struct.pack_into(">b", out, 16, magic)
    if control:
        attributes = struct.unpack_from(">h", out, 21)[0]
        struct.pack_into(">h", out, 21, attributes | batches.CONTROL)
    if last_delta is not None:  # compaction keeps the last offset delta and drops records
        struct.pack_into(">i", out, 23, last_delta)
    return bytes(out)


def test_a_plain_batch_gives_its_offsets_clipped_to_the_span_and_the_offset_after_it():
    data = batch(100, 5) + batch(105, 3)
    assert batch_spans(data, 102, 107, ()) == ([(102, 105), (105, 107)], 108)
    assert batch_spans(data, 0, 1000, ()) == ([(100, 105), (105, 108)], 108)


def test_a_batch_cut_off_by_the_fetch_waits_for_the_next_one():
    data = batch(0, 4) + batch(4, 4)
    assert batch_spans(data[:-3], 0, 100, ()) == ([(0, 4)], 4)
    assert batch_spans(data[:30], 0, 100, ()) == ([], None)


def test_aborted_transactions_and_markers_are_not_delivered_and_the_next_transaction_is():
    data = (batch(0, 2, producer=7, transactional=True) + batch(2, 1, producer=7, transactional=True, control=True)
            + batch(3, 2, producer=7, transactional=True) + batch(5, 1, producer=7, transactional=True, control=True)
            + batch(6, 2, producer=8, transactional=True))
    # producer 7 aborted its first transaction (0-1, marker 2) and committed its second (3-4, marker 5)
    assert batch_spans(data, 0, 100, [(7, 0)]) == ([(3, 5), (6, 8)], 8)
    assert batch_spans(data, 0, 100, ()) == ([(0, 2), (3, 5), (6, 8)], 8)  # nothing aborted: markers only


def test_an_aborted_transaction_open_across_two_fetches_stays_aborted_in_the_second():
    open_aborted: set[int] = set()
    assert batch_spans(batch(0, 2, producer=7, transactional=True), 0, 100, [(7, 0)], open_aborted) == ([], 2)
    assert open_aborted == {7}
    rest = batch(2, 1, producer=7, transactional=True) + batch(3, 1, producer=7, transactional=True, control=True) \
        + batch(4, 1)
    assert batch_spans(rest, 2, 100, (), open_aborted) == ([(4, 5)], 5) and open_aborted == set()


def test_a_batch_compaction_emptied_delivers_nothing_and_one_it_thinned_outside_the_span_is_not_read():
    data = batch(0, 0, last_delta=3) + batch(4, 2, last_delta=4) + batch(9, 2)  # 0-3 emptied, 4-8 thinned
    assert batch_spans(data, 0, 4, ()) == ([], 4)  # the span ends before the thinned batch: not read
    assert batch_spans(data, 9, 20, ()) == ([(9, 11)], 11)
    with pytest.raises(NeedRecords, match="compaction"):
        batch_spans(data, 0, 20, ())


def test_the_read_stops_at_the_spans_end_though_the_response_goes_on():
    data = batch(0, 3) + batch(3, 3) + b"\x00" * 40  # past the end: not even looked at
    assert batch_spans(data, 0, 3, ()) == ([(0, 3)], 3)


@pytest.mark.parametrize("data, cause", [
    (struct.pack(">qib", 0, 20, 0) + b"\x00" * 3 + b"\x02" + b"\x00" * 20, "shorter than its header"),
    (batch(0, 3, last_delta=5), "compaction"),  # 3 records left of offsets 0-5
    (batch(0, 3, magic=1), "format v1"),
])
def test_a_thinned_or_old_format_batch_needs_the_record_read(data, cause):
    with pytest.raises(NeedRecords, match=cause) as raised:
        batch_spans(data, 0, 100, ())
    assert not raised.value.whole_connection


def test_client_options_speak_plaintext_sasl_and_tls_and_ignore_librdkafka_tuning():
    assert client_options({"bootstrap.servers": "a:9092, b:9092", "log_level": 3, "fetch.wait.max.ms": 10,
                           "receive.message.max.bytes": 1 << 30, "group.id": "x", "isolation.level": "read_committed",
                           "client.id": "me"}) == {
        "bootstrap_servers": ["a:9092", "b:9092"], "security_protocol": "PLAINTEXT", "client_id": "me"}
    sasl = client_options({"bootstrap.servers": "a:9092", "security.protocol": "sasl_ssl",
                           "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p",
                           "ssl.endpoint.identification.algorithm": "none"})
    assert sasl is not None and sasl["sasl_mechanism"] == "SCRAM-SHA-512" and sasl["sasl_plain_password"] == "p"
    assert sasl["security_protocol"] == "SASL_SSL" and sasl["ssl_context"].check_hostname is False


@pytest.mark.parametrize("extra", [
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
    {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI", "sasl.username": "u"},
    {"oauth_cb": object()},
    {"ssl.ca.pem": "-----BEGIN CERTIFICATE-----"},
    {"security.protocol": "SSL", "ssl.keystore.location": "/ks.p12"},
    {"security.protocol": "SSL", "ssl.ca.location": "probe"},  # librdkafka's own search for CA files
])
def test_a_config_only_librdkafka_speaks_leaves_the_record_read(extra):
    assert client_options({"bootstrap.servers": "a:9092", **extra}) is None


class FakeRecords:
    def __init__(self):
        self.read: list[tuple[int, int]] = []

    def offsets(self, tp, start, end):
        self.read.append((start, end))
        return list(range(start, end))

    def close(self):
        pass


class FakeBatches(FakeRecords):
    def __init__(self, failure: NeedRecords | None):
        super().__init__()
        self.failure, self.closed = failure, False

    def offsets(self, tp, start, end):
        if self.failure is not None:
            raise self.failure
        return super().offsets(tp, start, end)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("failure, kept", [(None, True), (NeedRecords("compacted"), True),
                                           (NeedRecords("cannot connect", whole_connection=True), False)])
def test_the_coordinates_read_batches_and_fall_back_per_span_or_for_good(failure, kept):
    kafka = KafkaCoordinates({"bootstrap.servers": "127.0.0.1:9"})
    assert isinstance(kafka.batches, BatchOffsets)
    kafka.records, fake = FakeRecords(), FakeBatches(failure)
    kafka.batches = fake
    assert kafka.offsets(TP, 3, 6) == [3, 4, 5]
    assert kafka.records.read == ([] if failure is None else [(3, 6)])
    assert (kafka.batches is fake) is kept and fake.closed is not kept


def fetched(code: int, records: bytes = b"", stable: int = 10, version: int = 11):
    """A Fetch response of one partition, laid out as aiokafka's v11 (or v4) struct unpacks it."""
    part = (0, code, stable, stable, 0, [], -1, records) if version == 11 else (0, code, stable, stable, [], records)
    return SimpleNamespace(API_VERSION=version, topics=[("orders", [part])])


class FakeClient:
    """aiokafka's client at its boundary: a leader per partition and one response per ``send``."""

    def __init__(self, *responses):
        self.responses, self.sent, self.refreshed = list(responses), [], 0
        self.cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)

    async def send(self, node, request):
        self.sent.append(request)
        return self.responses.pop(0)

    async def force_metadata_update(self):
        self.refreshed += 1

    async def close(self):
        pass


def reader(*responses, stall: float = 60.0) -> tuple[BatchOffsets, FakeClient]:
    offsets = BatchOffsets({"bootstrap_servers": ["127.0.0.1:9"]}, stall_timeout=stall)
    offsets._client = client = FakeClient(*responses)
    return offsets, client


@pytest.mark.parametrize("version", [4, 11])
def test_a_span_is_fetched_to_its_end_or_the_partitions(version):
    offsets, client = reader(fetched(0, batch(0, 4), version=version), fetched(0, batch(4, 4), version=version))
    try:
        assert offsets.offsets(TP, 1, 6).tolist() == [1, 2, 3, 4, 5] and len(client.sent) == 2
        offsets._client = FakeClient(fetched(0, batch(0, 4), stable=4), fetched(0, b"", stable=4))
        assert offsets.offsets(TP, 0, 10).tolist() == [0, 1, 2, 3]  # an empty fetch at the stable end: done
    finally:
        offsets.close()


def test_fetch_errors_end_the_read_with_the_audits_errors():
    offsets, _ = reader(fetched(1))  # OFFSET_OUT_OF_RANGE: retention took the span while it was read
    with pytest.raises(ReadIncompleteError, match="run the audit again"):
        offsets.offsets(TP, 0, 5)
    offsets._client = FakeClient(fetched(29))  # TOPIC_AUTHORIZATION_FAILED: no retry mends it
    with pytest.raises(KafkaUnavailableError, match="TopicAuthorizationFailedError"):
        offsets.offsets(TP, 0, 5)
    offsets._client = client = FakeClient(fetched(6), fetched(0, batch(0, 5)))  # NOT_LEADER: new metadata, again
    assert offsets.offsets(TP, 0, 5).tolist() == [0, 1, 2, 3, 4] and client.refreshed == 1
    offsets.close()


def test_a_partition_that_delivers_nothing_below_its_stable_end_stalls_into_an_error():
    offsets, _ = reader(*[fetched(0, b"", stable=10)] * 5, stall=0.15)
    with pytest.raises(KafkaUnavailableError, match="delivered nothing of orders\\[0\\] 0..5"):
        offsets.offsets(TP, 0, 5)
    offsets.close()
