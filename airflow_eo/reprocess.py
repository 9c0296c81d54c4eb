"""Reprocess a past run: re-read exactly its logged ranges and replace its rows in one commit.

A run's plan is logged before Spark starts (:mod:`airflow_eo.plan_log`), and every attempt
writes into its own directory ``b<batch>-<attempt>/`` that holds only that batch's rows.
So the rows of a past run are exactly the table files under ``b<batch>-*/``, and a
reprocess is one Delta commit that **removes** those files and **adds** the new attempt's
files. The committed offsets and the batch counter do not move; other batches' rows are
not touched; readers see the old rows or the new ones, never both or neither.

Replay safety: each batch has a reprocess counter, a ``txn`` action
``airflow-eo:<ingest_id>:reprocess:<batch>`` that the commit compare-and-sets from *n* to
*n+1*. The request (batch, *n*) is logged per requesting run key before Spark starts, so a
retry of a reprocess replays the same request: if it already committed, the retry reports
that commit and starts nothing; it never replaces the rows twice. Two reprocesses racing
on one batch cannot both land.

Refused, with nothing changed: a run whose batch never committed (clear it without
``reprocess`` to replay it), a batch whose rows sit in files that are not one attempt's
directory (compacted/rewritten tables), and ranges Kafka no longer fully holds.

Example::

    >>> Reprocessor(Ingestion(config, submitter)).run(RunIdentity("dag/run/task/-1"))  # doctest: +SKIP
    IngestResult(status='reprocessed', batch=3, version=9, ...)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import asdict, dataclass, replace

import pyarrow as pa
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, RemoveAction, Transaction

from airflow_eo.commit import ALREADY_COMMITTED, COMMITTED, CommitOutcome, add_actions, batch_metadata, check_schema
from airflow_eo.errors import CommitConflictError, ConfigError, DataLossError, SparkJobError, TableError
from airflow_eo.ingest import NOTHING_NEW, IngestResult, Ingestion
from airflow_eo.ledger import APP_PREFIX, METADATA_KEY, Ledger
from airflow_eo.planning import BatchPlan, RunIdentity
from airflow_eo.staging import StagedFile, new_attempt_id

log = logging.getLogger(__name__)

REPROCESS_DIR = "_airflow_eo/reprocess"
REPROCESS_MODE = "reprocess"
REPROCESSED = "reprocessed"
ALREADY_REPROCESSED = "already_reprocessed"
_ATTEMPT_DIR = re.compile(r"^b(\d{8})-[0-9a-f]+$")


def reprocess_app_id(ingest_id: str, batch: int) -> str:
    return f"{APP_PREFIX}:{ingest_id}:reprocess:{batch}"


def reprocess_count(ledger: Ledger, ingest_id: str, batch: int) -> int:
    if ledger.table is None:
        return 0
    return ledger.table.transaction_version(reprocess_app_id(ingest_id, batch)) or 0


@dataclass(frozen=True)
class ReprocessRequest:
    """A reprocess asked for by ``requester_key``; replayed by that key's retries until done."""

    requester_key: str
    target_run_key: str
    batch: int
    from_version: int
    done: bool = False


def batch_files(ledger: Ledger, batch: int) -> dict[str, int]:
    """Paths (and sizes) of the table files holding ``batch``'s rows, by attempt directory.

    Raises when the table holds files outside attempt directories: a compaction or another
    writer may have mixed batches in one file, and removing it would drop other rows.
    """
    actions = pa.table(ledger.table.get_add_actions(flatten=True))
    found, foreign = {}, []
    for path, size in zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()):
        match = _ATTEMPT_DIR.match(path.split("/", 1)[0]) if "/" in path else None
        if match is None:
            foreign.append(path)
        elif int(match.group(1)) == batch:
            found[path] = size
    if foreign:
        raise TableError(
            f"{ledger.table_uri} holds files outside airflow-eo attempt directories (e.g. {foreign[0]}; "
            "rewritten by OPTIMIZE or another writer): they may mix batches, so a reprocess cannot "
            "replace one batch's rows without touching others. Nothing was changed"
        )
    return found


class ReprocessLog:
    """Pending reprocess requests, one per requesting run key, beside the table."""

    def __init__(self, ingestion: Ingestion):
        self.loc = ingestion.location

    def path(self, requester_key: str) -> str:
        return self.loc.join(REPROCESS_DIR, hashlib.sha256(requester_key.encode()).hexdigest()[:32] + ".json")

    def load(self, requester_key: str) -> ReprocessRequest | None:
        text = self.loc.read_text(self.path(requester_key)) if requester_key else None
        try:
            return ReprocessRequest(**json.loads(text)) if text else None
        except (ValueError, TypeError):
            return None

    def record(self, request: ReprocessRequest) -> None:
        if request.requester_key:
            self.loc.write_text(self.path(request.requester_key), json.dumps(asdict(request)))


class Reprocessor:
    """Reprocess the batch a past run committed (see the module docstring)."""

    def __init__(self, ingestion: Ingestion):
        self.ing = ingestion
        self.requests = ReprocessLog(ingestion)

    def run(self, requester: RunIdentity, target_run_key: str | None = None) -> IngestResult:
        """Reprocess the batch of ``target_run_key`` (default: the requester's own run)."""
        ing, ingest_id = self.ing, self.ing.config.ingest_id
        target = target_run_key or requester.run_key
        ledger = ing.ledger()
        ing.collect_orphans(ledger)
        plan = self._committed_plan(target, ledger)
        if not plan.data_ranges:
            return self._result(NOTHING_NEW, plan, None, False)
        counter = reprocess_count(ledger, ingest_id, plan.batch)
        pending = self.requests.load(requester.run_key)
        if pending and not pending.done and pending.batch == plan.batch and pending.target_run_key == target:
            if counter == pending.from_version + 1:
                log.info("reprocess of batch %s by %s already committed; starting nothing", plan.batch, requester.run_key)
                self.requests.record(replace(pending, done=True))
                return self._result(ALREADY_REPROCESSED, plan, self._record(ledger, plan.batch), False)
            if counter == pending.from_version:
                log.info("replaying the pending reprocess of batch %s", plan.batch)
        request = ReprocessRequest(requester.run_key, target, plan.batch, counter)
        batch_files(ledger, plan.batch)  # refuse compacted tables before any work
        self._check_kafka(plan)
        self.requests.record(request)
        return self._execute(plan, request, requester)

    def _committed_plan(self, target: str, ledger: Ledger) -> BatchPlan:
        ingest_id = self.ing.config.ingest_id
        plan = self.ing.plans.load(target)
        if plan is None:
            raise ConfigError(
                f"nothing to reprocess: no batch was planned for run {target!r} in {ledger.table_uri} "
                f"(ingest {ingest_id}). Reprocess a run that committed a batch; nothing was changed"
            )
        committed = ledger.committed_offsets(ingest_id, plan.ends)
        done = all(committed[tp] is not None and committed[tp] >= end for tp, end in plan.ends.items())
        if not done or ledger.last_batch(ingest_id) < plan.batch:
            raise ConfigError(
                f"run {target!r} planned batch {plan.batch} but it never committed: clear the run "
                "without reprocess to replay it; nothing was changed"
            )
        return plan

    def _check_kafka(self, plan: BatchPlan) -> None:
        kafka = self.ing.kafka()
        bounds = kafka.bounds([r.tp for r in plan.data_ranges])
        for r in plan.data_ranges:
            b = bounds[r.tp]
            if b.log_start > r.start or b.end < r.end:
                raise DataLossError(
                    f"cannot reprocess batch {plan.batch}: Kafka no longer holds {r} (it holds "
                    f"{r.tp} {b.log_start}..{b.end}; retention or a recreated topic). The batch's "
                    "rows stay as they are; nothing was changed"
                )

    def _execute(self, plan: BatchPlan, request: ReprocessRequest, requester: RunIdentity) -> IngestResult:
        ing = self.ing
        attempt = plan.with_attempt(new_attempt_id())
        job = {**ing.config.job_options(), "mode": REPROCESS_MODE, "reprocess_from": request.from_version,
               "requested_by": asdict(requester)}
        log.info("reprocessing batch %s (attempt %s): %s", plan.batch, attempt.attempt_id,
                 ", ".join(str(r) for r in attempt.data_ranges))
        error = ing.submit_attempt(attempt, job)
        ledger = ing.ledger()
        if reprocess_count(ledger, plan.ingest_id, plan.batch) == request.from_version + 1:
            record = self._record(ledger, plan.batch)
            self.requests.record(replace(request, done=True))
            mine = record is not None and record.attempt_id == attempt.attempt_id
            return self._result(REPROCESSED if mine else ALREADY_REPROCESSED, plan, record, True)
        if isinstance(error, (ConfigError, DataLossError, TableError, CommitConflictError)):
            raise error
        raise SparkJobError(
            f"the reprocess of batch {plan.batch} ended without committing ({error or 'no commit found'}); "
            "the batch's rows are unchanged. Retry the task: it replays the same request"
        ) from error

    def _record(self, ledger: Ledger, batch: int):
        """The newest commit of ``batch``: the reprocess commit once there is one."""
        return ledger.find_batch(self.ing.config.ingest_id, batch=batch)

    def _result(self, status: str, plan: BatchPlan, record, spark_started: bool) -> IngestResult:
        return IngestResult(
            status=status, ingest_id=plan.ingest_id, table_uri=self.ing.config.table_uri,
            run_key=plan.run.run_key, batch=plan.batch, version=record.version if record else None,
            attempt_id=record.attempt_id if record else None, ranges=[asdict(r) for r in plan.data_ranges],
            rows=record.rows if record else 0,
            rows_per_partition=record.rows_per_partition if record else {}, spark_started=spark_started,
        )


# -- Spark driver side: the commit of a reprocess attempt (called from job.run_attempt) --
def commit_reprocess(
    table_uri: str, plan: BatchPlan, staged: list[StagedFile], rows_per_partition: dict[str, int],
    arrow_schema: pa.Schema, job: dict, storage_options: dict | None = None,
) -> CommitOutcome:
    """Remove the batch's current files and add ``staged`` in one commit; CAS the counter."""
    from airflow_eo.commit import delta_schema_of

    from_version = int(job["reprocess_from"])
    ledger = Ledger.open(table_uri, storage_options)
    ledger.check_owner(plan.ingest_id)
    check = _compare_counter(ledger, plan, from_version)
    if check is not None:
        return check
    check_schema(ledger, delta_schema_of(arrow_schema))
    new_dir = staged[0].path.split("/", 1)[0] if staged else None
    now_ms = int(time.time() * 1000)
    removes = [RemoveAction(path, True, now_ms, size, {})
               for path, size in batch_files(ledger, plan.batch).items() if path.split("/", 1)[0] != new_dir]
    meta = batch_metadata(plan, rows_per_partition, operation=REPROCESS_MODE)
    meta["reprocess"] = {"from_version": from_version, "requested_by": job.get("requested_by", {}),
                         "removed_files": len(removes)}
    properties = CommitProperties(
        custom_metadata={METADATA_KEY: json.dumps(meta)},
        app_transactions=[Transaction(reprocess_app_id(plan.ingest_id, plan.batch), from_version + 1)],
    )
    try:
        ledger.table.create_write_transaction(
            [*removes, *add_actions(staged)], mode="append", schema=ledger.table.schema(),
            commit_properties=properties,
        )
    except CommitFailedError as exc:
        check = _compare_counter(Ledger.open(table_uri, storage_options), plan, from_version)
        if check is not None:
            return check
        raise CommitConflictError(
            f"the reprocess of batch {plan.batch} lost a race with another commit ({exc}); the "
            "batch's rows are unchanged. Retry the task"
        ) from exc
    after = Ledger.open(table_uri, storage_options)
    record = after.find_batch(plan.ingest_id, attempt_id=plan.attempt_id)
    log.info("reprocessed batch %s: removed %d files, added %d, version %s", plan.batch, len(removes),
             len(staged), record.version if record else after.version)
    return CommitOutcome(COMMITTED, plan.batch, record.version if record else after.version,
                         sum(rows_per_partition.values()), rows_per_partition)


def _compare_counter(ledger: Ledger, plan: BatchPlan, from_version: int) -> CommitOutcome | None:
    """None when the counter is at ``from_version``; the outcome when this attempt already landed."""
    counter = reprocess_count(ledger, plan.ingest_id, plan.batch)
    if counter == from_version:
        return None
    record = ledger.find_batch(plan.ingest_id, attempt_id=plan.attempt_id)
    if counter == from_version + 1 and record is not None:
        return CommitOutcome(ALREADY_COMMITTED, plan.batch, record.version)
    raise CommitConflictError(
        f"batch {plan.batch} was reprocessed by another run meanwhile (reprocess counter {counter}, "
        f"expected {from_version}); this reprocess committed nothing. Its rows are already "
        "replaced: check the table history before reprocessing again"
    )
