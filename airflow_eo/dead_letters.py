"""Dead letters: records the pipeline cannot decode go to their own Delta table.

With ``value_schema`` (a Spark DDL string) set, each record's value is parsed as JSON
into the column ``data`` before the transform sees the view ``source``. A record whose
value is malformed, has the wrong types, is not a JSON object, is null or is larger
than ``max_value_bytes`` does not fail the batch: it goes to the dead-letter table
(``topic, partition, offset, timestamp, key, value, reason, ingest_id, batch``).

The main commit decides; the dead-letter table follows it. The attempt stages its dead
letters beside the dead-letter table (``b<batch>-…/``) and lists them in the *main*
commit's metadata; only after that commit landed are they committed to the dead-letter
table, with ``txn`` ``airflow-eo:<ingest>:dlq`` = batch, so a replay never writes them
twice. A run that loses the main commit's compare-and-set never touches the dead-letter
table (two racing runs with different plans of one batch number cannot mix their dead
letters). If the driver dies between the two commits, the next run of the ingest (or
the retry) rolls the dead-letter commit forward from the main commit's metadata before
it plans: :func:`complete_dead_letters`.

A threshold (``max_dead_letters`` records, or ``max_dead_letter_fraction`` of the batch)
fails the run before either commit when too many records are bad.

Example::

    >>> spec = DecodeSpec(value_schema="id INT, name STRING", max_value_bytes=1024)
    >>> spec.enabled
    True
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from airflow_eo.errors import ConfigError, DeadLetterThresholdError, TableError
from airflow_eo.ledger import APP_PREFIX
from airflow_eo.planning import BatchPlan

log = logging.getLogger(__name__)

DATA_COLUMN = "data"
REASON_COLUMN = "_airflow_eo_reason"
CORRUPT_COLUMN = "_airflow_eo_corrupt"
METADATA_KEY = "airflow_eo.dead_letters"
DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "reason")


def dlq_app_id(ingest_id: str) -> str:
    return f"{APP_PREFIX}:{ingest_id}:dlq"


@dataclass(frozen=True)
class DecodeSpec:
    """How values are decoded and where undecodable ones go (job options, no secrets)."""

    value_schema: str | None = None
    value_format: str = "json"
    max_value_bytes: int | None = None
    dead_letter_table_uri: str | None = None
    max_dead_letters: int | None = None
    max_dead_letter_fraction: float | None = None

    def __post_init__(self):
        if self.value_format != "json":
            raise ConfigError(f"value_format {self.value_format!r} is not supported: use 'json'")
        if (self.value_schema or self.max_value_bytes) and not self.dead_letter_table_uri:
            raise ConfigError(
                "value_schema/max_value_bytes need a dead_letter_table_uri: set where undecodable "
                "records go (a Delta table path other than the main table)"
            )
        if self.max_dead_letter_fraction is not None and not 0 <= self.max_dead_letter_fraction <= 1:
            raise ConfigError("max_dead_letter_fraction must be between 0 and 1, e.g. 0.01 for 1 %")

    @property
    def enabled(self) -> bool:
        return bool(self.value_schema or self.max_value_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


def decode(source, spec: DecodeSpec):
    """Add ``data`` (the parsed value) and the dead-letter reason (null when decodable)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    reason = F.when(F.col("value").isNull(), F.lit("value is null"))
    if spec.max_value_bytes:
        size = F.length(F.col("value"))
        reason = reason.when(size > spec.max_value_bytes, F.concat(
            F.lit("value of "), size.cast("string"), F.lit(f" bytes exceeds max_value_bytes={spec.max_value_bytes}")))
    out = source
    if spec.value_schema:
        try:
            schema = StructType.fromDDL(spec.value_schema)
        except Exception as exc:  # ParseException from the JVM
            raise ConfigError(f"value_schema {spec.value_schema!r} is not a Spark DDL schema ({exc}); "
                              "write it like 'id INT, name STRING'") from exc
        with_corrupt = StructType([*schema.fields, StructField(CORRUPT_COLUMN, StringType())])
        parsed = F.from_json(F.col("value").cast("string"), with_corrupt,
                             {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN})
        out = out.withColumn(DATA_COLUMN, parsed)
        mismatch = F.lit(f"value does not match value_schema ({spec.value_schema}): malformed JSON, "
                         "wrong types or not a JSON object")
        reason = reason.when(F.col(DATA_COLUMN).isNull() | F.col(f"{DATA_COLUMN}.{CORRUPT_COLUMN}").isNotNull(),
                             mismatch)
        keep = [F.col(f"{DATA_COLUMN}.{f.name}").alias(f.name) for f in schema.fields]
        out = out.withColumn(REASON_COLUMN, reason).withColumn(DATA_COLUMN, F.struct(*keep))
    else:
        out = out.withColumn(REASON_COLUMN, reason)
    return out


def split(decoded, plan: BatchPlan):
    """(good rows without the reason column, dead letters in the dead-letter table's columns)."""
    from pyspark.sql import functions as F

    good = decoded.where(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    bad = decoded.where(F.col(REASON_COLUMN).isNotNull()).select(
        *DEAD_LETTER_COLUMNS[:-1], F.col(REASON_COLUMN).alias("reason"),
        F.lit(plan.ingest_id).alias("ingest_id"), F.lit(plan.batch).cast("long").alias("batch"))
    return good, bad


class DeadLetters:
    """The dead-letter side of one attempt (driver side, used by :func:`airflow_eo.job.run_attempt`).

    >>> DeadLetters.of(source, {}, plan, None) is None     # decoding not configured  # doctest: +SKIP
    True
    """

    def __init__(self, decoded, spec: DecodeSpec, plan: BatchPlan, storage_options):
        from pyspark import StorageLevel

        # Kept for two actions (dead letters, then good rows): read Kafka once.
        self.decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        self.spec, self.plan, self.storage_options = spec, plan, storage_options
        self.good, self.bad = split(self.decoded, plan)
        self.staged: list = []
        self.arrow_schema = None

    @classmethod
    def of(cls, source, options: dict | None, plan: BatchPlan, storage_options) -> "DeadLetters | None":
        spec = DecodeSpec(**(options or {}))
        return cls(decode(source, spec), spec, plan, storage_options) if spec.enabled else None

    def stage(self, stage_fn) -> int:
        """Count, check the threshold, and stage the dead letters; returns how many there are."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema

        from airflow_eo.staging import attempt_dir_name
        from airflow_eo.storage import TableLocation

        counts = self.decoded.agg(F.count(F.lit(1)).alias("n"),
                                  F.count(F.col(REASON_COLUMN)).alias("bad")).collect()[0]
        check_threshold(self.spec, counts["bad"], counts["n"], self.plan)
        location = TableLocation.of(self.spec.dead_letter_table_uri, self.storage_options)
        self.arrow_schema = to_arrow_schema(self.bad.schema)
        target = location.join(attempt_dir_name(self.plan))
        self.staged = stage_fn(self.bad.coalesce(1), location, target, self.storage_options, self.arrow_schema)
        create_table(self.spec.dead_letter_table_uri, self.arrow_schema, self.storage_options)
        log.info("batch %s: %s of %s records go to the dead-letter table", self.plan.batch, counts["bad"], counts["n"])
        return counts["bad"]

    def manifest(self) -> dict:
        """What the main commit records so the dead-letter commit can follow it (no secrets)."""
        return {"uri": self.spec.dead_letter_table_uri, "files": [asdict(f) for f in self.staged if f.num_records]}


def check_threshold(spec: DecodeSpec, bad: int, total: int, plan: BatchPlan) -> None:
    too_many = (spec.max_dead_letters is not None and bad > spec.max_dead_letters) or (
        spec.max_dead_letter_fraction is not None and total and bad / total > spec.max_dead_letter_fraction)
    if too_many:
        raise DeadLetterThresholdError(
            f"batch {plan.batch} of {plan.ingest_id}: {bad} of {total} records could not be decoded, "
            f"more than allowed (max_dead_letters={spec.max_dead_letters}, max_dead_letter_fraction="
            f"{spec.max_dead_letter_fraction}). Nothing was committed; fix the producer or value_schema, "
            "or raise the threshold"
        )


def create_table(dlq_uri: str, arrow_schema, storage_options=None) -> None:
    """Create the (empty) dead-letter table if it is not there yet; safe when runs race."""
    from deltalake import DeltaTable, Schema
    from deltalake.exceptions import DeltaError

    try:
        DeltaTable.create(dlq_uri, Schema.from_arrow(arrow_schema), mode="ignore", storage_options=storage_options)
    except DeltaError as exc:  # another run created it between our check and our commit
        if "already exists" not in str(exc).lower():
            raise


def commit_dead_letters(dlq_uri: str, ingest_id: str, batch: int, files: list[dict],
                        storage_options=None) -> str:
    """Commit the dead letters of a *committed* main batch, once: ``"committed"`` or ``"skipped"``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, CommitProperties, Transaction

    table = DeltaTable(dlq_uri, storage_options=storage_options)
    if (table.transaction_version(dlq_app_id(ingest_id)) or 0) >= batch:
        log.info("dead letters of batch %s are already committed: skipping", batch)
        return "skipped"
    missing = _missing_files(dlq_uri, files, storage_options)
    if missing:
        raise TableError(
            f"the dead letters of committed batch {batch} of {ingest_id} cannot be committed to {dlq_uri}: "
            f"their staged files are gone ({', '.join(missing[:3])}), deleted by hand or by a VACUUM of the "
            "dead-letter table. Reprocess that batch to rebuild them, or accept the loss"
        )
    props = CommitProperties(
        custom_metadata={METADATA_KEY: json.dumps({"ingest_id": ingest_id, "batch": batch})},
        app_transactions=[Transaction(dlq_app_id(ingest_id), batch)])
    adds = [AddAction(f["path"], f["size"], {}, f["modification_time"], True, f["stats"]) for f in files]
    try:
        table.create_write_transaction(adds, mode="append", schema=table.schema(), commit_properties=props)
    except CommitFailedError:  # another run rolled the same batch forward at the same moment
        if (DeltaTable(dlq_uri, storage_options=storage_options).transaction_version(dlq_app_id(ingest_id)) or 0) \
                >= batch:
            return "skipped"
        raise
    log.info("batch %s: %s dead-letter file(s) committed to %s", batch, len(adds), dlq_uri)
    return "committed"


def complete_dead_letters(ledger, ingest_id: str, storage_options=None) -> str | None:
    """Roll the dead-letter commit of the table's last batch forward if it is missing.

    Earlier batches are always complete: every run does this before it plans. Returns
    what :func:`commit_dead_letters` did, or None when the last batch had no dead letters.
    """
    last = ledger.last_batch(ingest_id)
    if not last:
        return None
    record = ledger.find_batch(ingest_id, batch=last, operation="ingest")
    manifest = (record.raw.get("dead_letters") if record else None) or {}
    if not manifest.get("files"):
        return None
    return commit_dead_letters(manifest["uri"], ingest_id, last, manifest["files"], storage_options)


def _missing_files(dlq_uri: str, files: list[dict], storage_options) -> list[str]:
    from airflow_eo.storage import TableLocation

    location = TableLocation.of(dlq_uri, storage_options)
    return [f["path"] for f in files
            if location.fs.get_file_info(location.join(f["path"])).type.name == "NotFound"]


def collect_orphans(dlq_uri: str, storage_options, grace_seconds: float) -> list[str]:
    """Staged dead-letter files no commit references: removed once ``grace_seconds`` old
    (their attempt markers live beside the main table, so age is the only safe test)."""
    import pyarrow as pa

    from airflow_eo.ledger import Ledger
    from airflow_eo.staging import StagingArea
    from airflow_eo.storage import TableLocation

    ledger = Ledger.open(dlq_uri, storage_options)
    referenced = set()
    if ledger.table is not None:
        referenced = set(pa.table(ledger.table.get_add_actions(flatten=True)).column("path").to_pylist())
    location = TableLocation.of(dlq_uri, storage_options)
    if not location.fs.get_file_info(location.root).type.name == "Directory":
        return []
    return StagingArea(location).collect_orphans(referenced, grace_seconds)
