"""Avro schemas: parsed once, checked, and mapped to Spark / Arrow / Delta column types.

No Spark session and no I/O: the type mapping builds ``pyspark.sql.types`` values, so an
inline schema is checked when an ingest is configured, before any Spark job starts.
Decoding records with these schemas is :mod:`airflow_eo.decoding.avro`.

Example::

    >>> spark_type({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}).simpleString()
    'struct<id:bigint>'
"""

from __future__ import annotations

import json
from functools import lru_cache

from airflow_eo.core.errors import ConfigError

# logical types that have no column type of their own: read as their underlying type
_PLAIN_LOGICAL = {"uuid", "time-millis", "time-micros"}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _spark_types():
    from pyspark.sql import types as T

    return T


def spark_type(schema, names: dict | None = None, stack: tuple = ()):
    """The Spark type of an Avro schema (all fields nullable: a dead letter has no value).

    ==============================  ==========================================
    Avro                            Spark / Arrow / Delta
    ==============================  ==========================================
    boolean, int, long              boolean, int, bigint
    float, double                   float, double
    string, enum, uuid              string
    bytes, fixed                    binary
    decimal(p, s) (bytes/fixed)     decimal(p, s); p > 38: string
    date                            date
    timestamp-millis / -micros      timestamp (UTC)
    local-timestamp-millis/-micros  timestamp_ntz
    time-millis / time-micros       int / bigint (millis / micros of the day)
    record                          struct
    array, map                      array, map<string, …>
    union [null, T]                 T, nullable
    union of several types          string: the value as JSON
    ==============================  ==========================================
    """
    T = _spark_types()
    names = named_types(schema) if names is None else names
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return {"null": T.StringType, "boolean": T.BooleanType, "int": T.IntegerType, "long": T.LongType,
                    "float": T.FloatType, "double": T.DoubleType, "bytes": T.BinaryType,
                    "string": T.StringType}[schema]()
        if schema in stack:
            raise ConfigError(f"Avro type {schema!r} is recursive: a Delta column cannot hold it; "
                              "flatten it in the producer's schema")
        if schema not in names:
            raise ConfigError(f"Avro schema refers to an unknown type {schema!r}")
        return spark_type(names[schema], names, (*stack, schema))
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return spark_type(branches[0], names, stack) if len(branches) == 1 else T.StringType()
    kind, logical = schema.get("type"), schema.get("logicalType")
    if isinstance(kind, (dict, list)):
        return spark_type(kind, names, stack)
    if kind in ("record", "error"):
        full = _full_name(schema)
        inner = (*stack, schema["name"], full)
        return T.StructType([T.StructField(f["name"], spark_type(f["type"], names, inner), True)
                             for f in schema["fields"]])
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return T.DecimalType(precision, scale) if precision <= 38 else T.StringType()
    if logical == "date" and kind == "int":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return T.TimestampNTZType()
    if kind == "enum":
        return T.StringType()
    if kind == "fixed":
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(spark_type(schema["items"], names, stack), True)
    if kind == "map":
        return T.MapType(T.StringType(), spark_type(schema["values"], names, stack), True)
    if kind in _PRIMITIVES:
        return spark_type(kind, names, stack)
    raise ConfigError(f"Avro type {kind!r} is not supported")


def _full_name(schema: dict) -> str:
    name, namespace = schema["name"], schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def named_types(schema, namespace: str | None = None, names: dict | None = None) -> dict:
    """Every named type of ``schema`` under its short and full name; a name without a namespace
    takes the enclosing one (Avro's rule), so ``"shop.Money"`` finds a ``Money`` defined in ``shop``."""
    names = {} if names is None else names
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, namespace, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed") and "name" in schema:
            name = schema["name"]
            space = name.rsplit(".", 1)[0] if "." in name else schema.get("namespace", namespace)
            names.setdefault(name.rsplit(".", 1)[-1], schema)
            names.setdefault(f"{space}.{name.rsplit('.', 1)[-1]}" if space else name, schema)
            namespace = space
        for field in schema.get("fields", ()) if kind in ("record", "error") else ():
            named_types(field.get("type"), namespace, names)
        for key in ("items", "values"):
            if key in schema:
                named_types(schema[key], namespace, names)
        if isinstance(kind, (dict, list)):
            named_types(kind, namespace, names)
    return names


def resolve(schema, names: dict):
    """The schema itself: a named reference looked up (``names``: :func:`named_types`), ``[null, T]`` as ``T``."""
    while True:
        if isinstance(schema, str):
            if schema not in names:
                return schema
            schema = names[schema]
        elif isinstance(schema, list):
            schema = next(b for b in schema if b != "null")
        elif isinstance(schema, dict) and (isinstance(schema.get("type"), (dict, list)) or schema["type"] in names):
            schema = schema["type"]  # {"type": {...}} or {"type": "SomeNamedType"}
        else:
            return schema


def converter(schema, names: dict | None = None, stack: tuple = ()):
    """A function fixing what fastavro returns where the column type differs (several-type
    unions → JSON text, decimals over 38 digits → text), or None where nothing needs fixing."""
    names = named_types(schema) if names is None else names
    if isinstance(schema, str):
        if schema in _PRIMITIVES or schema in stack or schema not in names:
            return None
        return converter(names[schema], names, (*stack, schema))
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return converter(branches[0], names, stack)
        return None if not branches else (lambda v: None if v is None else json.dumps(v, default=str))
    kind = schema.get("type")
    if isinstance(kind, (dict, list)):
        return converter(kind, names, stack)
    if kind in ("record", "error"):
        inner = (*stack, schema["name"], _full_name(schema))
        fields = {f["name"]: converter(f["type"], names, inner) for f in schema["fields"]}
        fields = {k: c for k, c in fields.items() if c is not None}
        if not fields:
            return None
        return lambda d: None if d is None else {k: (fields[k](v) if k in fields else v) for k, v in d.items()}
    if schema.get("logicalType") == "decimal" and int(schema.get("precision", 0)) > 38:
        return lambda v: None if v is None else str(v)
    if kind == "array":
        item = converter(schema["items"], names, stack)
        return None if item is None else (lambda xs: None if xs is None else [item(x) for x in xs])
    if kind == "map":
        value = converter(schema["values"], names, stack)
        return None if value is None else (lambda m: None if m is None else {k: value(v) for k, v in m.items()})
    return None


def _plain(schema, strip: frozenset | set = frozenset(_PLAIN_LOGICAL)):
    """The schema with the logical types in ``strip`` removed (read as their underlying type)."""
    if isinstance(schema, list):
        return [_plain(b, strip) for b in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _plain(v, strip) if k in ("type", "items", "values") else v for k, v in schema.items()}
    if out.get("logicalType") in strip:
        del out["logicalType"]
    if "fields" in out:
        out["fields"] = [{**f, "type": _plain(f["type"], strip)} for f in out["fields"]]
    return out


# logical types converted a column at a time in Arrow (airflow_eo.decoding.avro_columns)
COLUMNAR_LOGICAL = frozenset({"date", "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                              "local-timestamp-micros", "decimal"})


@lru_cache(maxsize=256)
def parse(text: str, columnar: bool = False):
    """fastavro's parsed form of an Avro schema text (cached per process: one parse per schema).

    ``columnar`` also removes :data:`COLUMNAR_LOGICAL`: fastavro then returns integers and bytes
    for them, converted later in Arrow (only for schemas :func:`is_columnar` accepts)."""
    import fastavro

    strip = _PLAIN_LOGICAL | COLUMNAR_LOGICAL if columnar else _PLAIN_LOGICAL
    try:
        return fastavro.parse_schema(_plain(json.loads(text), strip))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ConfigError(f"not a valid Avro schema ({exc}): {text[:200]}") from exc


def is_columnar(schema) -> bool:
    """Whether records of ``schema`` can be decoded without their logical types and converted
    in Arrow: it has a timestamp, date or decimal to gain on, and nothing whose Python value is
    reshaped first (a several-type union becomes JSON text, a decimal over 38 digits text).
    Every named type is defined once in the schema, so its nodes are enough (no references)."""
    found = 0
    for node in _type_nodes(schema):
        if isinstance(node, list):
            if len([b for b in node if b != "null"]) > 1:
                return False
            continue
        kind, logical = node.get("type"), node.get("logicalType")
        if logical in COLUMNAR_LOGICAL:  # on the underlying type spark_type maps, or not at all
            fits = {"decimal": kind in ("bytes", "fixed") and int(node.get("precision", 0)) <= 38,
                    "date": kind == "int"}.get(logical, kind == "long")
            if not fits:
                return False
            found += 1
    return found > 0


def _type_nodes(schema):
    """Every union (a list) and type object (a dict) written in ``schema``."""
    if isinstance(schema, list):
        yield schema
        for branch in schema:
            yield from _type_nodes(branch)
    elif isinstance(schema, dict):
        yield schema
        kind = schema.get("type")
        for field in schema.get("fields", ()) if kind in ("record", "error") else ():
            yield from _type_nodes(field.get("type"))
        for key in ("items", "values"):
            if key in schema:
                yield from _type_nodes(schema[key])
        if isinstance(kind, (dict, list)):
            yield from _type_nodes(kind)


def check_schema(text: str) -> None:
    """Raise a one-line ConfigError unless ``text`` is an Avro schema airflow-eo can map."""
    text = canonical(text)
    parse(text)
    try:
        spark_type(json.loads(text))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"not a valid Avro schema (missing or wrong {exc}): {text[:200]}") from exc


def canonical(text: str) -> str:
    """One text per schema (keys sorted, no spaces): the cache key of :func:`parse`."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"the Avro schema is not JSON ({exc}): {text[:200]}") from exc
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


