"""The attempt: one typed value for everything a Spark attempt needs, and its environment.

An :class:`Attempt` is built once by the caller (the ingest loop, for an ingest or a
reprocess), written beside the table in the attempt's marker before Spark starts, and
read once by the driver (:mod:`airflow_eo.driver.main`): the plan and the ingest's
:class:`~airflow_eo.spec.IngestSpec`, serialised with the spec's one generic to/from dict. It holds no secrets: the Kafka
client config and the storage credentials travel separately as :class:`Secrets`, through
environment variables whose names are defined here and nowhere else (:class:`Env`).

Example::

    >>> from airflow_eo.core.planning import BatchPlan, RunIdentity
    >>> spec = IngestSpec.of(table_uri="/data/orders", ingest_id="orders", topics="orders",
    ...                      transform_sql="SELECT * FROM source")
    >>> attempt = Attempt(BatchPlan("orders", 1, (), RunIdentity("r1"), attempt_id="3f2a9c0d1e6b4a52"), spec)
    >>> Attempt.from_json(attempt.to_json()) == attempt
    True
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.spec import (
    IngestSpec,
)

TIMESTAMP_COLUMN = "timestamp"  # the Kafka record timestamp: dedup horizons and late counts read it

# Session settings the commit relies on: microsecond UTC timestamps in Parquet, so the
# Delta schema is plain `timestamp` (readable by delta-spark), not INT96/nanos.
SPARK_DEFAULTS = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
# For the Spark applications airflow-eo starts (static: a running application's session cannot
# change them), the Python worker daemon of airflow_eo.driver.daemon: a Spark task starts without
# re-reading Spark's own archives, a worker with the reader's imports done (docs/performance.md).
SPARK_WORKER_DEFAULTS = {"spark.python.daemon.module": "airflow_eo.driver.daemon"}
# And, for spark-submit and local sessions: Spark's own output at WARN, so a task log shows
# airflow-eo's lines (plan, rate, commit, lag), not Spark's INFO chatter;
# spark_conf={"spark.log.level": "INFO"} brings it back.
SPARK_APP_DEFAULTS = {**SPARK_DEFAULTS, **SPARK_WORKER_DEFAULTS, "spark.log.level": "WARN"}


class Env:
    """Names of the environment variables airflow-eo reads (the only place they are spelled)."""

    KAFKA_CONFIG = "AIRFLOW_EO_KAFKA_CONFIG"  # JSON client config: may hold secrets
    STORAGE_OPTIONS = "AIRFLOW_EO_STORAGE_OPTIONS"  # JSON deltalake storage options: may hold secrets
    SCHEMA_REGISTRY = "AIRFLOW_EO_SCHEMA_REGISTRY_CONFIG"  # JSON SchemaRegistryClient config: may hold secrets
    FAILPOINTS = "AIRFLOW_EO_FAILPOINTS"  # tests only: comma-separated failpoints
    FAILPOINTS_ONCE = "AIRFLOW_EO_FAILPOINTS_ONCE"  # tests only: a file whose creation a failpoint fires once
    SCRATCH_DIR = "AIRFLOW_EO_SCRATCH_DIR"  # where attempts keep their local Spark scratch (table.liveness)
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
class PinnedFeatures:
    """The table's protocol and metadata as the run read them when it planned (raw; typed by
    :meth:`airflow_eo.table.features.TableFeatures.of_pinned`): an attempt carries them like the
    plan's reader schemas, so the driver checks and writes its rows by them without opening the
    table again; the commit compares them with the snapshot it commits to."""

    reader_version: int = 1
    writer_version: int = 2
    reader_features: tuple[str, ...] = ()
    writer_features: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    fields: str = "[]"  # the schema's fields, JSON
    files_with_deletion_vectors: int = 0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "PinnedFeatures":
        return cls(**{**raw, "reader_features": tuple(raw.get("reader_features", ())),
                      "writer_features": tuple(raw.get("writer_features", ()))})


class AttemptKind(str, enum.Enum):
    INGEST = "ingest"  # commit a new batch (compare-and-set on the offsets)
    REPROCESS = "reprocess"  # replace a committed batch's rows (compare-and-set on its counter)


@dataclass(frozen=True)
class Companion:
    """Another table's attempt that shares this attempt's read (a fan-out: :mod:`airflow_eo.loop.fanout`),
    recorded beside its own table."""

    table_uri: str
    attempt_id: str


@dataclass(frozen=True)
class Attempt:
    """Everything one Spark attempt of a logged plan needs (no secrets): the plan and the spec;
    in a fan-out, the other tables' attempts its one read serves (``companions``)."""

    plan: BatchPlan  # carries the attempt id
    spec: IngestSpec
    kind: AttemptKind = AttemptKind.INGEST
    reprocess_from: int | None = None  # REPROCESS: the batch's reprocess counter it was planned at
    requested_by: RunIdentity | None = None  # REPROCESS: the run that asked for it
    features: PinnedFeatures | None = None  # the table's, as planned (None: the driver reads them)
    companions: tuple[Companion, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "kind", AttemptKind(self.kind))
        if not self.plan.attempt_id:
            raise ConfigError("an attempt needs a plan with an attempt id (plan.with_attempt(...))")
        if self.kind is AttemptKind.REPROCESS and self.reprocess_from is None:
            raise ConfigError("a reprocess attempt needs the reprocess counter it starts from")

    @property
    def attempt_id(self) -> str:
        return self.plan.attempt_id

    # what the driver reads, by the names it always had
    table_uri = property(lambda self: self.spec.table.table_uri)
    transform = property(lambda self: self.spec.transform)
    decode = property(lambda self: self.spec.decode)
    dead_letters = property(lambda self: self.spec.dead_letters)
    dedup = property(lambda self: self.spec.dedup)
    merge = property(lambda self: self.spec.merge)
    spark = property(lambda self: self.spec.spark)
    schema_evolution = property(lambda self: self.spec.table.schema_evolution)
    table_properties = property(lambda self: self.spec.table.table_properties)
    partition_by = property(lambda self: self.spec.table.partition_by)
    adopt_table = property(lambda self: self.spec.table.adopt_table)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": json.loads(self.plan.to_json()), "spec": self.spec.to_dict(), "kind": self.kind.value,
                "reprocess_from": self.reprocess_from,
                "requested_by": asdict(self.requested_by) if self.requested_by else None,
                "features": {**asdict(self.features), "properties": dict(self.features.properties)}
                if self.features else None,
                **({"companions": [asdict(c) for c in self.companions]} if self.companions else {})}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Attempt":
        plan = BatchPlan.from_json(json.dumps(raw["plan"]))
        return cls(plan=plan, spec=IngestSpec.from_dict(raw["spec"] if "spec" in raw else _spec_of_old(raw, plan)),
                   kind=AttemptKind(raw.get("kind", "ingest")), reprocess_from=raw.get("reprocess_from"),
                   requested_by=RunIdentity(**raw["requested_by"]) if raw.get("requested_by") else None,
                   features=PinnedFeatures.from_dict(raw["features"]) if raw.get("features") else None,
                   companions=tuple(Companion(**c) for c in raw.get("companions") or ()))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Attempt":
        return cls.from_dict(json.loads(text))


def _spec_of_old(raw: Mapping[str, Any], plan: BatchPlan) -> dict[str, Any]:
    """The spec dict of an attempt an earlier version wrote: its sub-specs at the top level, the
    table's settings loose beside them, no source (the plan names the topics it reads)."""
    table = {"table_uri": raw["table_uri"], "ingest_id": plan.ingest_id,
             **{k: raw[k] for k in ("schema_evolution", "table_properties", "partition_by") if k in raw}}
    source = {"topics": sorted({r.topic for r in plan.ranges})}
    return {"table": table, "source": source, **{k: raw[k] for k in
                                                ("transform", "decode", "dead_letters", "dedup", "spark") if k in raw}}
