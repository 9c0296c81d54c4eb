"""The audit's fast Kafka read: offsets from record-batch headers, not from each record.

A ``read_committed`` consumer delivers a record batch's records unless the batch is a
transaction marker or belongs to an aborted transaction; which records a batch holds its
61-byte header says (base offset, last offset delta, record count, producer, attributes) —
Kafka's record-batch format v2, fixed since Kafka 0.11. So the audit fetches record
batches with aiokafka's client (connection, authentication, the Fetch request) and reads
only their headers: no record is parsed or decompressed and no Python object is made
per record. That is the same answer as the per-record read
(:class:`airflow_eo.audit.coordinates.RecordOffsets`) at a fraction of its CPU.

A batch's header settles its offsets only when its records are contiguous (record count =
last offset delta + 1: a batch compaction has thinned is not) and it is format v2. Any
other batch raises :class:`NeedRecords` and the caller reads that span record by record; so
does a connection config this client cannot speak (:func:`client_options` returns None).

Example::

    >>> spans, nxt = batch_spans(b"", 0, 10, ())
    >>> spans, nxt
    ([], None)
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from airflow_eo.audit import read_failed, retention_took, stalled
from airflow_eo.core.offsets import TopicPartition

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
HEADER = struct.Struct(">qiibIhiqqqhii")
PREFIX = struct.Struct(">qi")  # baseOffset, batchLength: what every format begins with
LOG_OVERHEAD = 12  # baseOffset and batchLength precede the batchLength bytes
MAGIC_AT = 16
TRANSACTIONAL, CONTROL = 0x10, 0x20  # attribute bits
FETCH_MAX_BYTES = 32 * 1024 * 1024  # per fetch: Kafka returns at least one whole batch even when larger
_NONE = np.array([], dtype=np.int64)
# librdkafka keys that only tune librdkafka itself (buffers, logging, timeouts): the batch read ignores them
_TUNING_PREFIXES = ("fetch.", "queued.", "socket.", "receive.message.", "log", "debug", "statistics.",
                    "enable.", "auto.", "group.", "isolation.level", "session.timeout", "api.version",
                    "broker.version", "topic.metadata", "metadata.", "reconnect.", "retry.", "check.crcs",
                    "client.id", "client.rack", "partition.assignment", "heartbeat.", "max.poll")


class NeedRecords(Exception):
    """This span (or this connection) needs the per-record read; ``reason`` says why, without values."""

    def __init__(self, reason: str, whole_connection: bool = False):
        super().__init__(reason)
        self.whole_connection = whole_connection


def client_options(config: Mapping[str, object]) -> dict[str, Any] | None:
    """aiokafka client options for a librdkafka config, or None when it names something the
    batch read cannot do the same way (OAUTHBEARER, Kerberos, callbacks, PEM strings…)."""
    servers = [s.strip() for s in str(config["bootstrap.servers"]).split(",") if s.strip()]
    options: dict[str, Any] = {"bootstrap_servers": servers}
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "PLAIN"))).upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        return None
    options["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") or "sasl.username" not in config:
            return None
        options.update(sasl_mechanism=mechanism, sasl_plain_username=str(config["sasl.username"]),
                       sasl_plain_password=str(config.get("sasl.password", "")))
    if protocol.endswith("SSL"):
        from aiokafka.helpers import create_ssl_context

        key_password = config.get("ssl.key.password")
        try:
            context = create_ssl_context(cafile=config.get("ssl.ca.location"),  # None: the system's CAs, as librdkafka
                                         certfile=config.get("ssl.certificate.location"),
                                         keyfile=config.get("ssl.key.location"),
                                         password=None if key_password is None else str(key_password))
        except (OSError, ValueError):  # e.g. librdkafka's ssl.ca.location "probe": librdkafka reads it
            return None
        if str(config.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
            context.check_hostname = False
        options["ssl_context"] = context
    handled = {"bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username",
               "sasl.password", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
               "ssl.key.password", "ssl.endpoint.identification.algorithm"}
    for key, value in config.items():
        if key not in handled and not key.startswith(_TUNING_PREFIXES) and value is not None:
            return None  # e.g. oauth_cb, ssl.ca.pem, sasl.kerberos.*: librdkafka's own read does these
    if "client.id" in config:
        options["client_id"] = str(config["client.id"])
    return options


def batch_spans(buffer: bytes | memoryview, start: int, end: int, aborted: Iterable[Sequence[int]],
                aborted_producers: set[int] | None = None) -> tuple[list[tuple[int, int]], int | None]:
    """The offset spans ``[lo, hi)`` within ``[start, end)`` that a read_committed consumer is
    delivered from one fetch's record batches, and the offset after the last whole batch
    (None: no whole batch). ``aborted``: the fetch's aborted transactions, (producer id, first
    offset) pairs; ``aborted_producers`` carries the open aborted ones from one fetch to the next.

    >>> from aiokafka.record.default_records import DefaultRecordBatchBuilder as B
    >>> b = B(magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
    ...       base_sequence=-1, batch_size=1 << 20)
    >>> for i in range(5):
    ...     _ = b.append(i, timestamp=0, key=None, value=b"v", headers=[])
    >>> batch = bytearray(b.build()); struct.pack_into(">q", batch, 0, 100)  # the broker sets the base offset
    >>> batch_spans(bytes(batch), 102, 200, ())
    ([(102, 105)], 105)
    """
    pending = sorted(((int(p), int(first)) for p, first in aborted), key=lambda a: a[1])
    producers = set() if aborted_producers is None else aborted_producers
    spans: list[tuple[int, int]] = []
    pos, size, next_offset, i = 0, len(buffer), None, 0
    while pos + MAGIC_AT + 1 <= size:
        base, length = PREFIX.unpack_from(buffer, pos)
        if buffer[pos + MAGIC_AT] != 2:  # at the same place in the formats before v2
            raise NeedRecords(f"a message set of format v{buffer[pos + MAGIC_AT]} (before Kafka 0.11)")
        if length < HEADER.size - LOG_OVERHEAD:
            raise NeedRecords("a record batch shorter than its header")  # librdkafka names the damage
        if pos + LOG_OVERHEAD + length > size:
            break  # the fetch ended inside this batch: the next fetch starts at it
        _, _, _epoch, _, _crc, attributes, last_delta, _t0, _t1, producer, _pe, _seq, count = \
            HEADER.unpack_from(buffer, pos)
        pos += LOG_OVERHEAD + length
        last = base + last_delta
        # as Kafka's consumer: an aborted transaction counts from its first offset on …
        while i < len(pending) and pending[i][1] <= last:
            producers.add(pending[i][0])
            i += 1
        next_offset = last + 1
        if attributes & CONTROL:
            # … to its marker. A producer has one transaction open at a time, so the marker a
            # producer in this set writes next is its abort marker.
            producers.discard(producer)
        elif not (attributes & TRANSACTIONAL and producer in producers) and count:  # count 0: compacted empty
            lo, hi = max(base, start), min(last + 1, end)
            if hi > lo:
                if count != last_delta + 1:
                    raise NeedRecords("a record batch thinned by compaction")
                spans.append((lo, hi))
        if next_offset >= end:
            break  # the span is read: the rest of the response is past it
    return spans, next_offset


class BatchOffsets:
    """One aiokafka client on an event loop of its own; each call reads one span to its end.

    Not thread-safe: one thread at a time (the audit's slice runner hands each to one worker).
    """

    def __init__(self, options: Mapping[str, Any], stall_timeout: float = 60.0):
        self.options = dict(options)
        self.stall_timeout = stall_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None  # an aiokafka AIOKafkaClient, made on first use

    def close(self) -> None:
        if self._loop is not None:
            try:
                if self._client is not None:
                    self._loop.run_until_complete(self._client.close())
            finally:
                self._client = None
                self._loop.close()
                self._loop = None

    def offsets(self, tp: TopicPartition, start: int, end: int) -> np.ndarray:
        """As :meth:`airflow_eo.audit.coordinates.RecordOffsets.offsets`; raises :class:`NeedRecords`."""
        if end <= start:
            return _NONE
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        spans = self._loop.run_until_complete(self._read(tp, start, end))
        return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in spans]) if spans else _NONE

    async def _connect(self) -> Any:
        from aiokafka.client import AIOKafkaClient

        if self._client is None:
            client = AIOKafkaClient(**self.options, request_timeout_ms=30_000)
            try:
                await asyncio.wait_for(client.bootstrap(), timeout=min(30.0, self.stall_timeout))
            except Exception as exc:  # a config this client reads otherwise, an old broker: librdkafka's turn
                await client.close()
                raise NeedRecords(f"the batch reader could not connect ({type(exc).__name__})",
                                  whole_connection=True) from None
            self._client = client
        return self._client

    async def _read(self, tp: TopicPartition, start: int, end: int) -> list[tuple[int, int]]:
        from aiokafka import errors
        from aiokafka.protocol.fetch import FetchRequest
        from aiokafka.structs import TopicPartition as KTP

        client = await self._connect()
        ktp, offset = KTP(tp.topic, tp.partition), start
        spans: list[tuple[int, int]] = []
        producers: set[int] = set()  # open aborted transactions, carried from one fetch to the next
        last_progress = time.monotonic()
        while offset < end:
            failure: str | None = None
            leader = client.cluster.leader_for_partition(ktp)
            if leader is None or leader == -1:
                failure = "no leader known"
            else:
                # max wait 0: the span is there already, and at the partition's end waiting gains nothing
                request = FetchRequest(0, 1, FETCH_MAX_BYTES, 1,  # isolation level 1: read_committed
                                       [(tp.topic, [(tp.partition, offset, FETCH_MAX_BYTES)])])
                try:
                    response = await client.send(leader, request)
                except errors.KafkaError as exc:
                    if not exc.retriable:
                        raise read_failed(tp, type(exc).__name__) from None
                    failure = type(exc).__name__
                else:
                    _topic, partitions = response.topics[0]
                    _partition, code, high, *rest = partitions[0]
                    error = errors.for_code(code)
                    if error is errors.OffsetOutOfRangeError:
                        raise retention_took(tp, start, end)
                    if error is not errors.NoError:
                        if not error.retriable:
                            raise read_failed(tp, error.__name__)
                        failure = error.__name__
                    else:
                        # v4: lso, aborted, records; v5-v10: lso, log start, aborted, records; v11: … replica, records
                        stable, aborted = rest[0], rest[1] if response.API_VERSION == 4 else rest[2]
                        found, after = batch_spans(rest[-1] or b"", offset, end, aborted or (), producers)
                        spans.extend(found)
                        if after is not None:
                            offset, last_progress = after, time.monotonic()
                            continue
                        if offset >= (stable if stable >= 0 else high):
                            break  # nothing after: a read_committed consumer is at the partition's end
                        failure = "an empty fetch below the last stable offset"
            if time.monotonic() - last_progress > self.stall_timeout:
                raise stalled(tp, start, end, self.stall_timeout, failure)
            await client.force_metadata_update()
            await asyncio.sleep(0.1)
        return spans
