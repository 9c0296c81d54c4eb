"""Table maintenance that keeps the guarantees: checkpoints, log cleanup, the table's layout,
and the one table property that would lose offsets.

- **Checkpoint** (``DeltaTable.create_checkpoint``): the log up to now folded into one Parquet
  file, which holds the latest ``txn`` action of every appId — the ledger's offsets and batch
  counters. Planning then reads the checkpoint plus the commits after it.
- **Log cleanup** (``DeltaTable.cleanup_metadata``): JSON commits older than
  ``delta.logRetentionDuration`` (30 days by default) that a checkpoint covers are deleted.
  The offsets live on in the checkpoint; what goes is the commitInfo lineage of those old
  batches, so ``status`` no longer lists them and ``reprocess`` of such a batch is refused
  with a clear error instead of guessing.
- **Never** ``delta.setTransactionRetentionDuration``: with it Delta drops ``txn`` actions
  older than the duration from checkpoints, and with them the committed offsets — the next
  run would re-read from the start and duplicate. A table that sets it is refused
  (:meth:`~airflow_eo.table.ledger.Ledger.check_writable`) by ingestion and by maintenance.

- **Orphans**: staged files of attempts that ended without committing (the rule of
  :meth:`airflow_eo.table.staging.StagingArea.collect_orphans`; every ingest also does this).
- **Compaction** (``optimize.compact`` / ``z_order``) and **vacuum** (deltalake's, in its
  "lite" mode: only files a commit removed): see :func:`maintain` for why each is safe beside
  running ingests. Reprocess after compaction replaces a batch's rows by its offset ranges
  (:mod:`airflow_eo.table.commit`), not by its original files.

Maintenance takes the table's lease (:mod:`airflow_eo.table.lease`) like an ingest or a reprocess:
it queues behind a running batch instead of racing its commit (waiting up to
``MaintenancePlan.table_wait_timeout``, then going on: every step above is safe beside an ingest).

Example::

    >>> maintain("/data/orders", plan=MaintenancePlan(vacuum=False))  # doctest: +SKIP
    {'table_uri': '/data/orders', 'compaction': {...}, 'checkpoint_version': 812, ...}
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from deltalake.exceptions import CommitFailedError

from airflow_eo.core.errors import CommitConflictError, TableError, TableFeatureError
from airflow_eo.spec import DEFAULT_TABLE_WAIT_SECONDS
from airflow_eo.table.compaction import compact_mapped
from airflow_eo.table.features import TableUse
from airflow_eo.table.lease import Claim, LeasePurpose, TableLease, turn
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import DEFAULT_GRACE_SECONDS, KEPT_SUFFIX, collect_orphans

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_INTERVAL = 100  # delta-rs writes one itself every delta.checkpointInterval commits
SMALL_FILE_BYTES = 32 * 1024 * 1024  # below this average, many files slow readers: compaction is due
SMALL_FILES_DUE = 100


@dataclass(frozen=True)
class Layout:
    """How a table's files and log look, and which maintenance is due."""

    files: int
    bytes: int
    version: int
    last_checkpoint: int | None
    checkpoint_interval: int

    @property
    def average_file_bytes(self) -> int:
        return self.bytes // self.files if self.files else 0

    @property
    def versions_since_checkpoint(self) -> int:
        return self.version - (self.last_checkpoint if self.last_checkpoint is not None else -1)

    @property
    def due(self) -> list[str]:
        """What maintenance would help now (empty: nothing)."""
        out = []
        if self.files >= SMALL_FILES_DUE and self.average_file_bytes < SMALL_FILE_BYTES:
            out.append(f"compaction: {self.files} files averaging {self.average_file_bytes:,} bytes")
        if self.versions_since_checkpoint > self.checkpoint_interval:
            out.append(f"checkpoint: {self.versions_since_checkpoint} commits since the last one")
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "average_file_bytes": self.average_file_bytes,
                "versions_since_checkpoint": self.versions_since_checkpoint, "due": self.due}


def layout(ledger: Ledger) -> Layout:
    """The layout of the snapshot a :class:`~airflow_eo.table.ledger.Ledger` holds."""
    import pyarrow.compute as pc

    if ledger.table is None:
        raise TableError(f"there is no Delta table at {ledger.table_uri}")
    adds = ledger.add_actions()
    size = pc.sum(adds["size_bytes"]).as_py() if adds.num_rows else 0
    config = ledger.table.metadata().configuration
    interval = int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
    return Layout(adds.num_rows, int(size or 0), ledger.table.version(), _last_checkpoint(ledger), interval)


def _last_checkpoint(ledger: Ledger) -> int | None:
    location = ledger.location()
    text = location.read_text(location.join("_delta_log", "_last_checkpoint"))
    if not text:
        return None
    try:
        return int(json.loads(text)["version"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: readers list the log instead, and so do we


DEFAULT_RETAIN_HOURS = 168  # Delta's own default (delta.deletedFileRetentionDuration, 7 days)
DEFAULT_KEEP_DAYS = 30.0  # plan logs and attempt records: as long as Delta keeps its log by default


@dataclass(frozen=True)
class MaintenancePlan:
    """Which actions ``maintain`` runs; the default is all of them.

    >>> MaintenancePlan(compact=True, vacuum=False, checkpoint=False, cleanup_log=False)   # doctest: +SKIP
    """

    compact: bool = True
    z_order: tuple[str, ...] = ()
    target_file_bytes: int | None = None  # deltalake's default (100 MB) when None
    vacuum: bool = True
    retain_hours: int = DEFAULT_RETAIN_HOURS
    checkpoint: bool = True
    cleanup_log: bool = True
    prune_orphans: bool = True
    staging_grace_seconds: float = DEFAULT_GRACE_SECONDS
    prune_records: bool = True
    keep_days: float = DEFAULT_KEEP_DAYS
    table_wait_timeout: float = DEFAULT_TABLE_WAIT_SECONDS  # for the table's lease, while a run holds it

    def __post_init__(self):
        if self.z_order:  # Z-ordering is a compaction
            object.__setattr__(self, "compact", True)


def maintain(table_uri: str, storage_options: dict | None = None,
             plan: MaintenancePlan = MaintenancePlan(), run_key: str = "") -> dict:
    """Run ``plan`` on the table, holding its lease (``run_key``: the run that asks, for the lease
    holder status shows); returns what was done and the layout after.

    Safe beside running ingests: compaction rewrites committed rows into fewer files in one
    commit that touches no ``txn`` (a racing batch commit is rebased by Delta, or one of the
    two fails cleanly and is retried); vacuum deletes only files an earlier commit removed
    (never a staged file, which no commit mentions until it lands); a checkpoint describes a
    version already committed; log cleanup only removes commits a checkpoint covers.
    """
    ledger = Ledger.open(table_uri, storage_options)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and storage "
                         "options for object storage); nothing was changed")
    ledger.check_txn_retention()
    use = TableUse.COMPACT if plan.compact else TableUse.MAINTAIN
    ledger.check_features(use)  # refused before its lease is taken
    if plan.z_order and ledger.features.names.active:  # airflow-eo's own compaction packs, it does not sort
        raise TableFeatureError(f"the Delta table at {ledger.table_uri} uses column mapping, whose files deltalake's "
                                "OPTIMIZE refuses to rewrite: it is compacted by airflow-eo's own bin-packing, which "
                                "does not Z-order; compact without --z-order (z_order=()); nothing was changed")
    lease = TableLease(ledger.location(), storage_options, plan.staging_grace_seconds)
    try:
        with turn(lease, Claim(LeasePurpose.MAINTAIN, run_key), plan.table_wait_timeout):
            ledger = Ledger.open(table_uri, storage_options)  # the table as it is once its turn came
            ledger.check_features(use)  # another engine may have altered it meanwhile
            return _maintain(ledger, table_uri, storage_options, plan)
    except CommitFailedError as exc:
        raise CommitConflictError(f"maintenance of {ledger.table_uri} lost a race with another commit ({exc}); "
                                  "what it had committed before stays, the rest can be retried") from exc


def _maintain(ledger: Ledger, table_uri: str, storage_options: dict | None, plan: MaintenancePlan) -> dict:
    table = ledger.table
    assert table is not None  # maintain() refused a path without a table
    done: dict = {"table_uri": ledger.table_uri, "version_before": ledger.version}
    if plan.compact and ledger.features.names.active:  # deltalake's OPTIMIZE refuses column-mapped tables
        done["compaction"] = compact_mapped(ledger, plan.target_file_bytes)
    elif plan.compact:
        optimizer = table.optimize
        metrics = (optimizer.z_order(list(plan.z_order), target_size=plan.target_file_bytes) if plan.z_order
                   else optimizer.compact(target_size=plan.target_file_bytes))
        done["compaction"] = {k: metrics.get(k) for k in ("numFilesAdded", "numFilesRemoved", "totalConsideredFiles")}
        log.info("compacted %s: %s file(s) into %s", ledger.table_uri, metrics.get("numFilesRemoved"),
                 metrics.get("numFilesAdded"))
    if plan.vacuum:
        # full=False: only files the log removed (compaction, reprocess); a staged file of a
        # running attempt is in no commit, so no retention can make vacuum delete it
        removed = table.vacuum(retention_hours=plan.retain_hours, dry_run=False,
                               enforce_retention_duration=False, full=False)
        done["vacuum"] = {"files_deleted": len(removed), "retain_hours": plan.retain_hours}
        log.info("vacuumed %s: %s file(s) removed more than %s h ago deleted", ledger.table_uri, len(removed),
                 plan.retain_hours)
    if plan.checkpoint:
        table.update_incremental()
        table.create_checkpoint()
        done["checkpoint_version"] = table.version()
        log.info("checkpointed %s at version %s", ledger.table_uri, table.version())
    if plan.cleanup_log:
        before = _log_files(ledger)
        table.cleanup_metadata()
        done["log_files_removed"] = before - _log_files(ledger)
        log.info("removed %s expired log file(s) of %s", done["log_files_removed"], ledger.table_uri)
    if plan.prune_orphans:  # staged files of attempts that ended without committing (never a running one)
        done["orphans_removed"] = collect_orphans(ledger.table_uri, storage_options, plan.staging_grace_seconds)
    after = Ledger.open(table_uri, storage_options)  # one snapshot of the table as maintained
    if plan.prune_records:
        done["records_removed"] = prune_records(after, plan.keep_days)
    done["layout"] = layout(after).to_dict()
    return done


def prune_records(ledger: Ledger, keep_days: float, now: float | None = None) -> dict[str, int]:
    """Delete airflow-eo's own records beside the table that are older than ``keep_days`` and
    that nothing needs any more: plan logs of committed (or abandoned) batches, finished
    reprocess requests, and markers of ended attempts whose files are gone.

    What that gives up: a *clear* of a run older than ``keep_days`` no longer finds its plan,
    so it plans anew and takes the next range like a new run (never a duplicate: the offsets
    decide). A plan of a batch not yet in the table, a reprocess not yet done, and the marker of
    an attempt whose directory still exists are always kept.
    """
    import time

    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.table.plan_log import PLANS_DIR, REPROCESS_DIR
    from airflow_eo.table.staging import ATTEMPTS_DIR

    location = ledger.location()
    cutoff = (time.time() if now is None else now) - keep_days * 86400
    dirs = {d.base_name for d in location.list_dirs(location.root)}

    def old_records(directory: str):
        for info in location.list_files(location.join(directory)):
            if info.base_name.endswith(".json") and info.mtime is not None and info.mtime.timestamp() < cutoff:
                text = location.read_text(info.path)
                try:
                    yield info.path, json.loads(text) if text else {}
                except ValueError:
                    yield info.path, {}  # unreadable: nothing can replay from it

    def plan_done(record: dict) -> bool:  # its batch number is taken: by this plan, or by another run
        try:
            plan = BatchPlan.from_json(json.dumps(record))
        except (KeyError, TypeError, ValueError):
            return True  # unreadable: PlanLog.load ignores it too
        return plan.batch <= ledger.last_batch(plan.ingest_id)

    def data_files(directory: str) -> list:  # Spark's _SUCCESS and .crc files are no data
        return [i for i in location.list_files(location.join(directory))
                if i.base_name.endswith(".parquet") and not i.base_name.startswith((".", "_"))]

    def attempt_gone(record: dict) -> bool:  # ended, and no data file of it left (vacuumed or collected)
        ended = record.get("ended_at") is not None or record.get("committed")
        name = f"b{int(record.get('batch', 0)):08d}-{record.get('attempt_id', '')}"
        return bool(ended) and not any(d in dirs and data_files(d) for d in (name, name + KEPT_SUFFIX))

    from airflow_eo.table.audit_log import AUDITS_DIR, AuditLog

    newest_audits = AuditLog(location).newest_of_each()  # where the next audit starts, and what status shows
    removed = {"plans": 0, "reprocess_requests": 0, "attempt_markers": 0, "audits": 0}
    for directory, key, finished in ((PLANS_DIR, "plans", plan_done),
                                     (REPROCESS_DIR, "reprocess_requests", lambda r: not r or r.get("done")),
                                     (ATTEMPTS_DIR, "attempt_markers", attempt_gone),
                                     (AUDITS_DIR, "audits", lambda r: True)):
        for path, record in old_records(directory):
            if finished(record) and path not in newest_audits:
                location.fs.delete_file(path)
                removed[key] += 1
    log.info("pruned records older than %s days beside %s: %s", keep_days, ledger.table_uri, removed)
    return removed


def _log_files(ledger: Ledger) -> int:
    location = ledger.location()
    return len(location.list_files(location.join("_delta_log")))
