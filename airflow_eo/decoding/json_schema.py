"""JSON Schema keys and values: validated with ``jsonschema`` and decoded into struct columns, a batch at a time inside Spark tasks.

:class:`JsonSchemaColumn` is JSON Schema's :class:`~airflow_eo.decoding.decoder.ColumnDecoder`,
applied by the read step's :class:`~airflow_eo.decoding.decoder.RecordDecoder` in the task that
read each batch, as Avro's and Protobuf's are. Each record is parsed as JSON, **validated** against
the schema it was written with (a record the schema refuses, e.g. one missing a ``required``
property, is a dead letter with ``jsonschema``'s reason; ``json_schema_validation=false`` skips
this) and read into the reader schema's columns (:mod:`.json_schema_types`).

- **Schema Registry** (Confluent wire format: magic byte 0, a 4-byte schema id, then the JSON): the
  writer schema is the record's id's (fetched once per id and task); the reader schema the subject's
  version pinned in the batch's plan. A property the writer schema lacks reads null; a property both
  declare with types that do not read as one another (an integer becoming a string) fails the batch
  (:class:`~airflow_eo.core.errors.IncompatibleSchemaError`, nothing committed).
- **An inline schema** (``json_schema``): plain JSON, validated against it and read into it.

Each record is checked by a validator **fastjsonschema** compiles once per schema and task (drafts 4,
6 and 7; draft 7 when ``$schema`` names none, as Confluent's serializers write): ~35 times faster than
``jsonschema`` on the benchmark's records. A record it refuses gets ``jsonschema``'s reason (its
most relevant error and where); a schema of a later draft (2019-09, 2020-12) is checked by
``jsonschema``'s validator for it throughout, with its built-in format checks.

Example::

    >>> spec = InlineJsonSchema(source=Source.VALUE, schema='{"type": "object", "properties": {"id": '
    ...                         '{"type": "integer"}}, "required": ["id"]}')
    >>> column = JsonSchemaColumn(spec, spec.schema)
    >>> column.decode([b'{"id": 1}', b'{}', b'nope'])[1]           # doctest: +ELLIPSIS
    [None, "value does not match its JSON Schema (the inline schema): 'id' is a required property", 'value is not JSON...']
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field

from airflow_eo.core.errors import ConfigError, IncompatibleSchemaError
from airflow_eo.decoding.json_schema_types import Node, NotDecodable, incompatibility, parse
from airflow_eo.decoding.registry import WIRE_HEADER_BYTES, WIRE_MAGIC, SchemaRegistry
from airflow_eo.decoding.shared import TaskCache, fitted_array
from airflow_eo.spec.columns import ColumnSpec, InlineJsonSchema, Source  # noqa: F401 - the example


def load(text: str, where: str = "the inline schema"):
    """A JSON Schema text as a parsed value, refused in one line when it is not JSON or not a schema."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSON ({exc}): {text[:200]}") from exc
    validator_class(schema, where)
    return schema


def validator_class(schema, where: str = "the inline schema"):
    """``jsonschema``'s validator class for ``schema`` (its ``$schema``; draft 7 without), once checked."""
    from jsonschema import Draft7Validator, exceptions, validators

    cls = validators.validator_for(schema, default=Draft7Validator)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError as exc:
        raise ConfigError(f"{where} is not a valid JSON Schema: {exc.message[:200]}") from exc
    return cls


@dataclass(frozen=True)
class _Writer:
    """One writer schema: its validators (None: validation off), or why its records are dead letters.
    ``fast`` (fastjsonschema's, raises on a refused record) checks; ``validator`` (jsonschema's) explains."""

    validator: object = None
    fast: object = None
    reason: str | None = None

    def refusal(self, value) -> str | None:
        """Why the schema refuses ``value`` (one line), or None when it passes."""
        if self.fast is not None:
            import fastjsonschema

            try:
                self.fast(value)  # type: ignore[operator]
                return None
            except fastjsonschema.JsonSchemaException as exc:
                return _why(self.validator, value) or str(exc).splitlines()[0][:200]
        if self.validator is None or self.validator.is_valid(value):  # type: ignore[attr-defined]
            return None
        return _why(self.validator, value) or "refused"


def _fast(schema):
    """fastjsonschema's compiled validator of ``schema``, or None for a draft it does not know (or a
    schema it cannot compile: jsonschema then checks alone)."""
    import fastjsonschema

    drafts = ("http://json-schema.org/draft-04/schema", "http://json-schema.org/draft-06/schema",
              "http://json-schema.org/draft-07/schema")
    named = schema.get("$schema", drafts[-1]) if isinstance(schema, dict) else drafts[-1]
    if str(named).rstrip("#").replace("https://", "http://") not in drafts:
        return None
    try:
        return fastjsonschema.compile(schema, use_default=False)
    except (fastjsonschema.JsonSchemaDefinitionException, ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True)
class JsonSchemaColumn(TaskCache):
    """Decodes one Kafka column into the struct column of ``reader_schema``: the
    :class:`~airflow_eo.decoding.decoder.ColumnDecoder` of JSON Schema. With ``registry`` the bytes are
    in the Confluent wire format; without, plain JSON of the reader schema."""

    spec: ColumnSpec
    reader_schema: str
    registry: SchemaRegistry | None = None
    reader_name: str = "the inline schema"
    reader_id: int | None = None
    validate: bool = True
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> str:
        return self.spec.source.value

    @property
    def node(self) -> Node:
        found = self._cache.get("node")
        if found is None:
            found = self._cache["node"] = parse(load(self.reader_schema, self.reader_name))
        return found

    def check(self) -> None:
        """Raise a one-line ConfigError unless the reader schema is a JSON Schema airflow-eo can map."""
        self.node.spark_type()

    def spark_type(self):
        return self.node.spark_type()

    def to_arrow(self, values: list, arrow_type) -> tuple:
        records, reasons = self.decode(values)
        return fitted_array(records, reasons, arrow_type, "JSON"), reasons

    def decode(self, values: list) -> tuple[list, list]:
        """(decoded records or None, dead-letter reason or None) for each raw value."""
        convert = self._cache.get("convert")
        if convert is None:
            convert = self._cache["convert"] = self.node.converter()
        records: list = []
        reasons: list = []
        loads = json.loads
        collecting = gc.isenabled()
        gc.disable()  # many small dicts, no cycles (as for Avro)
        try:
            for raw in values:
                record = reason = None
                if raw is not None:
                    schema_id, body, writer = self._writer_of(raw)
                    reason = writer.reason
                    if reason is None:
                        try:
                            value = loads(body)
                        except ValueError as exc:
                            value, reason = None, f"{self.source} is not JSON ({self._which(schema_id)}): {exc}"
                        if reason is None and writer.validator is not None:
                            why = writer.refusal(value)
                            if why is not None:
                                reason = f"{self.source} does not match its JSON Schema ({self._which(schema_id)}): {why}"
                        if reason is None:
                            try:
                                record = convert(value)
                            except NotDecodable as exc:
                                reason = f"{self.source} does not fit the reader schema's columns: {exc}"
                records.append(record)
                reasons.append(reason)
        finally:
            if collecting:
                gc.enable()
        return records, reasons

    def _which(self, schema_id: int | None) -> str:
        return self.reader_name if schema_id is None else f"writer schema id {schema_id}"

    def _writer_of(self, raw: bytes) -> tuple:
        """(schema id or None, the JSON bytes, the writer)."""
        if self.registry is None:
            return None, raw, self._writer(None)
        if len(raw) < WIRE_HEADER_BYTES or raw[0] != WIRE_MAGIC:
            return None, b"", _Writer(reason=f"{self.source} is not in the Confluent wire format (magic byte 0 and "
                                             f"a 4-byte schema id; got first byte {raw[0] if raw else 'none'})")
        schema_id = int.from_bytes(raw[1:WIRE_HEADER_BYTES], "big")
        return schema_id, raw[WIRE_HEADER_BYTES:], self._writer(schema_id)

    def _writer(self, schema_id: int | None) -> _Writer:
        found = self._cache.get(("writer", schema_id))
        if found is None:
            found = self._cache[("writer", schema_id)] = self._resolve(schema_id)
        return found

    def _resolve(self, schema_id: int | None) -> _Writer:
        if schema_id is None or schema_id == self.reader_id:
            schema = load(self.reader_schema, self.reader_name)
        else:
            assert self.registry is not None
            found = self.registry.schema(schema_id)
            if found is None:
                return _Writer(reason=f"unknown schema id {schema_id} (not in the Schema Registry {self.registry.url})")
            if found.schema_type != "JSON":
                return _Writer(reason=f"{self.source} was written with schema id {schema_id}, a {found.schema_type} "
                                      "schema, not JSON Schema")
            schema = load(found.text, f"writer schema id {schema_id}")
            why = incompatibility(self.node, parse(schema))
            if why is not None:
                raise IncompatibleSchemaError(
                    f"writer schema id {schema_id} cannot be read as {self.reader_name}: {why}; nothing was committed: "
                    "make the change compatible (a new property instead of a new type) or pin the reader schema "
                    "version")
        if not self.validate:
            return _Writer()
        cls = validator_class(schema, self._which(schema_id))
        return _Writer(validator=cls(schema, format_checker=cls.FORMAT_CHECKER), fast=_fast(schema))


def _why(validator, value) -> str | None:
    """``jsonschema``'s most relevant error, in one line, with where it is when not at the top."""
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    message = error.message.splitlines()[0][:200]
    return f"{message} (at ${where})" if where else message
