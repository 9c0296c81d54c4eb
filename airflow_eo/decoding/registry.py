"""What the Schema Registry holds: writer schemas by id, reader schemas by subject version, and their references.

Speaks the Confluent Schema Registry REST API through confluent-kafka's own
``SchemaRegistryClient`` (basic auth, bearer tokens, TLS and retries as its config keys:
``url``, ``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.*``, ``timeout``, ``max.retries``).
The config may hold credentials: it travels like the Kafka client config (see
:class:`airflow_eo.attempt.Secrets`) and is never logged; messages name the URL without its
user info.

An unreachable registry (or a 5xx) is :class:`SchemaRegistryUnavailableError` (retryable:
nothing is dead-lettered or committed); a schema id the registry does not know is an
answer (``None``) that makes the record a dead letter; a refused login is a ConfigError.
Every schema comes with its ``schemaType`` (``AVRO``, ``PROTOBUF``, ``JSON``) and its references
(other subjects' versions it imports, by the name it imports them as); a Protobuf schema is asked
for in the registry's serialized form (``?format=serialized``: a base64 ``FileDescriptorProto``),
as Confluent's own deserializer asks (:mod:`airflow_eo.decoding.protobuf_schemas` also takes the
``.proto`` text a registry without that form answers).

Example::

    >>> registry = SchemaRegistry({"url": "http://127.0.0.1:8081"})            # doctest: +SKIP
    >>> registry.version("orders-value").version                                # doctest: +SKIP
    3
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from airflow_eo.core.errors import AirflowEoError, ConfigError, SchemaRegistryUnavailableError


@functools.cache
def _transport_errors() -> tuple:
    """The HTTP client's "could not talk to the server" errors: confluent-kafka's registry client
    uses httpx2 when it is installed, httpx otherwise (imported at the first call: the HTTP client
    costs every command ~0.1 s that talks to no registry)."""
    import importlib

    found: list = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


# Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the body (Protobuf: the
# message indexes first)
WIRE_MAGIC = 0
WIRE_HEADER_BYTES = 5
DEFAULT_REGISTRY_SETTINGS = {"timeout": 10, "max.retries": 2}
SERIALIZED = "serialized"  # the registry's compiled form of a Protobuf schema


@dataclass(frozen=True)
class SchemaRef:
    """A reference of a schema: another subject's version, imported as ``name`` (``shop/money.proto``)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class FoundSchema:
    """A schema's text (or a Protobuf schema's serialized form), its ``schemaType`` and its references."""

    text: str
    schema_type: str = "AVRO"
    references: tuple[SchemaRef, ...] = ()

    @classmethod
    def of(cls, schema) -> "FoundSchema":
        """From confluent-kafka's ``Schema`` (a missing type is Avro, as the REST API says)."""
        refs = tuple(SchemaRef(r.name, r.subject, int(r.version)) for r in schema.references or ())
        return cls(schema.schema_str, (schema.schema_type or "AVRO").upper(), refs)


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema of a subject: its text (Avro JSON), id and version; its type and references."""

    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaRef, ...] = ()

    @property
    def found(self) -> FoundSchema:
        return FoundSchema(self.schema, self.schema_type, self.references)


def public_url(url: str) -> str:
    """The registry URL(s) without user info, for messages."""
    def clean(one: str) -> str:
        parts = urlsplit(one.strip())
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))

    return ",".join(clean(u) for u in url.split(","))


class SchemaRegistry:
    """A Schema Registry client that keeps schemas it fetched (one request per id per process)."""

    def __init__(self, config: dict):
        if not config.get("url"):
            raise ConfigError("the Schema Registry config has no 'url': set e.g. http://registry:8081")
        self.config = {**DEFAULT_REGISTRY_SETTINGS, **config}
        self.url = public_url(str(config["url"]))
        self._client = None
        self._by_id: dict[tuple[int, str | None], FoundSchema | None] = {}

    def __getstate__(self):  # pickled into Spark tasks: no live client, no cache
        return {"config": self.config, "url": self.url}

    def __setstate__(self, state):
        self.__init__(state["config"])

    @property
    def client(self):
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            try:
                self._client = SchemaRegistryClient(self.config)
            except Exception as exc:  # unknown key, bad auth settings
                raise ConfigError(f"Schema Registry config for {self.url} is not valid: {exc}") from exc
        return self._client

    def _call(self, what: str, fn):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn()
        except SchemaRegistryError as exc:
            if exc.http_status_code in (401, 403):
                raise ConfigError(f"the Schema Registry at {self.url} refused {what} ({exc.http_status_code}): "
                                  "check the registry connection's credentials") from exc
            if exc.http_status_code == 404:
                return None
            if exc.http_status_code >= 500 or exc.http_status_code < 0:
                raise SchemaRegistryUnavailableError(
                    f"the Schema Registry at {self.url} failed on {what} ({exc.error_message}); nothing was "
                    "committed, the run can be retried") from exc
            raise ConfigError(f"the Schema Registry at {self.url} rejected {what}: {exc.error_message}") from exc
        except AirflowEoError:
            raise
        except _transport_errors() as exc:  # refused, timeout, DNS; a bug of ours is not "unreachable"
            raise SchemaRegistryUnavailableError(
                f"the Schema Registry at {self.url} is not reachable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}); nothing was committed, "
                "the run can be retried") from exc

    def writer_schema(self, schema_id: int) -> str | None:
        """The Avro schema text registered under ``schema_id``, or None when the registry has no such id."""
        found = self.schema(schema_id)
        if found is not None and found.schema_type != "AVRO":
            raise ConfigError(f"schema id {schema_id} at {self.url} is {found.schema_type}, not Avro")
        return None if found is None else found.text

    def schema(self, schema_id: int, fmt: str | None = None) -> FoundSchema | None:
        """The schema registered under ``schema_id`` (``fmt``: the registry's ``format``, e.g.
        :data:`SERIALIZED`), or None when the registry has no such id."""
        key = (schema_id, fmt)
        if key not in self._by_id:
            # the client caches schemas by id whatever the format: ask it once per id, in one format
            found = self._call(f"schema id {schema_id}", lambda: self.client.get_schema(schema_id, fmt=fmt))
            self._by_id[key] = None if found is None else FoundSchema.of(found)
        return self._by_id[key]

    def version(self, subject: str, version: str | int = "latest", fmt: str | None = None) -> RegisteredSchema:
        """The reader schema: ``version`` (a number or ``latest``) of ``subject``."""
        if str(version) == "latest":
            found = self._call(f"the latest version of {subject!r}",
                               lambda: self.client.get_latest_version(subject, fmt=fmt))
        else:
            found = self._call(f"version {version} of {subject!r}",
                               lambda: self.client.get_version(subject, int(version), fmt=fmt))
        if found is None:
            raise ConfigError(f"the Schema Registry at {self.url} has no version {version} of subject {subject!r}: "
                              "register the schema, or set the subject (value_subject) and version")
        schema = FoundSchema.of(found.schema)
        return RegisteredSchema(subject, found.version, found.schema_id, schema.text, schema.schema_type,
                                schema.references)
