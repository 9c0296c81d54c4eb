"""Schema Registry client config from an Airflow connection (type ``http``, or any type).

The connection's host (with its scheme, or the scheme in the *schema* field as the HTTP
provider has it) and port make the URL; login/password are basic auth; extras pass through
as confluent-kafka ``SchemaRegistryClient`` settings (``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``timeout``…), and an extra
``bearer_token`` becomes a static bearer token. The result may hold credentials: it is
registered with the log masker and travels to the Spark job like the Kafka config.

Example::

    # AIRFLOW_CONN_SCHEMA_REGISTRY='{"conn_type": "http", "host": "https://registry.example.com",
    #   "port": 8081, "login": "api-key", "password": "…", "extra": {"ssl.ca.location": "/etc/ca.pem"}}'
    >>> schema_registry_config_of("schema_registry")["url"]            # doctest: +SKIP
    'https://registry.example.com:8081'
"""

from __future__ import annotations

from airflow_eo.core.errors import ConfigError


def schema_registry_config_of(conn_id: str) -> dict:
    """The ``SchemaRegistryClient`` config of the Airflow connection ``conn_id``."""
    from airflow.providers.common.compat.sdk import BaseHook

    from airflow_eo.version_compat import mask_secret

    conn = BaseHook.get_connection(conn_id)
    if not conn.host:
        raise ConfigError(f"Schema Registry connection {conn_id!r} has no host: set e.g. https://registry:8081")
    host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
    config: dict = {"url": f"{host}:{conn.port}" if conn.port else host}
    extra = dict(conn.extra_dejson)
    token = extra.pop("bearer_token", None)
    config.update(extra)
    if conn.login:
        config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
        mask_secret(conn.password or "")
    if token:
        config.update({"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": token})
        mask_secret(token)
    return config
