"""The ledger: what a table has consumed, read from its own Delta log.

Consumed offsets live in Delta ``txn`` (SetTransaction) actions, one per topic-partition,
``appId = airflow-eo:<ingest_id>:<topic>:<partition>`` and ``version = next offset``.
A further ``txn`` (``airflow-eo:<ingest_id>:batch``) holds the last batch number.
``txn`` actions survive checkpoints and log cleanup; the batch details in commitInfo
(custom metadata) are lineage for recent batches and may be cleaned with the log.

Example::

    >>> from airflow_eo.ledger import Ledger
    >>> ledger = Ledger.open("/data/orders")          # doctest: +SKIP
    >>> ledger.committed_offsets("orders_raw", [TopicPartition("orders", 0)])  # doctest: +SKIP
    {TopicPartition(topic='orders', partition=0): 1500}
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterable

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from airflow_eo.errors import ConfigError, TableError
from airflow_eo.planning import OffsetRange, SkippedRange, TopicPartition
from airflow_eo.storage import is_local, normalize_table_uri

APP_PREFIX = "airflow-eo"
METADATA_KEY = "airflow_eo.batch"
_INGEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_ingest_id(ingest_id: str) -> str:
    if not isinstance(ingest_id, str) or not _INGEST_ID.match(ingest_id):
        raise ConfigError(
            f"ingest_id {ingest_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-' "
            "(it names the table's offsets in the Delta log, so keep it stable)"
        )
    return ingest_id


def partition_app_id(ingest_id: str, tp: TopicPartition) -> str:
    return f"{APP_PREFIX}:{ingest_id}:{tp.topic}:{tp.partition}"


def batch_app_id(ingest_id: str) -> str:
    return f"{APP_PREFIX}:{ingest_id}:batch"


@dataclass(frozen=True)
class BatchRecord:
    """One committed batch as recorded in the commit's metadata."""

    version: int
    ingest_id: str
    batch: int
    attempt_id: str
    run_key: str
    ranges: tuple[OffsetRange, ...]
    rows: int
    rows_per_partition: dict[str, int]
    skipped: tuple[SkippedRange, ...]
    operation: str
    timestamp_ms: int | None
    raw: dict

    @classmethod
    def from_commit_info(cls, info: dict) -> "BatchRecord | None":
        text = info.get(METADATA_KEY)
        if not text:
            return None
        meta = json.loads(text) if isinstance(text, str) else text
        return cls(
            version=int(info.get("version", -1)),
            ingest_id=meta["ingest_id"],
            batch=int(meta["batch"]),
            attempt_id=meta.get("attempt_id", ""),
            run_key=meta.get("run", {}).get("run_key", ""),
            ranges=tuple(OffsetRange(**r) for r in meta.get("ranges", [])),
            rows=int(meta.get("rows", 0)),
            rows_per_partition=dict(meta.get("rows_per_partition", {})),
            skipped=tuple(SkippedRange(**s) for s in meta.get("skipped", [])),
            operation=meta.get("operation", "ingest"),
            timestamp_ms=info.get("timestamp"),
            raw=meta,
        )


_OWN_ENTRIES = re.compile(r"^(_airflow_eo|_delta_log|b\d{8}-[0-9a-f]+)$")


def _refuse_foreign_directory(uri: str) -> None:
    """No Delta log, but other files: a plain Parquet/CSV folder, not a table to create."""
    if not is_local(uri) or not os.path.isdir(uri):
        return
    foreign = sorted(n for n in os.listdir(uri) if not _OWN_ENTRIES.match(n))
    if foreign:
        raise TableError(
            f"{uri} is not a Delta table (no _delta_log) but holds other files ({', '.join(foreign[:3])}"
            f"{', …' if len(foreign) > 3 else ''}): point table_uri at a Delta table or an empty/new "
            "directory; nothing was changed"
        )


class Ledger:
    """Read side of a table's ledger, pinned to one snapshot of the Delta log.

    A compare-and-set commit must check offsets and commit from the *same* snapshot:
    keep one ``Ledger`` for both and do not refresh it in between.
    """

    def __init__(self, table: DeltaTable | None, table_uri: str):
        self.table = table
        self.table_uri = table_uri

    @classmethod
    def open(cls, table_uri: str, storage_options: dict[str, str] | None = None) -> "Ledger":
        uri = normalize_table_uri(table_uri)
        try:
            table = DeltaTable(uri, storage_options=storage_options)
        except TableNotFoundError:
            _refuse_foreign_directory(uri)
            return cls(None, uri)
        except DeltaError as exc:  # a _delta_log that cannot be read
            raise TableError(
                f"{uri} has a Delta log that cannot be read ({str(exc).splitlines()[0]}): it is not a "
                "usable Delta table. Point table_uri at the right table or repair/move the log; "
                "nothing was changed"
            ) from exc
        return cls(table, uri)

    @property
    def exists(self) -> bool:
        return self.table is not None

    @property
    def version(self) -> int | None:
        return self.table.version() if self.table is not None else None

    def check_owner(self, ingest_id: str) -> None:
        """Refuse a path that holds a Delta table this ingest never wrote.

        Ownership is the ingest's batch counter in the log (a ``txn`` action, which
        survives log cleanup), so no table property is needed.
        """
        if self.table is None or self.table.transaction_version(batch_app_id(ingest_id)) is not None:
            return
        raise TableError(
            f"the Delta table at {self.table_uri} was not written by ingest_id {ingest_id!r} "
            "(another ingest id, or a table created elsewhere): use the ingest_id that created "
            "it, or another table path; nothing was changed"
        )

    def committed_offsets(
        self, ingest_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """Next offset to read per partition; ``None`` for partitions never committed."""
        if self.table is None:
            return {tp: None for tp in partitions}
        return {tp: self.table.transaction_version(partition_app_id(ingest_id, tp)) for tp in partitions}

    def last_batch(self, ingest_id: str) -> int:
        if self.table is None:
            return 0
        return self.table.transaction_version(batch_app_id(ingest_id)) or 0

    def batches(self, ingest_id: str, limit: int | None = 20) -> list[BatchRecord]:
        """Recent batches of ``ingest_id``, newest first (as far as the log still holds)."""
        if self.table is None:
            return []
        found = []
        for info in self.table.history(limit):
            record = BatchRecord.from_commit_info(info)
            if record is not None and record.ingest_id == ingest_id:
                found.append(record)
        return found

    def find_batch(
        self, ingest_id: str, *, attempt_id: str | None = None, run_key: str | None = None,
        batch: int | None = None, since_version: int = 0, operation: str | None = None,
    ) -> BatchRecord | None:
        """The newest commit that matches the given attempt, run or batch number."""
        if self.table is None:
            return None
        span = max(self.table.version() - since_version + 1, 1)
        # Recent commits first: the batch a retry or rerun looks for is almost always among
        # the newest, and reading the whole history costs a file per commit.
        window, searched = 16, 0
        while searched < span:
            window = min(window, span)
            for record in self.batches(ingest_id, limit=window):
                if (attempt_id is None or record.attempt_id == attempt_id) and \
                        (run_key is None or record.run_key == run_key) and \
                        (batch is None or record.batch == batch) and \
                        (operation is None or record.operation == operation):
                    return record
            searched, window = window, window * 16
        return None
