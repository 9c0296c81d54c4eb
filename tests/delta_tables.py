"""Tables changed the way other Delta engines change them, for the tests (never in the product).

deltalake's own ``alter`` API where it has one (``add_constraint``, ``set_table_properties``);
otherwise protocol and metadata commits written per the Delta protocol (delta-io/delta
PROTOCOL.md: "Table Features", "Deletion Vectors", "Column Mapping"), as Databricks or
delta-spark would write them, including deletion vectors (a RoaringTreemap, built with
pyroaring, stored inline, Z85-encoded). And an independent reader: DuckDB's delta extension
(delta-kernel), loaded from the file its wheel ships.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import time

import pyarrow as pa
from deltalake import DeltaTable

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
DV_MAGIC = 1681511377


def z85(data: bytes) -> str:
    """Z85 (ZeroMQ's Base85), the encoding of inline deletion vectors; padded to 4 bytes."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = struct.unpack(">I", data[i:i + 4])[0]
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def inline_deletion_vector(rows: list[int]) -> dict:
    """The descriptor of an inline DV deleting ``rows`` (row indexes < 2**32): magic, then a portable
    64-bit Roaring bitmap (LE bucket count, per bucket LE high key + a 32-bit Roaring bitmap)."""
    from pyroaring import BitMap

    raw = struct.pack("<i", DV_MAGIC) + struct.pack("<Q", 1) + struct.pack("<I", 0) + BitMap(rows).serialize()
    return {"storageType": "i", "pathOrInlineDv": z85(raw), "sizeInBytes": len(raw), "cardinality": len(rows)}


def write_commit(uri: str, actions: list[dict], operation: str = "OTHER ENGINE") -> int:
    """The next commit of the table at ``uri`` (a local path), as another engine writes it."""
    version = DeltaTable(uri).version() + 1
    actions = [*actions, {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": operation,
                                         "engineInfo": "tests/delta_tables.py"}}]
    with open(os.path.join(uri, "_delta_log", f"{version:020d}.json"), "x") as f:
        for action in actions:
            f.write(json.dumps(action) + "\n")
    return version


def metadata_action(table: DeltaTable, configuration: dict | None = None, schema: dict | None = None) -> dict:
    """The table's metaData action with ``configuration`` merged in (None values removed) and,
    optionally, a new schema (JSON)."""
    meta = table.metadata()
    config = {**meta.configuration, **(configuration or {})}
    return {"metaData": {"id": meta.id, "name": meta.name, "description": meta.description,
                         "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(schema) if schema is not None else table.schema().to_json(),
                         "partitionColumns": list(meta.partition_columns),
                         "configuration": {k: v for k, v in config.items() if v is not None},
                         "createdTime": meta.created_time}}


# what writer versions before table features imply
IMPLIED_WRITER_FEATURES = {2: ("appendOnly", "invariants"), 3: ("checkConstraints",),
                           4: ("changeDataFeed", "generatedColumns"), 5: ("columnMapping",)}


def add_features(uri: str, reader: tuple[str, ...] = (), writer: tuple[str, ...] = (),
                 configuration: dict | None = None, schema: dict | None = None) -> int:
    """Upgrade the table to table features (reader 3 when ``reader``, writer 7) and add these, with
    the metadata change that turns them on (one commit, as the protocol allows)."""
    table = DeltaTable(uri)
    protocol = table.protocol()
    old_writer = set(protocol.writer_features or ())
    if protocol.min_writer_version < 7:  # the features the old version implied (PROTOCOL.md, "Table Features")
        old_writer |= {name for version, names in IMPLIED_WRITER_FEATURES.items()
                       if protocol.min_writer_version >= version for name in names}
    writers = sorted(old_writer | set(writer) | set(reader))
    readers = sorted(set(protocol.reader_features or ()) | set(reader))
    action: dict = {"minReaderVersion": 3 if readers else 1, "minWriterVersion": 7, "writerFeatures": writers}
    if readers:
        action["readerFeatures"] = readers
    actions = [{"protocol": action}]
    if configuration or schema is not None:
        actions.append(metadata_action(table, configuration, schema))
    return write_commit(uri, actions, "UPGRADE PROTOCOL")


def delete_rows(uri: str, path: str, rows: list[int]) -> int:
    """Delete ``rows`` (row indexes) of the data file ``path`` with a deletion vector, as a DELETE on
    a table with deletion vectors enabled writes it: the file removed, and added again with its DV."""
    table = DeltaTable(uri)
    actions = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=False)).read_all().to_pylist()
    add = next(a for a in actions if a["path"] == path)
    now = int(time.time() * 1000)
    stats = json.dumps({"numRecords": add["num_records"]})
    return write_commit(uri, [
        {"remove": {"path": path, "deletionTimestamp": now, "dataChange": True, "size": add["size_bytes"],
                    "partitionValues": add.get("partition_values") or {}}},
        {"add": {"path": path, "size": add["size_bytes"], "partitionValues": add.get("partition_values") or {},
                 "modificationTime": add["modification_time"], "dataChange": True, "stats": stats,
                 "deletionVector": inline_deletion_vector(rows)}},
    ], "DELETE")


def log_digest(uri: str) -> str:
    """A hash of the table's _delta_log: equal before and after means nothing was committed."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(uri, "_delta_log", "*"))):
        digest.update(os.path.basename(path).encode())
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def duckdb_extension() -> str:
    """The delta extension file the duckdb-ext-delta wheel ships (no download)."""
    import duckdb
    import duckdb_ext  # the wheel's namespace package

    found = [p for root in duckdb_ext.__path__ for p in glob.glob(
        os.path.join(root, "**", f"v{duckdb.__version__}", "**", "delta.duckdb_extension"), recursive=True)]
    assert found, "duckdb-ext-delta ships no delta extension for this duckdb version"
    return found[0]


def duckdb_rows(uri: str, sql: str = "SELECT * FROM t") -> list[tuple]:
    """``sql`` over the table as DuckDB's delta extension (delta-kernel) reads it (view ``t``)."""
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{duckdb_extension()}'")
        con.execute(f"CREATE VIEW t AS SELECT * FROM delta_scan('{os.path.abspath(uri)}')")
        return con.execute(sql).fetchall()
    finally:
        con.close()


def enable_column_mapping(uri: str, mode: str = "name", rename: dict[str, str] | None = None) -> int:
    """Turn column mapping on as delta-spark does for an existing table (each column's physical name is
    its current name, ids 1…), optionally renaming columns (logical name only) in the same commit."""
    table = DeltaTable(uri)
    schema = json.loads(table.schema().to_json())
    for i, f in enumerate(schema["fields"], start=1):
        f["metadata"] = {**(f.get("metadata") or {}), "delta.columnMapping.id": i,
                         "delta.columnMapping.physicalName": f["name"]}
        f["name"] = (rename or {}).get(f["name"], f["name"])
    config = {"delta.columnMapping.mode": mode, "delta.columnMapping.maxColumnId": str(len(schema["fields"]))}
    return add_features(uri, reader=("columnMapping",), writer=("columnMapping",), configuration=config,
                        schema=schema)


def create_mapped_table(uri: str, schema: pa.Schema, mode: str = "id", partition_by: list[str] | None = None) -> int:
    """An empty table created with column mapping as delta-spark creates one (PROTOCOL.md "Column
    Mapping"): every field, nested ones too (in structs, list elements, map keys and values), a physical
    name ``col-<uuid>`` and an id, ``delta.columnMapping.maxColumnId`` the highest. Returns the version."""
    import uuid

    from deltalake import write_deltalake

    write_deltalake(uri, schema.empty_table(), partition_by=partition_by)
    ids = iter(range(1, 10_000))

    def mapped_type(kind):
        if isinstance(kind, dict) and kind.get("type") == "struct":
            return {**kind, "fields": [mapped(f) for f in kind["fields"]]}
        if isinstance(kind, dict) and kind.get("type") == "array":
            return {**kind, "elementType": mapped_type(kind["elementType"])}
        if isinstance(kind, dict) and kind.get("type") == "map":
            return {**kind, "keyType": mapped_type(kind["keyType"]), "valueType": mapped_type(kind["valueType"])}
        return kind

    def mapped(field: dict) -> dict:
        meta = {"delta.columnMapping.id": next(ids), "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}
        return {**field, "metadata": {**(field.get("metadata") or {}), **meta}, "type": mapped_type(field["type"])}

    table = DeltaTable(uri)
    fields = json.loads(table.schema().to_json())
    fields["fields"] = [mapped(f) for f in fields["fields"]]
    config = {"delta.columnMapping.mode": mode, "delta.columnMapping.maxColumnId": str(next(ids) - 1)}
    return write_commit(uri, [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                            "readerFeatures": ["columnMapping"],
                                            "writerFeatures": ["columnMapping", "appendOnly", "invariants"]}},
                              metadata_action(table, config, fields)], "CREATE TABLE")
