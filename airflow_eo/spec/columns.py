"""How one Kafka column (the value or the key) is decoded: one small spec per kind, built once by the spec.

A column is kept as bytes (:class:`RawColumn`), parsed from JSON with a Spark DDL
(:class:`JsonColumn`), or decoded from Avro, Protobuf or JSON Schema with an inline schema
(:class:`InlineAvro`, :class:`InlineProtobuf`, :class:`InlineJsonSchema`) or through a Schema
Registry (:class:`RegistryAvro`, :class:`RegistryProtobuf`, :class:`RegistryJsonSchema`: one
:class:`RegistryColumn` each). :class:`~airflow_eo.spec.parts.DecodeSpec`
builds the value's and the key's from the options users set (``value_format``, ``value_schema``,
``avro_schema``, ``protobuf_schema``, ``message_name``, ``json_schema``, ``value_subject``... and
their ``key_*`` twins); everything downstream reads
these typed specs (:mod:`airflow_eo.decoding` in the read step, :mod:`airflow_eo.driver.decode`
for JSON in Spark). The rules about *which* records are bad before any decoding (a null value,
a value over ``max_value_bytes``) and which options a column needs are here, once. No I/O.

Example::

    >>> value = column_of(Source.VALUE, Format.AVRO, subject="orders-value", max_bytes=1024)
    >>> value, value.target, value.null_is_bad, value.needs_registry
    (RegistryAvro(source='value', max_bytes=1024, subject='orders-value', version=None), 'data', True, True)
    >>> column_of(Source.KEY, Format.JSON, ddl="id STRING").null_is_bad   # a record without a key is fine
    False
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_eo.core.errors import ConfigError

# The columns decoded keys and values land in (what transforms and dedup keys name)
DATA_COLUMN, KEY_DATA_COLUMN = "data", "key_data"
LATEST = "latest"
REASON_COLUMN = "_airflow_eo_reason"  # a record's dead-letter reason while it is decoded; null when it decoded


class Format(str, enum.Enum):
    """How the bytes of a Kafka column are written."""

    JSON = "json"
    AVRO = "avro"
    RAW = "raw"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "json_schema"

    def __repr__(self) -> str:  # messages say value_format='avro', as the user wrote it
        return repr(self.value)

    __str__ = str.__str__


class Source(str, enum.Enum):
    """The Kafka column a spec decodes."""

    VALUE = "value"
    KEY = "key"

    def __repr__(self) -> str:
        return repr(self.value)

    __str__ = str.__str__

    def option(self, value_name: str) -> str:
        """The user-facing option of this column named ``value_name`` for the value
        (``avro_schema`` → ``key_avro_schema``, ``value_subject`` → ``key_subject``)."""
        if self is Source.VALUE:
            return value_name
        return "key_" + value_name.removeprefix("value_")


FORMATS = tuple(f.value for f in Format)
# the formats decoded with a schema (inline or from a Schema Registry): what each calls itself in
# messages, the option of its inline schema, and the registry's schemaType of its subjects
SCHEMA_FORMATS = {Format.AVRO: ("Avro", "avro_schema", "AVRO"),
                  Format.PROTOBUF: ("Protobuf", "protobuf_schema", "PROTOBUF"),
                  Format.JSON_SCHEMA: ("JSON Schema", "json_schema", "JSON")}


def format_of(value: Any, default: Format) -> Format:
    """A raw ``value_format`` / ``key_format`` (text, None or '' for the default) as a :class:`Format`;
    a ValueError for anything else."""
    if value is None or value == "":
        return default
    if value not in FORMATS:
        raise ValueError(f"format {value!r} is not supported")
    return Format(value)


def version_of(value: Any) -> int | None:
    """A raw reader schema version ('latest', None, '' or a number) as a number, or None for the latest."""
    if value is None or str(value).strip() in ("", LATEST):
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{value!r} is not 'latest' or a version number")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class ColumnSpec:
    """What every kind of column has: which Kafka column, the size above which a value is a dead
    letter, and whether a null value is a tombstone (``write_mode="merge"``: a delete) instead."""

    source: Source
    max_bytes: int | None = None
    tombstones: bool = field(default=False, repr=False)

    @property
    def target(self) -> str:
        """The struct column the decoded records land in (``data``, ``key_data``)."""
        return DATA_COLUMN if self.source is Source.VALUE else KEY_DATA_COLUMN

    @property
    def decodes(self) -> bool:
        """Whether the bytes become a struct column (JSON or Avro), not only checked."""
        return True

    @property
    def null_is_bad(self) -> bool:
        """A null value (a tombstone) is a dead letter when values are decoded or size-checked,
        unless tombstones are changes (a merge); a record without a key never is."""
        return self.source is Source.VALUE and not self.tombstones and (self.decodes or self.max_bytes is not None)

    @property
    def checked(self) -> bool:
        """Whether a value may be a dead letter before it is decoded (the read step checks it:
        :func:`airflow_eo.decoding.decoder.precheck`)."""
        return self.null_is_bad or self.max_bytes is not None

    @property
    def needs_registry(self) -> bool:
        return False

    def null_reason(self) -> str:
        return f"{self.source.value} is null"

    def size_reason(self, size: int | str) -> str:
        """The dead-letter reason of a value of ``size`` bytes over :attr:`max_bytes`.

        >>> column_of(Source.VALUE, Format.RAW, max_bytes=3).size_reason(4)
        'value of 4 bytes exceeds max_value_bytes=3'
        """
        return f"{self.source.value} of {size} bytes exceeds max_value_bytes={self.max_bytes}"


@dataclass(frozen=True, kw_only=True)
class RawColumn(ColumnSpec):
    """The bytes as they are (JSON values without a ``value_schema`` too)."""

    @property
    def decodes(self) -> bool:
        return False


@dataclass(frozen=True, kw_only=True)
class JsonColumn(ColumnSpec):
    """JSON objects parsed by Spark with a DDL schema (``value_schema`` / ``key_schema``)."""

    ddl: str

    @property
    def ddl_option(self) -> str:
        return self.source.option("value_schema")


@dataclass(frozen=True, kw_only=True)
class SchemaColumn(ColumnSpec):
    """A column decoded with a schema (Avro, Protobuf, JSON Schema), inline or from a registry."""

    format: ClassVar[Format] = Format.AVRO

    @property
    def format_name(self) -> str:
        """What the format calls itself in messages (``Protobuf``)."""
        return SCHEMA_FORMATS[self.format][0]

    @property
    def inline_option(self) -> str:
        """The option of this column's inline schema (``key_protobuf_schema``)."""
        return self.source.option(SCHEMA_FORMATS[self.format][1])


@dataclass(frozen=True, kw_only=True)
class InlineAvro(SchemaColumn):
    """Plain Avro binary (no wire header) of one inline schema (``avro_schema`` / ``key_avro_schema``)."""

    schema: str


@dataclass(frozen=True, kw_only=True)
class InlineProtobuf(SchemaColumn):
    """Plain Protobuf messages (no wire header) of an inline ``.proto`` text (``protobuf_schema`` /
    ``key_protobuf_schema``): ``message_name`` (a full name, ``package.Message``), or the file's first message."""

    format: ClassVar[Format] = Format.PROTOBUF
    schema: str
    message_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class InlineJsonSchema(SchemaColumn):
    """Plain JSON (no wire header) of an inline JSON Schema (``json_schema`` / ``key_json_schema``);
    ``validate``: a record the schema refuses is a dead letter."""

    format: ClassVar[Format] = Format.JSON_SCHEMA
    schema: str
    validate: bool = True


@dataclass(frozen=True, kw_only=True)
class RegistryColumn(SchemaColumn):
    """A column in the Confluent wire format, read with a reader schema of the Schema Registry:
    ``subject`` at ``version`` (None: the latest, resolved when a batch is planned and pinned in
    its plan: :mod:`airflow_eo.decoding.reader_schemas`)."""

    subject: str | None
    version: int | None = None

    @property
    def needs_registry(self) -> bool:
        return True

    @property
    def schema_type(self) -> str:
        """The registry's ``schemaType`` of the subjects this column reads (``AVRO``, ``PROTOBUF``, ``JSON``)."""
        return SCHEMA_FORMATS[self.format][2]

    @property
    def requested(self) -> str:
        """The version as asked for: ``latest`` or the number."""
        return LATEST if self.version is None else str(self.version)


@dataclass(frozen=True, kw_only=True)
class RegistryAvro(RegistryColumn):
    """Avro in the Confluent wire format (magic byte, schema id, Avro body)."""


@dataclass(frozen=True, kw_only=True)
class RegistryProtobuf(RegistryColumn):
    """Protobuf in the Confluent wire format (magic byte, schema id, message indexes, message);
    the reader is ``message_name`` of the subject's schema, or its first message."""

    format: ClassVar[Format] = Format.PROTOBUF
    message_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class RegistryJsonSchema(RegistryColumn):
    """JSON Schema in the Confluent wire format (magic byte, schema id, JSON); ``validate``: a record
    its writer schema refuses is a dead letter."""

    format: ClassVar[Format] = Format.JSON_SCHEMA
    validate: bool = True


def column_of(source: Source, format: Format, *, ddl: str | None = None, schema: str | None = None,
              subject: str | None = None, version: int | None = None, max_bytes: int | None = None,
              tombstones: bool = False, message_name: str | None = None, validate: bool = True) -> ColumnSpec:
    """The spec of one column from its options (refusing the combinations that cannot work);
    ``schema`` is the inline schema of ``format`` (Avro JSON, ``.proto`` text, JSON Schema)."""
    common: dict[str, Any] = {"source": source, "max_bytes": max_bytes, "tombstones": tombstones}
    if format is Format.RAW:
        return RawColumn(**common)
    if format is Format.JSON:
        if ddl:
            return JsonColumn(ddl=ddl, **common)
        if source is Source.KEY:
            raise ConfigError("key_format='json' needs key_schema (Spark DDL, e.g. 'id STRING')")
        # JSON values without a DDL are kept as bytes
        return RawColumn(**common)
    if ddl and source is Source.VALUE:
        raise ConfigError(f"value_schema is the Spark DDL of JSON values: with value_format={format!r} leave it "
                          f"unset ({SCHEMA_FORMATS[format][0]}: {SCHEMA_FORMATS[format][1]} or a Schema Registry)")
    if message_name is not None and format is not Format.PROTOBUF:
        raise ConfigError(f"{source.option('message_name')} names a Protobuf message: it applies only with "
                          f"{source.option('value_format')}='protobuf'")
    if format is Format.PROTOBUF:
        if schema:
            return InlineProtobuf(schema=schema, message_name=message_name, **common)
        return RegistryProtobuf(subject=subject, version=version, message_name=message_name, **common)
    if format is Format.JSON_SCHEMA:
        if schema:
            return InlineJsonSchema(schema=schema, validate=validate, **common)
        return RegistryJsonSchema(subject=subject, version=version, validate=validate, **common)
    if schema:
        return InlineAvro(schema=schema, **common)
    return RegistryAvro(subject=subject, version=version, **common)


def require_registry(columns: tuple[ColumnSpec, ...], has_registry: bool) -> None:
    """Avro, Protobuf or JSON Schema without an inline schema needs a Schema Registry (checked when
    an ingest is configured, and again by the driver that decodes)."""
    for column in columns:
        if isinstance(column, RegistryColumn) and not has_registry:
            raise ConfigError(
                f"{column.source.option('value_format')}={column.format!r}: {column.format_name} without an inline "
                f"schema needs a Schema Registry: set schema_registry_conn_id (CLI --schema-registry URL), or "
                f"{column.inline_option}")
