"""Running an audit: read the ledger, the table's coordinates, the dead letters and Kafka, then reconcile.

Only coordinates are read: ``topic``, ``partition``, ``offset`` of the table's files whose
stats may hold audited offsets (one Parquet file at a time, so memory follows the audited
partitions' offsets, not the table), and the offsets a ``read_committed`` consumer delivers
in each audited range (values are fetched by the client but never decoded). The comparison
is :mod:`airflow_eo.audit.findings`; the result is recorded beside the table
(:class:`airflow_eo.table.audit_log.AuditLog`).

Everything runs in this process; reading large ranges in Spark tasks is not done yet.

Example::

    >>> report = run_audit(AuditRequest("/data/orders", "orders_raw",
    ...                                 {"bootstrap.servers": "127.0.0.1:9092"}))   # doctest: +SKIP
    >>> report.exit_code                                                             # doctest: +SKIP
    0
"""

from __future__ import annotations

import enum
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

import numpy as np

from airflow_eo.audit.findings import (
    AuditReport, BatchRanges, Finding, PartitionScope, account_batches, check_tiling, reconcile_partition,
)
from airflow_eo.errors import ConfigError, KafkaUnavailableError, TableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.offsets import OffsetRange, PartitionBounds, TopicPartition
from airflow_eo.table.audit_log import AuditLog
from airflow_eo.table.ledger import Ledger, partition_app_id
from airflow_eo.table.metadata import CommitKind

log = logging.getLogger(__name__)

KEYS = ("topic", "partition", "offset")


class Selection(str, enum.Enum):
    SINCE_LAST_AUDIT = "since_last_audit"  # the default: batches committed after the last recorded audit
    ALL = "all"
    BATCHES = "batches"  # the newest N batches
    SINCE_VERSION = "since_version"  # batches whose commit is at or after table version V


@dataclass(frozen=True)
class AuditRequest:
    table_uri: str
    ingest_id: str
    kafka_config: Mapping[str, object]
    storage_options: Mapping[str, str] | None = None
    selection: Selection = Selection.SINCE_LAST_AUDIT
    value: int | None = None  # N for BATCHES, V for SINCE_VERSION
    dead_letter_table: str | None = None
    record: bool = True  # write the result beside the table
    kafka_timeout: float = 60.0


def batch_ranges(ledger: Ledger, ingest_id: str) -> list[BatchRanges]:
    """Each batch's newest data commit the log still holds (a reprocess replaces its ingest), by batch."""
    newest: dict[int, BatchRanges] = {}
    for rec in ledger.batches(ingest_id, limit=None):  # newest first
        if rec.batch in newest or rec.operation not in (CommitKind.BATCH, CommitKind.REPROCESS):
            continue
        dups = rec.meta.findings.duplicates
        newest[rec.batch] = BatchRanges(rec.batch, rec.version, tuple(rec.ranges), tuple(rec.skipped),
                                        dups.records if dups else 0, dups.to_dead_letters if dups else False)
    return [newest[b] for b in sorted(newest)]


def select(batches: list[BatchRanges], request: AuditRequest, since: int | None) -> list[BatchRanges]:
    """The batches to compare row by row (the tiling check always covers every batch)."""
    if request.selection is Selection.ALL:
        return batches
    if request.selection is Selection.BATCHES:
        if not request.value or request.value < 1:
            raise ConfigError(f"--batches {request.value} is not a positive number of batches: give e.g. --batches 10")
        return batches[-request.value:]
    if request.selection is Selection.SINCE_VERSION:
        return [b for b in batches if b.version >= (request.value or 0)]
    return batches if since is None else [b for b in batches if b.version > since]


def _open_table(uri: str, storage_options: Mapping[str, str] | None) -> Ledger:
    ledger = Ledger.open(uri, dict(storage_options) if storage_options else None)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and --storage-options "
                         "for object storage)")
    return ledger


def _filter_table(ledger: Ledger, ingest_id: str | None,
                  lowest: Mapping[TopicPartition, int]) -> tuple[dict[TopicPartition, np.ndarray], int]:
    """Offsets of the rows of ``ledger``'s table per partition, from ``lowest[tp]`` on (files pruned by
    their stats and partition values); with ``ingest_id`` only the rows of that ingest (dead letters)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    loc = ledger.location()
    actions = pa.table(ledger.table.get_add_actions(flatten=True)).to_pylist()
    parts: dict[TopicPartition, list[np.ndarray]] = {tp: [] for tp in lowest}
    rows = 0

    def value(row: dict, key: str, side: str):
        for name in (f"partition.{key}", f"{side}.{key}"):
            if row.get(name) is not None:
                return row[name]
        return None

    def may_hold(row: dict, tp: TopicPartition, low: int) -> bool:  # unknown bounds: yes
        t_lo, t_hi = value(row, "topic", "min"), value(row, "topic", "max")
        p_lo, p_hi = value(row, "partition", "min"), value(row, "partition", "max")
        o_hi = value(row, "offset", "max")
        return (t_lo is None or t_hi is None or t_lo <= tp.topic <= t_hi) and \
            (p_lo is None or p_hi is None or int(p_lo) <= tp.partition <= int(p_hi)) and \
            (o_hi is None or int(o_hi) >= low)

    for row in actions:
        if not any(may_hold(row, tp, low) for tp, low in lowest.items()):
            continue
        with loc.fs.open_input_file(loc.join(row["path"])) as f:
            pf = pq.ParquetFile(f)
            present = [k for k in (*KEYS, "ingest_id") if k in pf.schema_arrow.names]
            for batch in pf.iter_batches(columns=present, batch_size=262_144):
                t = pa.Table.from_batches([batch])
                for key in ("topic", "partition"):  # partition columns live in the log, not the file
                    if key not in present:
                        t = t.append_column(key, pa.array([row[f"partition.{key}"]] * t.num_rows))
                if ingest_id is not None and "ingest_id" in present:
                    t = t.filter(pc.equal(pc.cast(t["ingest_id"], pa.string()), ingest_id))
                topic_col = pc.cast(t["topic"], pa.string())  # deltalake's own writes use string_view
                for tp, low in lowest.items():
                    mask = pc.and_(pc.and_(pc.equal(topic_col, tp.topic),
                                           pc.equal(pc.cast(t["partition"], pa.int64()), tp.partition)),
                                   pc.greater_equal(t["offset"], low))
                    picked = pc.cast(t["offset"], pa.int64()).filter(mask).to_numpy()
                    if picked.size:
                        parts[tp].append(picked)
                        rows += picked.size
    return {tp: np.concatenate(v) if v else np.array([], dtype=np.int64) for tp, v in parts.items()}, rows


def _kafka_offsets(kafka: KafkaOffsets, spans: Mapping[TopicPartition, tuple[int, int]],
                   timeout: float) -> dict[TopicPartition, np.ndarray]:
    """The offsets a read_committed consumer delivers in ``[start, end)`` per partition. Aborted
    records and transaction markers are not delivered, so an offset Kafka skips stays absent."""
    from confluent_kafka import Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as KTP

    found: dict[TopicPartition, list[np.ndarray]] = {tp: [] for tp in spans}
    open_ = {tp for tp, (s, e) in spans.items() if e > s}
    if not open_:
        return {tp: np.array([], dtype=np.int64) for tp in spans}
    consumer = Consumer({**kafka.config, "group.id": "airflow-eo-audit", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "error"})
    try:
        consumer.assign([KTP(tp.topic, tp.partition, spans[tp][0]) for tp in sorted(open_)])
        deadline = time.monotonic() + timeout
        while open_:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"Kafka did not deliver the audited ranges of {', '.join(map(str, sorted(open_)))} within "
                    f"{timeout:.0f} s: check the broker is up and reachable; nothing was changed")
            got = []
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                tp = TopicPartition(message.topic(), message.partition())
                if tp not in open_:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_.discard(tp)
                        continue
                    raise KafkaUnavailableError(f"reading {tp} for the audit failed ({error.str()}): check the "
                                                "broker; nothing was changed")
                offset = message.offset()
                if offset < spans[tp][1]:
                    got.append((tp, offset))
                if offset >= spans[tp][1] - 1:
                    open_.discard(tp)
            by_tp: dict[TopicPartition, list[int]] = {}
            for tp, offset in got:
                by_tp.setdefault(tp, []).append(offset)
            for tp, offsets in by_tp.items():
                found[tp].append(np.array(offsets, dtype=np.int64))
    except KafkaException as exc:
        raise KafkaUnavailableError(f"reading Kafka for the audit failed ({exc}): check the broker; "
                                    "nothing was changed") from exc
    finally:
        consumer.close()
    return {tp: np.concatenate(v) if v else np.array([], dtype=np.int64) for tp, v in found.items()}


def run_audit(request: AuditRequest) -> AuditReport:
    """Audit ``request``'s batches; records the result beside the table unless told not to."""
    ledger = _open_table(request.table_uri, request.storage_options)
    ledger.check_owner(request.ingest_id)
    audits = AuditLog(ledger.location())
    last = audits.last(request.ingest_id) if request.selection is Selection.SINCE_LAST_AUDIT else None
    batches = batch_ranges(ledger, request.ingest_id)
    tps = sorted({r.tp for b in batches for r in b.ranges})
    txn = {tp: ledger.table.transaction_version(partition_app_id(request.ingest_id, tp)) for tp in tps}
    findings: list[Finding] = check_tiling(batches, txn)
    chosen = select(batches, request, last.through_version if last else None)
    audited: dict[TopicPartition, list[tuple[BatchRanges, OffsetRange]]] = {}
    for b in chosen:
        for r in b.ranges:
            if r.size > 0:
                audited.setdefault(r.tp, []).append((b, r))
    kafka = KafkaOffsets(dict(request.kafka_config), timeout=min(request.kafka_timeout, 30.0))
    topics = sorted({tp.topic for tp in audited})
    known = set(kafka.partitions(topics)) if topics else set()
    gone = sorted(set(audited) - known)
    if gone:
        raise KafkaUnavailableError(f"Kafka has no partition {', '.join(map(str, gone))} the table committed: "
                                    "check the bootstrap servers point at the table's cluster; nothing was changed")
    bounds: dict[TopicPartition, PartitionBounds] = kafka.bounds(sorted(audited)) if audited else {}
    scopes = {tp: PartitionScope(tp, bounds[tp].log_start, tuple(a)) for tp, a in audited.items()}
    spans = {}
    for tp, scope in scopes.items():
        checked = scope.checked()
        spans[tp] = (min(s for _, s, _ in checked), max(e for _, _, e in checked)) if checked else (0, 0)
    lowest = {tp: s.lowest for tp, s in scopes.items()}
    delivered = _kafka_offsets(kafka, spans, request.kafka_timeout)
    table_offsets, rows_read = _filter_table(ledger, None, lowest) if lowest else ({}, 0)  # the log loaded once
    dead: dict[TopicPartition, np.ndarray] = {}
    if request.dead_letter_table and lowest:
        dead, _ = _filter_table(_open_table(request.dead_letter_table, request.storage_options),
                                request.ingest_id, lowest)
    committed = {tp: [(r.start, r.end) for b in batches for r in b.ranges if r.tp == tp] for tp in scopes}
    results = [reconcile_partition(scope, delivered[tp], table_offsets[tp],
                                   dead.get(tp, np.array([], dtype=np.int64)), committed[tp])
               for tp, scope in sorted(scopes.items())]
    by_batch = {b.batch: b for b in batches}
    for res in results:
        findings.extend(res.findings)
    findings.extend(account_batches(results, by_batch))
    note = ""
    if batches and batches[0].batch > 1:
        note = (f"the Delta log no longer holds batches before {batches[0].batch} (log cleanup): ranges are "
                f"checked from batch {batches[0].batch} on")
    report = AuditReport(
        table_uri=ledger.table_uri, ingest_id=request.ingest_id, table_version=ledger.version or 0,
        batches=tuple(b.batch for b in chosen),
        through_version=max((b.version for b in chosen), default=last.through_version if last else -1),
        partitions=tuple(sorted(set(tps) | set(scopes))),
        findings=tuple(sorted(findings, key=lambda f: (f.tp, f.kind.value, f.start or 0))),
        checked_offsets=sum(r.checked_offsets for r in results), rows_read=rows_read,
        audited_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), note=note,
    )
    if request.record:
        text = json.dumps({**report.to_dict(), "summary": report.summary()})
        audits.record(request.ingest_id, report.audited_at, text)
    for f in report.findings:
        (log.warning if f.drift else log.info)("audit: %s", f)
    log.info("%s", report.summary())
    return report
