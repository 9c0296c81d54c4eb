"""The attempt: one typed value for everything a Spark attempt needs, and its environment.

An :class:`Attempt` is built once by the caller (the ingest loop, for an ingest or a
reprocess), written beside the table in the attempt's marker before Spark starts, and
read once by the driver (:mod:`airflow_eo.driver.main`). It holds no secrets: the Kafka
client config and the storage credentials travel separately as :class:`Secrets`, through
environment variables whose names are defined here and nowhere else (:class:`Env`).

Example::

    >>> attempt = Attempt(plan=plan.with_attempt("3f2a9c0d1e6b4a52"), table_uri="/data/orders",
    ...                   transform=Transform(sql="SELECT * FROM source"))     # doctest: +SKIP
    >>> Attempt.from_json(attempt.to_json()) == attempt                       # doctest: +SKIP
    True
"""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Mapping

from airflow_eo.errors import ConfigError
from airflow_eo.planning import BatchPlan, RunIdentity

# The columns that key every row to its source record: every file keeps them (with statistics)
KEY_COLUMNS = ("topic", "partition", "offset")
TIMESTAMP_COLUMN = "timestamp"  # the Kafka record timestamp: dedup horizons and late counts read it

DEFAULT_MAX_OFFSETS_PER_TASK = 1_000_000

# Session settings the commit relies on: microsecond UTC timestamps in Parquet, so the
# Delta schema is plain `timestamp` (readable by delta-spark), not INT96/nanos.
SPARK_DEFAULTS = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
# For a Spark application airflow-eo starts (spark-submit, a local session; a session cannot
# change it): Spark's own output at WARN, so a task log shows airflow-eo's lines (plan,
# rate, commit, lag), not Spark's INFO chatter; spark_conf={"spark.log.level": "INFO"}
# brings it back.
SPARK_APP_DEFAULTS = {**SPARK_DEFAULTS, "spark.log.level": "WARN"}


class Env:
    """Names of the environment variables airflow-eo reads (the only place they are spelled)."""

    KAFKA_CONFIG = "AIRFLOW_EO_KAFKA_CONFIG"  # JSON client config: may hold secrets
    STORAGE_OPTIONS = "AIRFLOW_EO_STORAGE_OPTIONS"  # JSON deltalake storage options: may hold secrets
    SCHEMA_REGISTRY = "AIRFLOW_EO_SCHEMA_REGISTRY_CONFIG"  # JSON SchemaRegistryClient config: may hold secrets
    FAILPOINTS = "AIRFLOW_EO_FAILPOINTS"  # tests only: comma-separated failpoints
    PYSPARK_PYTHON = "PYSPARK_PYTHON"
    PYSPARK_DRIVER_PYTHON = "PYSPARK_DRIVER_PYTHON"
    SPARK_LOCAL_IP = "SPARK_LOCAL_IP"
    EXAMPLE_TABLE_URI = "AIRFLOW_EO_TABLE_URI"  # the example DAGs' table (dags/, the demo)
    EXAMPLE_TOPIC = "AIRFLOW_EO_TOPIC"  # the example DAGs' topic
    SECRET = (KAFKA_CONFIG, STORAGE_OPTIONS, SCHEMA_REGISTRY)
    # on YARN / Kubernetes the secrets travel as a file shipped with --files (env vars would
    # be spark conf on the command line there); this names the file, it is not secret
    SECRETS_FILE = "AIRFLOW_EO_SECRETS_FILE"
    # set by pyspark in a process that opened a Spark Connect session; a spark-submit job
    # started from such a process must not inherit them (it runs classic Spark)
    CONNECT_CLIENT = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@dataclass(frozen=True)
class Secrets:
    """What an attempt needs but must never write down: client config and credentials.

    >>> Secrets({"bootstrap.servers": "b:9092", "sasl.password": "x"})
    Secrets(<hidden>)
    """

    kafka_config: Mapping[str, object] = field(default_factory=dict)
    storage_options: Mapping[str, str] | None = None
    schema_registry: Mapping[str, object] | None = None  # confluent SchemaRegistryClient config

    def __repr__(self) -> str:
        return "Secrets(<hidden>)"

    def to_env(self) -> dict[str, str]:
        env = {Env.KAFKA_CONFIG: json.dumps(dict(self.kafka_config))}
        if self.storage_options:
            env[Env.STORAGE_OPTIONS] = json.dumps(dict(self.storage_options))
        if self.schema_registry:
            env[Env.SCHEMA_REGISTRY] = json.dumps(dict(self.schema_registry))
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, search: tuple[str, ...] = ()) -> "Secrets":
        """The secrets from the environment, or from the file :attr:`Env.SECRETS_FILE` names
        (looked up as given, then in the ``search`` directories: e.g. where Spark put ``--files``)."""
        environ = os.environ if environ is None else environ
        name = environ.get(Env.SECRETS_FILE)
        if name and Env.KAFKA_CONFIG not in environ:
            for path in (name, *(os.path.join(d, os.path.basename(name)) for d in search)):
                if os.path.isfile(path):
                    with open(path) as f:
                        environ = json.load(f)
                    break
            else:
                raise ConfigError(f"the secrets file {name!r} is not where the job runs: pass it with "
                                  "spark-submit --files (the operator does on YARN and Kubernetes)")
        kafka, storage, registry = (environ.get(name) for name in Env.SECRET)
        return cls(json.loads(kafka) if kafka else {}, json.loads(storage) if storage else None,
                   json.loads(registry) if registry else None)


@dataclass(frozen=True)
class Transform:
    """How Kafka records become the table's columns: Spark SQL over the view ``source``, or a
    callable ``"package.module:function"`` (DataFrame → DataFrame), or neither (identity).
    Applied in the driver by :func:`airflow_eo.driver.transforms.apply_transform`.

    >>> Transform(sql="SELECT topic, partition, offset FROM source").describe()
    'sql'
    """

    sql: str | None = None
    callable: str | None = None

    def __post_init__(self):
        if self.sql and self.callable:
            raise ConfigError("give either transform_sql or transform (a 'module:function'), not both")
        if self.callable and ":" not in self.callable:
            raise ConfigError(f"transform {self.callable!r} must name a function as 'package.module:function'")

    def describe(self) -> str:
        return "sql" if self.sql else ("callable " + self.callable if self.callable else "identity")


@dataclass(frozen=True)
class DecodeSpec:
    """How keys and values are decoded before the transform (:mod:`airflow_eo.driver.decode`).

    ``value_format``: ``json`` (with ``value_schema``, Spark DDL, parsed into the column
    ``data``), ``avro`` (Confluent wire format through the Schema Registry, reader schema
    ``value_subject`` at ``value_schema_version``; or plain Avro of the inline ``avro_schema``)
    or ``raw`` (bytes as they are). ``key_format`` the same for the key, into ``key_data``
    (``key_schema`` for JSON, ``key_avro_schema`` / ``key_subject`` for Avro). Records that do
    not decode, or values larger than ``max_value_bytes``, become dead letters.

    >>> DecodeSpec(value_format="avro", avro_schema='"long"').enabled
    True
    """

    value_schema: str | None = None
    value_format: str = "json"
    max_value_bytes: int | None = None
    avro_schema: str | None = None
    value_subject: str | None = None
    value_schema_version: str = "latest"
    key_format: str = "raw"
    key_schema: str | None = None
    key_avro_schema: str | None = None
    key_subject: str | None = None

    FORMATS = ("json", "avro", "raw")

    def __post_init__(self):
        for option in ("value_format", "key_format"):
            if getattr(self, option) not in self.FORMATS:
                raise ConfigError(f"{option} {getattr(self, option)!r} is not supported: use one of "
                                  f"{', '.join(self.FORMATS)}")
        if self.value_format != "json" and self.value_schema:
            raise ConfigError("value_schema is the Spark DDL of JSON values: with value_format="
                              f"{self.value_format!r} leave it unset (Avro: avro_schema or a Schema Registry)")
        if self.key_format == "json" and not self.key_schema:
            raise ConfigError("key_format='json' needs key_schema (Spark DDL, e.g. 'id STRING')")
        if str(self.value_schema_version) != "latest" and not str(self.value_schema_version).isdigit():
            raise ConfigError(f"value_schema_version {self.value_schema_version!r} is not 'latest' or a number")

    @classmethod
    def of(cls, topics: list[str], has_registry: bool, **options) -> "DecodeSpec":
        """The spec of an ingest: Avro subjects default to ``<first topic>-value`` / ``-key``
        (Confluent's TopicNameStrategy) when no inline schema is given."""
        spec = cls(**{**options, "value_schema_version": str(options.get("value_schema_version") or "latest")})
        avro_value = spec.value_format == "avro" and not spec.avro_schema
        avro_key = spec.key_format == "avro" and not spec.key_avro_schema
        if (avro_value or avro_key) and not has_registry:
            raise ConfigError("Avro without an inline schema needs a Schema Registry: set schema_registry_conn_id "
                              "(CLI --schema-registry URL), or avro_schema / key_avro_schema")
        return replace(spec, value_subject=(spec.value_subject or f"{topics[0]}-value") if avro_value else None,
                       key_subject=(spec.key_subject or f"{topics[0]}-key") if avro_key else None)

    @property
    def enabled(self) -> bool:
        return bool(self.value_schema or self.max_value_bytes or self.value_format == "avro"
                    or self.key_format != "raw")


@dataclass(frozen=True)
class DeadLetterSpec:
    """Where undecodable records go, and how many a batch may have before it fails."""

    table_uri: str | None = None
    max_count: int | None = None
    max_fraction: float | None = None

    def __post_init__(self):
        if self.max_fraction is not None and not 0 <= self.max_fraction <= 1:
            raise ConfigError("max_dead_letter_fraction must be between 0 and 1, e.g. 0.01 for 1 %")


@dataclass(frozen=True)
class DedupSpec:
    """Dedup by a producer-supplied key (:mod:`airflow_eo.driver.dedup`): ``key`` a Spark SQL
    expression over the source columns; ``horizon`` how far back the table is checked — a
    duration over the Kafka timestamp (``"1d"``, seconds) or ``"<n> batches"``; None: the whole
    table; ``to_dead_letters``: dropped records also go to the dead-letter table."""

    key: str | None = None
    horizon: str | None = None
    to_dead_letters: bool = False

    def __post_init__(self):
        if self.horizon is not None:
            self.horizon_batches()  # parse now, not on Spark
        if self.to_dead_letters and not self.key:
            raise ConfigError("duplicates_to_dead_letters needs a dedup_key")

    @property
    def enabled(self) -> bool:
        return bool(self.key)

    def horizon_batches(self) -> int | None:
        """``"<n> batches"`` → n; None for a duration or no horizon."""
        text = str(self.horizon or "").strip().lower()
        if text.endswith(("batches", "batch")):
            number = re.fullmatch(r"(\d+)\s*batch(?:es)?", text)
            if number is None or int(number.group(1)) < 1:
                raise ConfigError(f"dedup_horizon {self.horizon!r} is not understood: use a duration over the Kafka "
                                  "timestamp ('1d', '12h', seconds) or '<n> batches'")
            return int(number.group(1))
        if text:
            from airflow_eo.intervals import parse_duration

            parse_duration(text)
        return None


@dataclass(frozen=True)
class SparkSettings:
    """Settings of the attempt's Spark job that are not Spark conf."""

    max_offsets_per_task: int = DEFAULT_MAX_OFFSETS_PER_TASK

    def __post_init__(self):
        if self.max_offsets_per_task <= 0:
            raise ConfigError(f"max offsets per Spark task must be positive, got {self.max_offsets_per_task}")


class AttemptKind(str, enum.Enum):
    INGEST = "ingest"  # commit a new batch (compare-and-set on the offsets)
    REPROCESS = "reprocess"  # replace a committed batch's rows (compare-and-set on its counter)


# Expires Delta txn actions, i.e. a table's committed offsets: refused at creation and later.
TXN_RETENTION = "delta.setTransactionRetentionDuration"


def check_partition_by(columns: Iterable[str]) -> tuple[str, ...]:
    """``columns`` as a tuple, or a ConfigError naming what is wrong with them."""
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")]
    names = tuple(columns)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"partition_by {list(names)!r}: give column names of the transform's output, "
                              "e.g. ['date']")
        if name in KEY_COLUMNS:
            raise ConfigError(f"partition_by: {name!r} is a key column (topic, partition, offset), which every file "
                              "keeps; partition by a column the transform derives, e.g. to_date(timestamp) AS date")
    if len(set(names)) != len(names):
        raise ConfigError(f"partition_by {list(names)!r} names a column twice")
    return names


def check_table_properties(properties: dict) -> None:
    """Delta table properties set when a batch creates the table: text keys and values, and
    never one that would expire the committed offsets."""
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"table property {key!r}={value!r}: give keys and values as text, "
                              "e.g. {'delta.checkpointInterval': '50'}")
    if TXN_RETENTION in properties:
        raise ConfigError(f"table property {TXN_RETENTION} would expire the table's committed offsets (txn "
                          "actions) and make a later run duplicate records: leave it unset")


@dataclass(frozen=True)
class Attempt:
    """Everything one Spark attempt of a logged plan needs (no secrets)."""

    plan: BatchPlan  # carries the attempt id
    table_uri: str
    kind: AttemptKind = AttemptKind.INGEST
    transform: Transform = field(default_factory=Transform)
    decode: DecodeSpec = field(default_factory=DecodeSpec)
    dead_letters: DeadLetterSpec = field(default_factory=DeadLetterSpec)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    spark: SparkSettings = field(default_factory=SparkSettings)
    schema_evolution: bool = False
    table_properties: dict = field(default_factory=dict)  # Delta properties of a table this attempt creates
    partition_by: tuple[str, ...] = ()  # the table's partition columns (set when the first batch creates it)
    reprocess_from: int | None = None  # REPROCESS: the batch's reprocess counter it was planned at
    requested_by: RunIdentity | None = None  # REPROCESS: the run that asked for it

    def __post_init__(self):
        object.__setattr__(self, "kind", AttemptKind(self.kind))
        if not self.plan.attempt_id:
            raise ConfigError("an attempt needs a plan with an attempt id (plan.with_attempt(...))")
        if self.decode.enabled and not self.dead_letters.table_uri:
            raise ConfigError(
                "decoding (value_schema, Avro, max_value_bytes, key_format) needs a dead_letter_table_uri: set where undecodable "
                "records go (a Delta table path other than the main table)"
            )
        if self.dedup.to_dead_letters and not self.dead_letters.table_uri:
            raise ConfigError("duplicates_to_dead_letters needs a dead_letter_table_uri: set where dropped duplicates go")
        check_table_properties(self.table_properties)
        object.__setattr__(self, "partition_by", check_partition_by(self.partition_by))
        if self.kind is AttemptKind.REPROCESS and self.reprocess_from is None:
            raise ConfigError("a reprocess attempt needs the reprocess counter it starts from")

    @property
    def attempt_id(self) -> str:
        return self.plan.attempt_id

    def to_json(self) -> str:
        raw = asdict(self)
        raw["plan"] = json.loads(self.plan.to_json())
        raw["kind"] = self.kind.value
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Attempt":
        raw = json.loads(text)
        return cls(
            plan=BatchPlan.from_json(json.dumps(raw["plan"])),
            table_uri=raw["table_uri"],
            kind=AttemptKind(raw.get("kind", "ingest")),
            transform=Transform(**raw.get("transform", {})),
            decode=DecodeSpec(**raw.get("decode", {})),
            dead_letters=DeadLetterSpec(**raw.get("dead_letters", {})),
            dedup=DedupSpec(**raw.get("dedup", {})),
            spark=SparkSettings(**raw.get("spark", {})),
            schema_evolution=bool(raw.get("schema_evolution", False)),
            table_properties=dict(raw.get("table_properties") or {}),
            partition_by=tuple(raw.get("partition_by") or ()),
            reprocess_from=raw.get("reprocess_from"),
            requested_by=RunIdentity(**raw["requested_by"]) if raw.get("requested_by") else None,
        )
