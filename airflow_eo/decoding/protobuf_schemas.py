"""Protobuf schemas as descriptors: from the registry's serialized form, or ``.proto`` text compiled with protoc.

A Protobuf schema reaches airflow-eo in one of two forms, and both become one
``FileDescriptorSet`` (the schema's file and every file it imports, dependencies first), which
Google's ``protobuf`` runtime turns into message descriptors and dynamic message classes:

- the registry's **serialized** form (``GET /schemas/ids/{id}?format=serialized``: a base64
  ``FileDescriptorProto``), which is what airflow-eo asks a Schema Registry for, as Confluent's
  own deserializer does; the files it imports are the schema's references, fetched the same way;
- **.proto text** (``protobuf_schema``, or a registry that answers text): compiled by the
  ``protoc`` that the ``grpcio-tools`` wheel ships (``python -m grpc_tools.protoc``, extra
  ``airflow-eo[protobuf]``), with the serialized files it imports handed in as compiled
  descriptors (``--descriptor_set_in``). Nothing is downloaded and nothing parses ``.proto`` here.

The ``google/protobuf/*.proto`` well-known types come from the runtime itself (never from the
registry, as Confluent's clients skip them too). :class:`ProtoSchema` is the picklable result the
Spark tasks get: the bytes of the set, its descriptors built once per process.

Example::

    >>> schema = compile_proto('syntax = "proto3"; package shop; message Order { int64 id = 1; }')  # doctest: +SKIP
    >>> schema.message("shop.Order").fields[0].name                                                # doctest: +SKIP
    'id'
"""

from __future__ import annotations

import base64
import binascii
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache

from airflow_eo.core.errors import ConfigError
from airflow_eo.decoding.registry import SERIALIZED, FoundSchema, SchemaRegistry

ROOT_FILE = "schema.proto"  # the name the compiled root file gets when the registry gives it none


@lru_cache(maxsize=1)
def well_known() -> dict:
    """The ``google/protobuf/*.proto`` files of the runtime: name → serialized ``FileDescriptorProto``."""
    from google.protobuf import (
        any_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2, field_mask_pb2, source_context_pb2, struct_pb2,
        timestamp_pb2, type_pb2, wrappers_pb2,
    )

    modules = (any_pb2, source_context_pb2, type_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2,
               field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
    return {m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb for m in modules}


def serialized_file(text: str):
    """The ``FileDescriptorProto`` of a registry's serialized form (base64), or None when ``text`` is
    ``.proto`` text."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        raw = base64.b64decode(text.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto


@dataclass(frozen=True)
class ProtoSchema:
    """One Protobuf schema as a serialized ``FileDescriptorSet`` (dependencies first) and the name of its
    file; ``where`` names it in messages. Picklable: its descriptor pool is built once per process."""

    files: bytes
    root: str
    where: str = "the inline schema"
    _pool: list = field(default_factory=list, repr=False, compare=False)

    def __getstate__(self):
        return {"files": self.files, "root": self.root, "where": self.where}

    def __setstate__(self, state):
        object.__setattr__(self, "files", state["files"])
        object.__setattr__(self, "root", state["root"])
        object.__setattr__(self, "where", state["where"])
        object.__setattr__(self, "_pool", [])

    @property
    def pool(self):
        if not self._pool:
            self._pool.append(_pool_of(self.files, self.where))
        return self._pool[0]

    @property
    def file(self):
        return self.pool.FindFileByName(self.root)

    def messages(self) -> list[str]:
        """The full names of the file's top-level messages, in order."""
        return [m.full_name for m in self.file.message_types_by_name.values()]

    def message(self, name: str | None = None, option: str = "message_name"):
        """The descriptor of message ``name`` (a full name ``package.Message``, or a name the file's
        messages have once), or of the file's first message when ``name`` is None."""
        file = self.file
        if name is None:
            if not file.message_types_by_name:
                raise ConfigError(f"{self.where} defines no message: a Protobuf value is a message")
            return next(iter(file.message_types_by_name.values()))
        try:
            return self.pool.FindMessageTypeByName(name.lstrip("."))
        except KeyError:
            pass
        matches = [d for d in _all_messages(file) if d.full_name.endswith("." + name) or d.name == name]
        if len(matches) == 1:
            return matches[0]
        raise ConfigError(f"{option} {name!r} is not a message of {self.where} (its messages: "
                          f"{', '.join(self.messages()) or 'none'}): name one by its full name, e.g. "
                          f"{(self.messages() or ['package.Message'])[0]!r}")

    def message_at(self, indexes: tuple[int, ...]):
        """The message at ``indexes`` (the wire format's message-index path: top-level, then nested),
        or None when the file has no such message."""
        messages = list(self.file.message_types_by_name.values())
        found = None
        for i in indexes:
            if not 0 <= i < len(messages):
                return None
            found = messages[i]
            messages = list(found.nested_types)
        return found


def _all_messages(file):
    stack = list(file.message_types_by_name.values())
    while stack:
        message = stack.pop(0)
        yield message
        stack.extend(message.nested_types)


def _pool_of(files: bytes, where: str):
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for serialized in well_known().values():
        pool.AddSerializedFile(serialized)
    for proto in descriptor_pb2.FileDescriptorSet.FromString(files).file:
        if proto.name in well_known():
            continue
        try:
            pool.Add(proto)
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{where} is not a usable Protobuf schema ({proto.name}: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from exc
    return pool


def compile_proto(text: str, name: str = ROOT_FILE, imports: dict[str, str] | None = None,
                  compiled: list | None = None, where: str = "the inline schema") -> ProtoSchema:
    """``.proto`` ``text`` (and the ``.proto`` texts it imports, by import name) compiled by protoc; the
    already compiled files it imports as ``FileDescriptorProto`` s (``compiled``, dependencies first).
    Compiled once per process for the same inputs (protoc is a child process: ~0.1 s)."""
    return _compile(text, name, tuple(sorted((imports or {}).items())),
                    tuple(f.SerializeToString(deterministic=True) for f in compiled or ()), where)


@lru_cache(maxsize=64)
def _compile(text: str, name: str, import_items: tuple, compiled_files: tuple, where: str) -> ProtoSchema:
    from google.protobuf import descriptor_pb2

    imports = dict(import_items)
    compiled = [descriptor_pb2.FileDescriptorProto.FromString(f) for f in compiled_files]

    try:
        import grpc_tools  # noqa: F401 - only its presence: protoc runs in a child process
    except ImportError:
        raise ConfigError(f"{where} is .proto text, which needs protoc to compile: install airflow-eo[protobuf] "
                          "(grpcio-tools), or have the Schema Registry serve the serialized form") from None
    with tempfile.TemporaryDirectory(prefix="airflow-eo-proto-") as tmp:
        for path, body in {**(imports or {}), name: text}.items():
            target = os.path.join(tmp, "src", path)
            if not os.path.realpath(target).startswith(os.path.realpath(os.path.join(tmp, "src")) + os.sep):
                raise ConfigError(f"{where}: the import name {path!r} leaves the schema's directory")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as out:
                out.write(body)
        args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{os.path.join(tmp, 'src')}", "--include_imports",
                f"--descriptor_set_out={os.path.join(tmp, 'out.pb')}"]
        if compiled:
            with open(os.path.join(tmp, "in.pb"), "wb") as out:
                out.write(descriptor_pb2.FileDescriptorSet(file=compiled).SerializeToString())
            args.append(f"--descriptor_set_in={os.path.join(tmp, 'in.pb')}")
        done = subprocess.run([*args, name], capture_output=True, text=True, timeout=120, cwd=tmp)
        if done.returncode != 0:
            lines = [line.replace(os.path.join(tmp, "src") + os.sep, "") for line in done.stderr.strip().splitlines()
                     if line.strip()] or [f"protoc exited with {done.returncode}"]
            raise ConfigError(f"{where} is not valid Protobuf: {lines[0][:300]}")
        with open(os.path.join(tmp, "out.pb"), "rb") as out:
            produced = descriptor_pb2.FileDescriptorSet.FromString(out.read())
    files = [*(compiled or []), *(f for f in produced.file if f.name not in {c.name for c in compiled or []})]
    schema = ProtoSchema(descriptor_pb2.FileDescriptorSet(file=files).SerializeToString(), name, where)
    schema.pool  # noqa: B018 - built (and so checked) now
    return schema


def registry_schema(found: FoundSchema, registry: SchemaRegistry, where: str) -> ProtoSchema:
    """The descriptors of a Protobuf schema of the registry and of every schema it references
    (fetched in the serialized form; ``.proto`` text where the registry answers text)."""
    from google.protobuf import descriptor_pb2

    if found.schema_type != "PROTOBUF":
        raise ConfigError(f"{where} is a {found.schema_type} schema, not Protobuf")
    compiled: list = []
    texts: dict[str, str] = {}
    seen: set[str] = set()

    def gather(schema: FoundSchema) -> None:
        for ref in schema.references:
            if ref.name in seen or ref.name in well_known() or ref.name.startswith("google/protobuf/"):
                continue
            seen.add(ref.name)
            dep = registry.version(ref.subject, ref.version, fmt=SERIALIZED).found
            gather(dep)  # its imports first
            proto = serialized_file(dep.text)
            if proto is None:
                texts[ref.name] = dep.text
            else:
                proto.name = ref.name  # the name the importing file imports it as
                compiled.append(proto)

    gather(found)
    root = serialized_file(found.text)
    if root is not None and not texts:
        root.name = root.name or ROOT_FILE
        schema = ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[*compiled, root]).SerializeToString(),
                             root.name, where)
        schema.pool  # noqa: B018 - checked now
        return schema
    if root is not None:  # serialized, importing text: compile the texts, then add the root
        imports = compile_many(texts, compiled, where)
        schema = ProtoSchema(descriptor_pb2.FileDescriptorSet(file=[*imports, root]).SerializeToString(),
                             root.name or ROOT_FILE, where)
        schema.pool  # noqa: B018
        return schema
    return compile_proto(found.text, ROOT_FILE, texts, compiled, where)


def compile_many(texts: dict[str, str], compiled: list, where: str) -> list:
    """The ``FileDescriptorProto`` s of several ``.proto`` texts that import one another (and ``compiled``)."""
    from google.protobuf import descriptor_pb2

    out = list(compiled)
    for name in texts:
        if any(f.name == name for f in out):
            continue
        done = compile_proto(texts[name], name, texts, out, where)
        out = list(descriptor_pb2.FileDescriptorSet.FromString(done.files).file)
    return out
