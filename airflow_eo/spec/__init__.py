"""The ingest spec: every user-facing option as one typed field, parsed and validated once.

An :class:`IngestSpec` composes small frozen sub-specs (table, source, planning, transform,
decoding, dead letters, dedup, Spark, merge), grouped in its two halves: what is read
(:class:`SourceSide`) and where it goes (:class:`SinkSpec`, one per table: :mod:`airflow_eo.spec.halves`). Each option is a dataclass field whose metadata (an
:class:`Option`) carries its one name, one-line help, CLI flag, whether the operator templates
it, and how a raw value (a CLI string, a rendered template, a JSON value) becomes the typed
one. The operator's keyword arguments, the ``airflow-eo ingest`` flags, the standalone
driver's flags and README's options table are all derived from these fields; nothing copies
them by hand. Secrets (Kafka client config, storage options, registry config) are not options:
they travel as :class:`airflow_eo.attempt.Secrets`. No I/O here.

Example::

    >>> spec = IngestSpec.of(table_uri="/data/orders", ingest_id="orders_raw", topics="orders,refunds",
    ...                      starting_offsets="latest", partition_by="date")
    >>> spec.source.topics, spec.source.starting_offsets.kind, spec.table.partition_by
    (('orders', 'refunds'), 'latest', ('date',))
    >>> IngestSpec.from_dict(spec.to_dict()) == spec
    True
"""

from __future__ import annotations

from airflow_eo.spec.halves import SinkSpec, SourceSide
from airflow_eo.spec.ingest import (
    GROUPS, OPTIONS, SETTINGS, IngestSpec, all_options, default_of, dump_option, option_of, parse_option, required,
    templated_options,
)
from airflow_eo.spec.options import (
    DEFAULT_DRIVER_READ_MAX_OFFSETS, DEFAULT_GRACE_SECONDS, DEFAULT_MAX_OFFSETS_PER_TASK, DEFAULT_TABLE_WAIT_SECONDS,
    FROM_EARLIEST, INTERNAL_PREFIX, KEY_COLUMNS, TXN_RETENTION, CdcFormat, Cli, Mode, Option, WriteMode, check_partition_by, check_table_properties, normalize_table_uri,
    validate_ingest_id,
)
from airflow_eo.spec.parts import (
    FORMATS, DeadLetterSpec, DecodeSpec, DedupSpec, MergeSpec, PlanningSpec, SourceSpec, SparkSettings, TableSpec,
    Transform,
)
from airflow_eo.spec.surfaces import (
    add_arguments, operator_param_docs, operator_signature, options_from_args, options_table,
)

__all__ = [
    "GROUPS", "OPTIONS", "SETTINGS", "IngestSpec", "all_options", "default_of", "dump_option", "option_of",
    "parse_option", "required", "templated_options", "DEFAULT_DRIVER_READ_MAX_OFFSETS", "DEFAULT_GRACE_SECONDS",
    "DEFAULT_TABLE_WAIT_SECONDS", "DEFAULT_MAX_OFFSETS_PER_TASK", "FROM_EARLIEST",
    "KEY_COLUMNS", "INTERNAL_PREFIX", "TXN_RETENTION", "CdcFormat", "Cli", "Mode", "Option", "WriteMode",
    "check_partition_by", "check_table_properties", "normalize_table_uri", "validate_ingest_id", "FORMATS",
    "DeadLetterSpec", "DecodeSpec", "DedupSpec", "MergeSpec",
    "PlanningSpec", "SourceSpec", "SparkSettings", "TableSpec", "Transform", "add_arguments", "operator_param_docs", "operator_signature",
    "options_from_args", "options_table", "SinkSpec", "SourceSide",
]
