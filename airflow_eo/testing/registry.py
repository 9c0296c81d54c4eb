"""A Schema Registry stand-in for tests (a test double, not a registry): the plugin's ``schema_registry``.

No Schema Registry server installs from PyPI, so tests of Avro, Protobuf and JSON Schema through a
registry run against this small in-memory server that answers the subset of the Confluent
Schema Registry REST API that airflow-eo and confluent-kafka's serializers call:

- ``POST /subjects/{subject}/versions`` — register (the same schema keeps its id), with its
  ``schemaType`` (``AVRO`` when absent, ``PROTOBUF``, ``JSON``) and ``references``
  (``[{"name", "subject", "version"}]``: the other subjects' versions a schema imports),
- ``POST /subjects/{subject}`` — look a schema up (confluent-kafka's serializers do, for references),
- ``GET /schemas/ids/{id}`` — a schema by id,
- ``GET /subjects/{subject}/versions/{version|latest}`` — a version of a subject.

Both GETs take ``?format=serialized``: a Protobuf schema registered as ``.proto`` text is then
answered as a real registry answers it, a base64 ``FileDescriptorProto`` (compiled here with the
protoc of grpcio-tools, its references handed in); one registered in that form (as confluent-kafka's
``ProtobufSerializer`` registers) is answered as it came, in both formats (a real registry would
answer the text form as ``.proto`` text, which no Python library prints).

It does no compatibility checking (a real registry refuses incompatible versions: the tests
that need an incompatible writer register it under another subject). Binds 127.0.0.1 on a
free port; ``stop()`` shuts it down. ``requests`` counts calls per path kind, so tests can
check that schemas are fetched once per id rather than per record. Optional basic auth.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryDouble:
    def __init__(self, user_info: str | None = None):
        self.schemas: dict[int, str] = {}  # id -> schema text
        self.types: dict[int, str] = {}  # id -> schemaType (AVRO, PROTOBUF, JSON)
        self.references: dict[int, list[dict]] = {}  # id -> [{"name", "subject", "version"}]
        self._compiled: dict[int, str] = {}  # id -> the serialized form of a Protobuf schema registered as text
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version (1-based)
        self.requests: Counter = Counter()
        self.user_info = user_info
        self.failing = False  # answer 503 to schema-by-id lookups (a registry that went away)
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if double.user_info is None:
                    return True
                expected = "Basic " + base64.b64encode(double.user_info.encode()).decode()
                if self.headers.get("Authorization") == expected:
                    return True
                self._send(401, {"error_code": 40101, "message": "Unauthorized"})
                return False

            def do_GET(self):
                if not self._authorized():
                    return
                path, _, query = self.path.partition("?")
                serialized = "format=serialized" in query.split("&")
                if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                    double.requests["schema_by_id"] += 1
                    if double.failing:
                        return self._send(503, {"error_code": 50301, "message": "Service Unavailable"})
                    sid = int(m.group(1))
                    if sid not in double.schemas:
                        return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                    return self._send(200, double.answer(sid, serialized))
                if m := re.fullmatch(r"/subjects/([^/]+)/versions/(\w+)", path):
                    double.requests["subject_version"] += 1
                    subject = unquote(m.group(1))
                    ids = double.subjects.get(subject, [])
                    version = len(ids) if m.group(2) == "latest" else int(m.group(2))
                    if not ids or not 1 <= version <= len(ids):
                        return self._send(404, {"error_code": 40401, "message": "Subject or version not found"})
                    sid = ids[version - 1]
                    return self._send(200, {"subject": subject, "version": version, "id": sid,
                                            **double.answer(sid, serialized)})
                self._send(404, {"error_code": 404, "message": f"not served by the test double: {path}"})

            def do_POST(self):
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                    double.requests["register"] += 1
                    sid = double.register(unquote(m.group(1)), body["schema"], body.get("schemaType", "AVRO"),
                                          body.get("references") or ())
                    return self._send(200, {"id": sid})
                if m := re.fullmatch(r"/subjects/([^/]+)", path):  # look up a schema under a subject
                    double.requests["lookup"] += 1
                    subject = unquote(m.group(1))
                    sid = double.find(body["schema"], body.get("schemaType", "AVRO"))
                    ids = double.subjects.get(subject, [])
                    if sid is None or sid not in ids:
                        return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                    return self._send(200, {"subject": subject, "version": ids.index(sid) + 1, "id": sid,
                                            **double.answer(sid, False)})
                self._send(404, {"error_code": 404, "message": f"not served by the test double: {path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def register(self, subject: str, schema: str, schema_type: str = "AVRO", references=()) -> int:
        """Register ``schema`` (of ``schema_type``, importing ``references``: dicts of name, subject and
        version) under ``subject`` (what producers do); returns its id."""
        schema_type = (schema_type or "AVRO").upper()
        refs = [{"name": r["name"], "subject": r["subject"], "version": int(r["version"])} for r in references]
        with self.lock:
            sid = self.find(schema, schema_type, refs)
            if sid is None:
                sid = len(self.schemas) + 1
                self.schemas[sid], self.types[sid], self.references[sid] = schema, schema_type, refs
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid

    def find(self, schema: str, schema_type: str = "AVRO", references=None) -> int | None:
        """The id ``schema`` has (the same JSON, or the same Protobuf text), or None."""
        def same(sid: int) -> bool:
            if self.types.get(sid, "AVRO") != (schema_type or "AVRO").upper():
                return False
            if references is not None and self.references.get(sid, []) != list(references):
                return False
            if schema_type.upper() == "PROTOBUF":  # the same file, as text or serialized
                return self.schemas[sid].strip() == schema.strip() or self._descriptor(self.schemas[sid], sid) == \
                    self._descriptor(schema, None, references)
            return json.dumps(json.loads(self.schemas[sid]), sort_keys=True) == json.dumps(json.loads(schema),
                                                                                         sort_keys=True)
        return next((sid for sid in self.schemas if same(sid)), None)

    def answer(self, sid: int, serialized: bool = False) -> dict:
        """A schema as the REST API answers it (``schemaType`` only when not Avro, as a registry does)."""
        schema_type = self.types.get(sid, "AVRO")
        text = self.schemas[sid]
        if serialized and schema_type == "PROTOBUF":
            text = self.serialized(sid)
        out: dict = {"schema": text}
        if schema_type != "AVRO":
            out["schemaType"] = schema_type
        if self.references.get(sid):
            out["references"] = self.references[sid]
        return out

    def _descriptor(self, text: str, sid: int | None, references=None) -> bytes:
        """A Protobuf schema's ``FileDescriptorProto`` without its file name (how two forms compare)."""
        from airflow_eo.decoding.protobuf_schemas import serialized_file

        found = serialized_file(text) or self._compile(text, self.references.get(sid, []) if sid else references or [],
                                                       f"schema id {sid}" if sid else "the schema registered")
        found.name = ""
        return found.SerializeToString(deterministic=True)

    def serialized(self, sid: int) -> str:
        """The base64 ``FileDescriptorProto`` of Protobuf schema ``sid`` (compiled once if it is text)."""
        from airflow_eo.decoding.protobuf_schemas import serialized_file

        text = self.schemas[sid]
        if serialized_file(text) is not None:
            return text
        if sid not in self._compiled:
            root = self._compile(text, self.references.get(sid, []), f"schema id {sid}")
            root.name = ""  # a registry's serialized form names no file: the reader names it
            self._compiled[sid] = base64.b64encode(root.SerializeToString()).decode()
        return self._compiled[sid]

    def _compile(self, text: str, references, where: str):
        """The ``FileDescriptorProto`` of ``.proto`` text whose imports are ``references`` (their texts)."""
        from google.protobuf import descriptor_pb2

        from airflow_eo.decoding.protobuf_schemas import compile_proto

        imports = {}
        stack = list(references)
        while stack:  # every file it imports, transitively, as .proto text
            ref = stack.pop()
            dep = self.subjects[ref["subject"]][ref["version"] - 1]
            imports[ref["name"]] = self.schemas[dep]
            stack.extend(self.references.get(dep, []))
        compiled = compile_proto(text, "registered.proto", imports, where=where)
        return next(f for f in descriptor_pb2.FileDescriptorSet.FromString(compiled.files).file
                    if f.name == compiled.root)

    @property
    def config(self) -> dict[str, str]:
        """The ``SchemaRegistryClient`` config that reaches it (with its basic auth, if any)."""
        return {"url": self.url, **({"basic.auth.user.info": self.user_info} if self.user_info else {})}

    def __enter__(self) -> "RegistryDouble":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "RegistryDouble":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
