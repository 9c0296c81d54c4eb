"""JSON Schemas → column types, JSON values → column values, and whether a writer schema reads as a reader.

No I/O and no validation (that is ``jsonschema``'s, in :mod:`.json_schema`). A schema is read once
into a small tree of :class:`Node` s (its local ``$ref`` s resolved), from which come the Spark
type (:meth:`Node.spark_type`), the function turning a parsed JSON value into what Arrow takes
(:meth:`Node.converter`), and the check of a writer schema against the reader (:func:`incompatibility`).

==========================================================  =====================================
JSON Schema                                                 Spark / Arrow / Delta
==========================================================  =====================================
``string``; ``format: date-time``; ``format: date``         string; timestamp (UTC); date
``integer``, ``number``, ``boolean``                        bigint, double, boolean
``enum`` / ``const`` of strings (of integers)               string (bigint)
``object`` with ``properties``                              struct (declared properties, in order)
  ... and ``additionalProperties: true`` or a schema        + ``_additional_properties``: the other keys as JSON text
``object`` with only ``additionalProperties: {schema}``     map<string, …>
``array`` with ``items: {schema}``                          array<…>
``type: ["x", "null"]``, ``anyOf``/``oneOf`` of x and null  x, nullable
``$ref`` to ``#/$defs/…`` / ``#/definitions/…``             what it points at
anything else (several types, a free-form object, ``{}``)   string: the value's JSON text
==========================================================  =====================================

Every column is nullable: a property that is missing (and not ``required``) reads null. An object
that leaves ``additionalProperties`` unset keeps only its declared properties (most schemas leave
it unset without meaning to allow extra keys; set it to ``true`` to keep them as JSON text).

Example::

    >>> node = parse({"type": "object", "properties": {"id": {"type": "integer"},
    ...     "at": {"type": "string", "format": "date-time"}}, "required": ["id"]})
    >>> node.kind, [(n, f.kind) for n, f in node.fields]
    ('struct', [('id', 'long'), ('at', 'timestamp')])
    >>> node.converter()({"id": 3, "at": "2026-01-02T03:04:05Z", "more": 1})
    {'id': 3, 'at': datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)}
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from airflow_eo.core.errors import ConfigError

EXTRA_COLUMN = "_additional_properties"


class NotDecodable(Exception):
    """A value that does not fit the reader schema's columns (when validation is off, or the writer differs)."""


@dataclass(frozen=True)
class Node:
    """One column type of a JSON Schema: ``kind`` (``json``, ``string``, ``timestamp``, ``date``,
    ``long``, ``double``, ``boolean``, ``struct``, ``array``, ``map``), a struct's ``fields``, an array's
    or a map's ``item``, and whether a struct keeps its undeclared keys (``extra``)."""

    kind: str
    fields: tuple[tuple[str, "Node"], ...] = ()
    item: "Node | None" = None
    extra: bool = False

    def spark_type(self):
        from pyspark.sql import types as T

        if self.kind == "struct":
            columns = [T.StructField(name, node.spark_type(), True) for name, node in self.fields]
            if self.extra:
                columns.append(T.StructField(EXTRA_COLUMN, T.StringType(), True))
            return T.StructType(columns)
        if self.kind == "array":
            assert self.item is not None
            return T.ArrayType(self.item.spark_type(), True)
        if self.kind == "map":
            assert self.item is not None
            return T.MapType(T.StringType(), self.item.spark_type(), True)
        return {"json": T.StringType, "string": T.StringType, "timestamp": T.TimestampType, "date": T.DateType,
                "long": T.LongType, "double": T.DoubleType, "boolean": T.BooleanType}[self.kind]()

    def converter(self, path: str = "$") -> Callable[[Any], Any]:
        """value → what Arrow takes for this column (None stays None); NotDecodable when it does not fit."""
        kind = self.kind
        if kind == "json":
            return lambda v: None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        if kind == "struct":
            fields = [(name, node.converter(f"{path}.{name}")) for name, node in self.fields]
            declared = {name for name, _ in self.fields}
            extra = self.extra

            def struct(v):
                if v is None:
                    return None
                if not isinstance(v, dict):
                    raise NotDecodable(f"at {path}: expected an object, got {_shown(v)}")
                out = {name: convert(v.get(name)) for name, convert in fields}
                if extra:
                    rest = {k: x for k, x in v.items() if k not in declared}
                    out[EXTRA_COLUMN] = json.dumps(rest, ensure_ascii=False, separators=(",", ":")) if rest else None
                return out
            return struct
        if kind in ("array", "map"):
            assert self.item is not None
            item = self.item.converter(f"{path}[]")
            want, shape = (list, "an array") if kind == "array" else (dict, "an object")

            def many(v):
                if v is None:
                    return None
                if not isinstance(v, want):
                    raise NotDecodable(f"at {path}: expected {shape}, got {_shown(v)}")
                return [item(x) for x in v] if kind == "array" else {k: item(x) for k, x in v.items()}
            return many
        return _SCALARS[kind](path)


def _shown(value) -> str:
    return json.dumps(value)[:60]


def _string(path):
    def convert(v):
        if v is None or isinstance(v, str):
            return v
        raise NotDecodable(f"at {path}: expected a string, got {_shown(v)}")
    return convert


def _long(path):
    def convert(v):
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            if v is not None and not -2**63 <= v < 2**63:
                raise NotDecodable(f"at {path}: {v} does not fit a 64-bit integer")
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise NotDecodable(f"at {path}: expected an integer, got {_shown(v)}")
    return convert


def _double(path):
    def convert(v):
        if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            return None if v is None else float(v)
        raise NotDecodable(f"at {path}: expected a number, got {_shown(v)}")
    return convert


def _boolean(path):
    def convert(v):
        if v is None or isinstance(v, bool):
            return v
        raise NotDecodable(f"at {path}: expected true or false, got {_shown(v)}")
    return convert


# RFC 3339's date-time, for Pythons whose fromisoformat reads only what isoformat writes (3.10: a
# fraction of 3 or 6 digits, no "Z"): its parts, the fraction padded or cut to microseconds
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)?")


def parse_timestamp(text: str) -> dt.datetime:
    """An RFC 3339 date-time (``Z`` or an offset; none: UTC) as an aware datetime.

    >>> parse_timestamp("2026-03-04T05:06:07.5+01:00").isoformat()
    '2026-03-04T05:06:07.500000+01:00'
    """
    try:
        value = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        parts = _RFC3339.fullmatch(text)
        if parts is None:
            raise
        day, time, fraction, zone = parts.groups()
        value = dt.datetime.fromisoformat(f"{day}T{time}.{(fraction or '').ljust(6, '0')[:6]}"
                                          f"{'+00:00' if zone in ('Z', 'z') else zone or ''}")
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def _timestamp(path):
    def convert(v):
        if v is None:
            return None
        try:
            return parse_timestamp(v)
        except (TypeError, ValueError, IndexError):
            raise NotDecodable(f"at {path}: expected a date-time (RFC 3339), got {_shown(v)}") from None
    return convert


def _date(path):
    def convert(v):
        if v is None:
            return None
        try:
            return dt.date.fromisoformat(v)
        except (TypeError, ValueError):
            raise NotDecodable(f"at {path}: expected a date (YYYY-MM-DD), got {_shown(v)}") from None
    return convert


_SCALARS = {"string": _string, "long": _long, "double": _double, "boolean": _boolean, "timestamp": _timestamp,
            "date": _date}
_JSON = Node("json")


def parse(schema: Any) -> Node:
    """The column type of a JSON Schema (a parsed JSON value); a ConfigError for a ``$ref`` that is not
    local or a recursive one (a Delta column cannot hold it)."""
    if not isinstance(schema, (dict, bool)):
        raise ConfigError(f"a JSON Schema is an object (or true/false), not {type(schema).__name__}")
    return _node(schema, schema, ())


def _resolve(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        raise ConfigError(f"JSON Schema $ref {ref!r} points outside the schema: only local references "
                          "(#/$defs/..., #/definitions/...) are read")
    target = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise ConfigError(f"JSON Schema $ref {ref!r} points at nothing in the schema")
    return target


def _node(schema: Any, root: Any, stack: tuple) -> Node:
    if isinstance(schema, bool) or not schema:
        return _JSON
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in stack:
            raise ConfigError(f"JSON Schema $ref {ref!r} is recursive: a Delta column cannot hold it; flatten it "
                              "or describe that part as {} (kept as JSON text)")
        return _node(_resolve(ref, root), root, (*stack, ref))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = [b for b in schema[key] if not (isinstance(b, dict) and b.get("type") == "null")]
            return _node(branches[0], root, stack) if len(branches) == 1 else _JSON
    if "allOf" in schema:
        return _node(schema["allOf"][0], root, stack) if len(schema["allOf"]) == 1 else _JSON
    for key in ("enum", "const"):
        if key in schema:
            values = [v for v in (schema[key] if key == "enum" else [schema[key]]) if v is not None]
            if values and all(isinstance(v, str) for v in values):
                return Node("string")
            if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                return Node("long")
            return _JSON
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            return _JSON
        kind = kinds[0]
    if kind is None:
        kind = "object" if "properties" in schema else ("array" if "items" in schema else None)
    if kind == "string":
        return Node({"date-time": "timestamp", "date": "date"}.get(schema.get("format"), "string"))
    if kind in ("integer", "number", "boolean"):
        return Node({"integer": "long", "number": "double", "boolean": "boolean"}[kind])
    if kind == "object":
        extra = schema.get("additionalProperties")
        if "properties" not in schema:
            if isinstance(extra, dict) and extra:
                return Node("map", item=_node(extra, root, stack))
            return _JSON
        fields = tuple((name, _node(sub, root, stack)) for name, sub in schema["properties"].items())
        if not fields:
            return _JSON
        return Node("struct", fields, extra=extra is True or isinstance(extra, dict))
    if kind == "array":
        items = schema.get("items")
        return Node("array", item=_node(items, root, stack)) if isinstance(items, dict) else _JSON
    return _JSON


_WIDENS = {("long", "double")}  # a writer's integer reads as a reader's number


def incompatibility(reader: Node, writer: Node, path: str = "$") -> str | None:
    """Why values of ``writer``'s schema cannot be read as ``reader``'s columns (the first property whose
    types differ), or None: properties only one side has are fine, anything reads as JSON text."""
    if reader.kind == "json" or reader.kind == writer.kind and reader.kind not in ("struct", "array", "map"):
        return None
    if (writer.kind, reader.kind) in _WIDENS:
        return None
    if reader.kind != writer.kind:
        return f"property {path} is {writer.kind} in the writer schema, {reader.kind} in the reader schema"
    if reader.kind == "struct":
        theirs = dict(writer.fields)
        for name, node in reader.fields:
            if name in theirs:
                why = incompatibility(node, theirs[name], f"{path}.{name}")
                if why is not None:
                    return why
        return None
    assert reader.item is not None and writer.item is not None
    return incompatibility(reader.item, writer.item, f"{path}[]")
