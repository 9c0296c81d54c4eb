"""What a run did: the result every kind of run returns (the operator's XCom), built in one place."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field, replace

from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan
from airflow_eo.sinks import recorded_sink
from airflow_eo.table.ledger import BatchRecord


@dataclass(frozen=True)
class IngestResult:
    """What a run did; ``to_dict()`` is the operator's XCom and Asset event extra."""

    status: RunStatus
    ingest_id: str
    table_uri: str
    run_key: str
    batch: int | None = None
    version: int | None = None
    attempt_id: str | None = None
    ranges: list[dict] = field(default_factory=list)
    rows: int = 0
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    spark_started: bool = False
    files: int = 0  # data files the commit added
    bytes: int = 0  # and their size
    dead_letters: int = 0  # records of the batch written to the dead-letter table instead
    seconds: float = 0.0  # the run's wall time (planning to verified commit)
    interval: dict | None = None  # interval mode: {"start_ms", "end_ms"} of the run's data interval
    late_records: int = 0  # interval mode: records of the batch whose timestamp is before the interval
    duplicates: int = 0  # dedup_key: records of the batch dropped as duplicates (their offsets are consumed)
    write_mode: str = "append"  # merge: the batch upserted and deleted rows by key (the counts below)
    inserted: int = 0  # merge: rows of new keys
    updated: int = 0  # merge: rows replaced by their key's new row
    deleted: int = 0  # merge: rows removed by their key's delete
    files_rewritten: int = 0  # merge: table files replaced by copies without the changed keys' rows

    def to_dict(self) -> dict:
        return {**asdict(self), "status": RunStatus(self.status).value}  # plain strings in XCom and JSON

    def timed(self, started: float) -> "IngestResult":
        """This result with the run's wall time since ``started`` (``time.monotonic()``)."""
        return replace(self, seconds=round(time.monotonic() - started, 3))


def build_result(status: RunStatus, plan: BatchPlan, record: BatchRecord | None, *, table_uri: str,
                 lag: dict[str, int], spark_started: bool = False, version: int | None = None) -> IngestResult:
    """The result of every kind of run, from the plan it ran and the commit that holds its batch
    (``record``; None when nothing was committed or the log no longer holds its details): its
    batch number and ranges are the commit's (an interval batch may be rebased at commit, or
    committed by another run). ``version``: the table version to report when there is no record."""
    meta = record.meta if record is not None else None
    return IngestResult(
        status=RunStatus(status), ingest_id=plan.ingest_id, table_uri=table_uri, run_key=plan.run.run_key,
        batch=(meta.batch if meta else plan.batch) if status is not RunStatus.NOTHING_NEW else None,
        version=record.version if record is not None else version,
        attempt_id=meta.attempt_id if meta else (plan.attempt_id or None),
        ranges=[asdict(r) for r in (meta.ranges if meta and meta.ranges else plan.ranges) if r.size],
        rows=meta.rows if meta else 0,
        rows_per_partition=dict(meta.rows_per_partition) if meta else {},
        lag=dict(lag),  # every kind of result says how far behind the table is
        spark_started=spark_started,
        files=meta.files if meta else 0,
        bytes=meta.bytes if meta else 0,
        dead_letters=meta.dead_letter_records if meta else 0,
        interval=asdict(plan.interval) if plan.interval else None,
        late_records=meta.late_records if meta else 0,
        duplicates=meta.duplicate_records if meta else 0,
        **(recorded_sink(meta.write_mode).result_counts(meta) if meta else {}),
    )


_EXIT_CODE = re.compile(r"(?:[Ee]rror code is|exit(?:ed with)? code)[: ]+(-?\d+)")


def short_cause(error: BaseException) -> str:
    """One line on why a job failed: a spark-submit failure's exit code, not its command line."""
    text = str(error)
    code = _EXIT_CODE.search(text)
    if code and ("spark-submit" in text or "Cannot execute" in text):
        return f"spark-submit exited with code {code.group(1)}"
    return f"{error.__class__.__name__}: {(text.strip().splitlines() or [''])[0][:300]}"
