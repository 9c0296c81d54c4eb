"""The commit metadata of a batch (commitInfo ``airflow_eo.batch``): one builder, one reader of every version.

Every commit airflow-eo makes carries one JSON document under :data:`METADATA_KEY`; its
``operation`` names the :class:`CommitKind`. :class:`BatchMetadata` is that document typed:
:meth:`BatchMetadata.of` builds it (the driver after Spark and the quiet-interval commit
without Spark both go through :meth:`BatchFindings.of`), :meth:`BatchMetadata.to_json`
writes exactly the keys earlier versions wrote, and :meth:`BatchMetadata.from_json` reads
what any earlier version wrote (keys added later default to "none recorded").

Example::

    >>> meta = BatchMetadata.from_json('{"ingest_id": "orders", "batch": 3, "rows": 10}')
    >>> meta.operation, meta.files, meta.run.run_key, meta.dead_letter_records
    (<CommitKind.BATCH: 'ingest'>, 0, '', 0)
    >>> BatchMetadata.from_json(meta.to_json()) == meta
    True
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Iterable

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.core.planning import BatchPlan, ReaderSchema, reader_schemas_of
from airflow_eo.core.offsets import OffsetRange, RunIdentity, SkippedRange, TopicReset
from airflow_eo.spec.options import WriteMode
from airflow_eo.table.files import StagedFile

# The commitInfo key of every commit airflow-eo makes.
METADATA_KEY = "airflow_eo.batch"


class CommitKind(str, enum.Enum):
    """What a commit did; its value is the metadata's ``operation``."""

    BATCH = "ingest"
    REPROCESS = "reprocess"
    DEAD_LETTERS = "dead_letters"
    ADD_COLUMNS = "add_columns"  # schema evolution's own commit (airflow_eo.table.schema)

    def __str__(self) -> str:  # the value in messages and status output, as before
        return self.value


# Commits that hold a batch's rows (the others: dead letters, schema changes).
DATA_OPERATIONS = (CommitKind.BATCH, CommitKind.REPROCESS)


def _known(cls, values: dict) -> dict:
    """The keys of ``values`` that ``cls`` has: a later version's extra keys are not an error."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


@dataclass(frozen=True)
class DeadLetterManifest:
    """The dead-letter files a batch staged, which its dead-letter commit follows with."""

    uri: str
    files: tuple[StagedFile, ...] = ()

    @property
    def records(self) -> int:
        return sum(f.num_records for f in self.files)

    def to_dict(self) -> dict:
        return {"uri": self.uri, "files": [asdict(f) for f in self.files]}

    @classmethod
    def from_dict(cls, raw: dict) -> "DeadLetterManifest":
        return cls(raw.get("uri", ""), tuple(StagedFile(**_known(StagedFile, f)) for f in raw.get("files") or ()))


@dataclass(frozen=True)
class Duplicates:
    """dedup_key: records of the batch dropped as duplicates (their offsets are consumed)."""

    records: int = 0
    to_dead_letters: bool = False


@dataclass(frozen=True)
class LateRecords:
    """Interval mode: records of the batch whose timestamp is before its interval."""

    records: int = 0
    oldest_ms: int | None = None


@dataclass(frozen=True)
class ReprocessInfo:
    """A reprocess commit: the counter it moved on from and the files it replaced."""

    from_version: int
    removed_files: int = 0
    rewritten_shared_files: int = 0
    requested_by: RunIdentity | None = None

    def to_dict(self) -> dict:
        return {"from_version": self.from_version, "removed_files": self.removed_files,
                "rewritten_shared_files": self.rewritten_shared_files,
                "requested_by": asdict(self.requested_by) if self.requested_by else {}}

    @classmethod
    def from_dict(cls, raw: dict) -> "ReprocessInfo":
        by = raw.get("requested_by") or None
        return cls(int(raw.get("from_version", 0)), int(raw.get("removed_files", 0)),
                   int(raw.get("rewritten_shared_files", 0)), RunIdentity(**_known(RunIdentity, by)) if by else None)


@dataclass(frozen=True)
class MergeInfo:
    """write_mode=merge: what a batch did to the table's rows, counted by key, and to its files.

    ``changes``: the batch's records that took part in the merge (after dead letters and
    no-op events); ``inserted`` + ``updated`` rows were written, ``deleted`` rows removed
    (a delete of a key the table does not hold counts nowhere); ``files_rewritten``: table
    files the commit removed because they held a changed key, replaced by copies without
    those rows (``rows_rewritten`` rows copied). The commit's ``operation`` stays what it
    was (``ingest`` / ``reprocess``), so readers that know nothing of merging read the
    batch and its offsets as before and ignore this record.

    >>> MergeInfo(("id",), changes=5, inserted=2, updated=1, deleted=1).to_dict()["deleted"]
    1
    """

    key: tuple[str, ...]
    changes: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    files_rewritten: int = 0
    rows_rewritten: int = 0
    engine: bool = False  # committed by deltalake's MERGE: the counts are its operationMetrics

    def to_dict(self) -> dict:
        return {**asdict(self), "key": list(self.key)}

    def counted_by(self, metrics: dict | None) -> "MergeInfo":
        """With the counts of deltalake's MERGE (a commit's ``operationMetrics``), when it made the commit.

        >>> MergeInfo(("id",), 3, engine=True).counted_by({"num_target_rows_inserted": 2}).inserted
        2
        """
        if not self.engine or not metrics:
            return self
        count = lambda name: int(metrics.get(name) or 0)  # noqa: E731
        return replace(self, inserted=count("num_target_rows_inserted"), updated=count("num_target_rows_updated"),
                       deleted=count("num_target_rows_deleted"), files_rewritten=count("num_target_files_removed"),
                       rows_rewritten=count("num_target_rows_copied"))

    @classmethod
    def from_dict(cls, raw: dict) -> "MergeInfo":
        values = _known(cls, raw)
        return cls(**{**values, "key": tuple(values.get("key") or ())})


@dataclass(frozen=True)
class BatchFindings:
    """What an attempt found beyond its rows: dead letters, dropped duplicates, late records, and
    the registry reader schemas its records were decoded with (so a reprocess reads with them too)."""

    dead_letters: DeadLetterManifest | None = None
    duplicates: Duplicates | None = None
    late: LateRecords | None = None
    reader_schemas: tuple[ReaderSchema, ...] = ()

    @classmethod
    def of(cls, attempt: Attempt, dead_letters: DeadLetterManifest | None = None,
           duplicates: Duplicates | None = None, late: LateRecords | None = None,
           reader_schemas: Iterable[ReaderSchema] = ()) -> "BatchFindings":
        """What ``attempt``'s commit records (``duplicates``: a dedup sink's, see
        :meth:`airflow_eo.sinks.base.Sink.findings`): counts it did not measure (an empty batch) are
        zero, so a batch committed without Spark records what an empty Spark batch would."""
        return cls(
            dead_letters=dead_letters,
            duplicates=duplicates,
            # late records belong to the interval a batch first commits, not to a reprocess of it
            late=(late or LateRecords()) if attempt.plan.interval is not None
            and attempt.kind is AttemptKind.INGEST else None,
            reader_schemas=tuple(reader_schemas),
        )


@dataclass(frozen=True)
class BatchMetadata:
    """The commitInfo document of one commit (lineage only: never credentials or client config)."""

    ingest_id: str
    batch: int
    operation: CommitKind = CommitKind.BATCH
    files: int = 0  # data files the commit added
    bytes: int = 0  # and their size
    attempt_id: str = ""
    run: RunIdentity = field(default_factory=lambda: RunIdentity(""))
    planned_at: str = ""
    ranges: tuple[OffsetRange, ...] = ()
    rows: int = 0
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    skipped: tuple[SkippedRange, ...] = ()
    findings: BatchFindings = field(default_factory=BatchFindings)
    reprocess: ReprocessInfo | None = None
    added_columns: tuple[str, ...] = ()  # ADD_COLUMNS
    merge: MergeInfo | None = None  # write_mode=merge
    planned_batch: int | None = None  # an interval batch rebased at commit: the number it was planned (logged) with
    topic_ids: tuple[tuple[str, str], ...] = ()  # the ids of the topics read, where Kafka reports them
    resets: tuple[TopicReset, ...] = ()  # partitions of recreated topics read again from their start

    @classmethod
    def of(cls, kind: CommitKind, plan: BatchPlan, files: Iterable[StagedFile] = (),
           rows_per_partition: dict[str, int] | None = None, findings: BatchFindings | None = None,
           reprocess: ReprocessInfo | None = None, merge: MergeInfo | None = None) -> "BatchMetadata":
        """The metadata of ``plan``'s commit of ``files`` (the one builder of it)."""
        files, rows = tuple(files), dict(rows_per_partition or {})
        return cls(
            ingest_id=plan.ingest_id, batch=plan.batch, operation=kind, files=len(files),
            bytes=sum(f.size for f in files), attempt_id=plan.attempt_id, run=plan.run, planned_at=plan.planned_at,
            ranges=tuple(plan.ranges), rows=sum(rows.values()), rows_per_partition=rows, skipped=tuple(plan.skipped),
            findings=findings or BatchFindings(), reprocess=reprocess, merge=merge,
            topic_ids=tuple(plan.topic_ids) if kind is CommitKind.BATCH else (),
            resets=tuple(plan.resets) if kind is CommitKind.BATCH else (),
        )

    @property
    def run_key(self) -> str:
        return self.run.run_key

    @property
    def write_mode(self) -> WriteMode:
        """How the batch wrote its rows: a merge commit carries its merge record; commits written
        before write modes existed appended."""
        return WriteMode.MERGE if self.merge is not None else WriteMode.APPEND

    @property
    def dead_letter_records(self) -> int:
        return self.findings.dead_letters.records if self.findings.dead_letters else 0

    @property
    def late_records(self) -> int:
        return self.findings.late.records if self.findings.late else 0

    @property
    def duplicate_records(self) -> int:
        return self.findings.duplicates.records if self.findings.duplicates else 0

    def to_dict(self) -> dict:
        """The JSON document, key for key what earlier versions wrote for this kind."""
        head = {"ingest_id": self.ingest_id, "batch": self.batch, "operation": self.operation.value}
        if self.operation is CommitKind.DEAD_LETTERS:
            return {**head, "files": self.files}
        if self.operation is CommitKind.ADD_COLUMNS:
            return {**head, "added": list(self.added_columns)}
        out = {
            "files": self.files, "bytes": self.bytes, "ingest_id": self.ingest_id, "batch": self.batch,
            "attempt_id": self.attempt_id, "operation": self.operation.value, "run": asdict(self.run),
            "planned_at": self.planned_at, "ranges": [asdict(r) for r in self.ranges], "rows": self.rows,
            "rows_per_partition": dict(self.rows_per_partition), "skipped": [asdict(s) for s in self.skipped],
        }
        found = self.findings
        if found.dead_letters is not None:
            out["dead_letters"] = found.dead_letters.to_dict()
        if found.duplicates is not None:
            out["duplicates"] = asdict(found.duplicates)
        if found.late is not None:
            out["late"] = asdict(found.late)
        if found.reader_schemas:
            out["reader_schemas"] = [asdict(r) for r in found.reader_schemas]
        if self.reprocess is not None:
            out["reprocess"] = self.reprocess.to_dict()
        if self.merge is not None:
            out["merge"] = self.merge.to_dict()
        if self.planned_batch is not None:
            out["planned_batch"] = self.planned_batch
        if self.topic_ids:
            out["topic_ids"] = dict(self.topic_ids)
        if self.resets:
            out["resets"] = [asdict(r) for r in self.resets]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, meta: dict) -> "BatchMetadata":
        """Read what any version wrote; raises ValueError/KeyError/TypeError on a foreign document."""
        dead, dups, late = meta.get("dead_letters"), meta.get("duplicates"), meta.get("late")
        return cls(
            ingest_id=meta["ingest_id"], batch=int(meta["batch"]),
            operation=CommitKind(meta.get("operation", CommitKind.BATCH.value)),
            files=int(meta.get("files", 0)), bytes=int(meta.get("bytes", 0)),
            attempt_id=meta.get("attempt_id", ""), run=RunIdentity(**{"run_key": "", **_known(RunIdentity, meta.get("run") or {})}),
            planned_at=meta.get("planned_at", ""),
            ranges=tuple(OffsetRange(**r) for r in meta.get("ranges", [])), rows=int(meta.get("rows", 0)),
            rows_per_partition=dict(meta.get("rows_per_partition", {})),
            skipped=tuple(SkippedRange(**s) for s in meta.get("skipped", [])),
            findings=BatchFindings(
                dead_letters=DeadLetterManifest.from_dict(dead) if dead else None,
                duplicates=Duplicates(**_known(Duplicates, dups)) if dups is not None else None,
                late=LateRecords(**_known(LateRecords, late)) if late is not None else None,
                reader_schemas=reader_schemas_of(meta.get("reader_schemas")) or (),
            ),
            reprocess=ReprocessInfo.from_dict(meta["reprocess"]) if meta.get("reprocess") else None,
            added_columns=tuple(meta.get("added", ())),
            merge=MergeInfo.from_dict(meta["merge"]) if meta.get("merge") else None,
            planned_batch=int(meta["planned_batch"]) if meta.get("planned_batch") is not None else None,
            topic_ids=tuple((str(t), str(i)) for t, i in (meta.get("topic_ids") or {}).items()),
            resets=tuple(TopicReset(**_known(TopicReset, r)) for r in meta.get("resets", ())),
        )

    @classmethod
    def from_json(cls, text: str | dict) -> "BatchMetadata":
        return cls.from_dict(json.loads(text) if isinstance(text, str) else text)
