"""IngestConfig: an ingest's spec together with the secrets it runs with (what the ingest loop takes).

The spec (:class:`airflow_eo.spec.IngestSpec`) is the configuration; the secrets (Kafka client
config, storage options, Schema Registry config) never enter it. The checks that need both, or
a module above the spec (an inline Avro schema is parsed here, before any run), are made once,
when the config is built. Options read by name (``config.table_uri``, ``config.spec.planning.mode``) come from
the spec, typed.

Example::

    >>> config = IngestConfig(table_uri="/data/orders", ingest_id="orders_raw", topics=["orders"],
    ...                       kafka_config={"bootstrap.servers": "b:9092"}, starting_offsets="latest")
    >>> config.spec.source.starting_offsets.kind, config.topics, config.kafka_config["bootstrap.servers"]
    ('latest', ('orders',), 'b:9092')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from airflow_eo.attempt import Attempt, AttemptKind, Secrets
from airflow_eo.core.planning import BatchPlan
from airflow_eo.spec import IngestSpec
from airflow_eo.spec.columns import InlineAvro, InlineJsonSchema, InlineProtobuf, require_registry


@dataclass(frozen=True, init=False)
class IngestConfig:
    """Everything that defines one ingest into one table: the spec, and the secrets apart."""

    spec: IngestSpec
    credentials: Secrets = field(repr=False)  # never logged or stored

    def __init__(self, spec: IngestSpec | None = None, credentials: Secrets | None = None, *,
                 kafka_config: Mapping[str, object] | None = None, storage_options: Mapping[str, str] | None = None,
                 schema_registry: Mapping[str, object] | None = None, **options: Any):
        """From a built spec, or from options by name (parsed here); secrets as
        ``credentials`` or as the three keywords they always had."""
        if spec is None:
            spec = IngestSpec.of(**options)
        elif options:
            spec = spec.replace(**options)
        if credentials is None:
            credentials = Secrets(dict(kafka_config or {}), storage_options, schema_registry)
        elif kafka_config is not None or storage_options is not None or schema_registry is not None:
            # dataclasses.replace(config, schema_registry=...) passes both: the keyword wins
            credentials = Secrets(dict(credentials.kafka_config if kafka_config is None else kafka_config),
                                  credentials.storage_options if storage_options is None else storage_options,
                                  credentials.schema_registry if schema_registry is None else schema_registry)
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "credentials", credentials)
        require_registry(spec.decode.columns, credentials.schema_registry is not None)
        for column in spec.decode.columns:
            if isinstance(column, (InlineAvro, InlineProtobuf, InlineJsonSchema)):  # checked now, not on Spark
                from airflow_eo.decoding.formats import decoder_of

                decoder_of(column)

    # the table and what it reads: what every step names (every other option is read from the spec, typed)
    @property
    def table_uri(self) -> str:
        return self.spec.table.table_uri

    @property
    def ingest_id(self) -> str:
        return self.spec.table.ingest_id

    @property
    def topics(self) -> tuple[str, ...]:
        return self.spec.source.topics

    @property
    def kafka_config(self) -> Mapping[str, object]:
        return self.credentials.kafka_config

    @property
    def storage_options(self) -> Mapping[str, str] | None:
        return self.credentials.storage_options

    @property
    def schema_registry(self) -> Mapping[str, object] | None:
        return self.credentials.schema_registry

    def secrets(self) -> Secrets:
        return self.credentials

    def replace(self, **options: Any) -> "IngestConfig":
        """The same ingest with some options changed (parsed and checked again)."""
        return IngestConfig(self.spec.replace(**options), self.credentials)

    def attempt(self, plan: BatchPlan, kind: AttemptKind = AttemptKind.INGEST, **details: Any) -> Attempt:
        """The typed value an attempt of ``plan`` runs from (no secrets; ``details``: a reprocess's
        counter and requester, the table's pinned features)."""
        return Attempt(plan=plan, spec=self.spec, kind=kind, **details)
