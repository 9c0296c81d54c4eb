"""The sink interface: one table and what happens to a batch in it, whatever its write mode.

A sink plugs into the protocol's steps, it does not copy them: the plan, its log, the read, the
staging and the compare-and-set commit (:func:`airflow_eo.table.commit.commit`) and its verify each
stay in one place; a sink says, for its write mode, what they check, stage, compare and set:

* **spec checks** live in the sink's half of the spec (:class:`airflow_eo.spec.SinkSpec`);
* **the table's checks and mark**: :meth:`Sink.check_table` (a table keeps the write mode its first
  batch had), :meth:`Sink.check_plan` (before a planned batch runs), :meth:`Sink.check_reprocess`;
* **the stage step**: :attr:`Sink.direct` (whether the read tasks may stage its rows themselves, the
  direct path) and :attr:`Sink.stage`, its Spark step in the driver (the Spark glue it needs lives
  there: see ``docs/development.md``);
* **the commit rules** for ingest and reprocess: :meth:`Sink.ingest_rule`, :meth:`Sink.reprocess_rule`
  (the actions a commit adds and removes, its ``txn`` marks, its metadata);
* **findings and result counts**: :meth:`Sink.findings` (what its commit records beyond the rows),
  :meth:`Sink.result_counts` (what a run's result adds, from a commit's record);
* **the audit's check**: :attr:`Sink.rows_keep_offsets` (one row per delivered offset, compared offset
  by offset, or not).

The registry (:mod:`airflow_eo.sinks.registry`) lists each sink class once, by its :attr:`Sink.kind`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.spec import SinkSpec, WriteMode
from airflow_eo.table.commit import CommitRule, StagedBatch
from airflow_eo.table.features import TableUse
from airflow_eo.table.app_ids import merge_mark
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, BatchMetadata, DeadLetterManifest, LateRecords


class Sink:
    """One table and what happens to a batch in it (see the module). Subclasses set the class
    attributes and override the steps their write mode changes; the defaults are an append's."""

    kind: ClassVar[str]  # its name in the registry: the write mode, dedup (an append that drops repeated keys) apart
    write_mode: ClassVar[WriteMode] = WriteMode.APPEND  # what its commits record (BatchMetadata.write_mode)
    # its Spark step, "module:Class" (the driver's layer, above the sinks: imported where a batch runs through Spark)
    stage: ClassVar[str] = "airflow_eo.driver.append:SparkStage"
    table_note: ClassVar[str] = ""  # what `airflow-eo status` says of its table ("": nothing)
    use: ClassVar[TableUse]  # what its batches do to the table (what the table's features are checked for)
    direct: ClassVar[bool] = True  # its rows may be staged by the read tasks themselves (the direct path)
    rows_keep_offsets: ClassVar[bool] = True  # the audit compares its rows offset by offset

    def __init__(self, spec: SinkSpec):
        self.spec = spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.table_uri!r})"

    # -- the table's checks and mark -------------------------------------------------------------
    def check_table(self, ledger: Ledger, ingest_id: str) -> None:
        """The table was written the way this sink writes (its mark); a new table passes."""
        check_mark(ledger, ingest_id, None)

    def check_plan(self, ledger: Ledger, plan: BatchPlan) -> None:
        """What a planned batch must satisfy before it runs, beyond the offsets (nothing here)."""

    def check_reprocess(self, ledger: Ledger, plan: BatchPlan, last: int) -> None:
        """Whether batch ``plan.batch`` of a table whose newest batch is ``last`` can be reprocessed."""

    # -- what the commit records -----------------------------------------------------------------
    def findings(self, attempt: Attempt, dead_letters: DeadLetterManifest | None = None, dropped: int | None = None,
                 late: LateRecords | None = None, reader_schemas=()) -> BatchFindings:
        """What ``attempt``'s commit records beyond its rows (:meth:`BatchFindings.of`)."""
        return BatchFindings.of(attempt, dead_letters, None, late, reader_schemas)

    # -- the commit rules ------------------------------------------------------------------------
    def ingest_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                    extra: Any = None) -> CommitRule:
        """The rule that commits a new batch (``extra``: what the sink's stage step handed on)."""
        raise NotImplementedError

    def reprocess_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                       extra: Any = None) -> CommitRule:
        """The rule that replaces a committed batch's rows."""
        raise NotImplementedError

    def boundaries_rule(self, staged: StagedBatch, attempt: Attempt) -> CommitRule:
        """The rule that commits an interval without records: its boundaries and offsets, no rows."""
        raise NotImplementedError

    def rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings, extra: Any = None) -> CommitRule:
        """The commit rule of ``attempt``'s kind."""
        make = self.reprocess_rule if attempt.kind is AttemptKind.REPROCESS else self.ingest_rule
        return make(staged, attempt, findings, extra)

    # -- what a run's result and the plan preview say ----------------------------------------------
    @property
    def sends_dead_letters(self) -> bool:
        """Whether its stage step sends records to the dead letters (beyond undecodable ones and rule violations)."""
        return False

    def describe(self) -> str:
        """How the sink writes, for the plan preview (``append``, ``merge by id``)."""
        return self.describe_mode(self.spec.merge.key)

    @classmethod
    def describe_mode(cls, key: tuple[str, ...] = ()) -> str:
        """How a sink of this class writes (``key``: its merge key)."""
        return cls.write_mode.value

    @classmethod
    def result_counts(cls, meta: BatchMetadata | None) -> dict[str, Any]:
        """What a run's result adds from the commit's record (beyond rows, files, dead letters...)."""
        return {}

    @classmethod
    def row_changes(cls, meta: BatchMetadata) -> tuple[int, int] | None:
        """The rows a commit of this sink added and removed by key, for the audit's sum of a table's rows
        (None: its rows are its records', which the audit tiles by offset instead)."""
        return None

    @classmethod
    def counts_text(cls, summary: Mapping[str, Any]) -> str:
        """Those counts in a run's log line, from its result's dict ("": nothing to add)."""
        return ""

    @classmethod
    def counts_facet(cls, summary: Mapping[str, Any]) -> dict[str, int] | None:
        """Those counts in the run's OpenLineage facet (None: it has none)."""
        return None

    @classmethod
    def count_metrics(cls, summary: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
        """Those counts as the run's counters (metric name, value), from its result's dict."""
        return ()


def check_mark(ledger: Ledger, ingest_id: str, key: tuple[str, ...] | None) -> None:
    """A table keeps the write mode (and merge key) its first batch had: appended batches are
    events keyed by offset, a merge table holds one row per key, and neither can be turned into the
    other (the first merge batch marks the table: :func:`~airflow_eo.table.app_ids.merge_app_id`). ``key``: the merge key the
    batch merges by, None for a batch that appends."""
    mark = ledger.write_mark(ingest_id)
    if mark is None:
        return
    if not mark and key is not None:
        raise ConfigError(
            f"{ledger.table_uri} holds appended batches of ingest {ingest_id} (write_mode='append'): a merge "
            "table keeps one row per key from its first batch on, so write_mode='merge' needs a new table; give "
            "another table_uri (or keep write_mode='append'); nothing was changed")
    if mark and key is None:
        raise ConfigError(
            f"{ledger.table_uri} is a merge table of ingest {ingest_id} (one row per key): appending records to "
            "it would break that; keep write_mode='merge' with its merge_key, or append to another table; "
            "nothing was changed")
    if mark and key is not None and mark != merge_mark(key):
        recorded = next((b.meta.merge for b in ledger.batches(ingest_id) if b.meta.merge is not None), None)
        was = f" (it is {list(recorded.key)})" if recorded else ""
        raise ConfigError(
            f"merge_key {list(key)} is not the key {ledger.table_uri} was merged by{was}: a table keeps its "
            "key, since each key has one row; give the table's merge_key, or merge into a new table; nothing "
            "was changed")
