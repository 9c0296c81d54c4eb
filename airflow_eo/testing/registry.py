"""A Schema Registry stand-in for tests (a test double, not a registry): the plugin's ``schema_registry``.

No Schema Registry server installs from PyPI, so tests of Avro through a registry run
against this small in-memory server that answers the subset of the Confluent
Schema Registry REST API that airflow-eo and confluent-kafka's ``AvroSerializer`` call:

- ``POST /subjects/{subject}/versions`` — register (the same schema text keeps its id),
- ``GET /schemas/ids/{id}`` — a schema by id,
- ``GET /subjects/{subject}/versions/{version|latest}`` — a version of a subject.

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

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryDouble:
    def __init__(self, user_info: str | None = None):
        self.schemas: dict[int, str] = {}  # id -> schema text
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
                path = self.path.split("?")[0]
                if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                    double.requests["schema_by_id"] += 1
                    if double.failing:
                        return self._send(503, {"error_code": 50301, "message": "Service Unavailable"})
                    text = double.schemas.get(int(m.group(1)))
                    if text is None:
                        return self._send(404, {"error_code": 40403, "message": "Schema not found"})
                    return self._send(200, {"schema": text})
                if m := re.fullmatch(r"/subjects/([^/]+)/versions/(\w+)", path):
                    double.requests["subject_version"] += 1
                    ids = double.subjects.get(m.group(1), [])
                    version = len(ids) if m.group(2) == "latest" else int(m.group(2))
                    if not ids or not 1 <= version <= len(ids):
                        return self._send(404, {"error_code": 40401, "message": "Subject or version not found"})
                    sid = ids[version - 1]
                    return self._send(200, {"subject": m.group(1), "version": version, "id": sid,
                                            "schema": double.schemas[sid]})
                self._send(404, {"error_code": 404, "message": f"not served by the test double: {path}"})

            def do_POST(self):
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                    double.requests["register"] += 1
                    sid = double.register(m.group(1), body["schema"])
                    return self._send(200, {"id": sid})
                self._send(404, {"error_code": 404, "message": f"not served by the test double: {path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (what producers do); returns its id."""
        canonical = json.dumps(json.loads(schema), sort_keys=True)
        with self.lock:
            sid = next((i for i, t in self.schemas.items() if json.dumps(json.loads(t), sort_keys=True) == canonical),
                       None)
            if sid is None:
                sid = len(self.schemas) + 1
                self.schemas[sid] = schema
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid

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
