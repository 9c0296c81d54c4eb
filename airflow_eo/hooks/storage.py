"""Table storage credentials from an Airflow ``aws`` connection, as deltalake storage options.

Owns the mapping from the connection's fields to the options deltalake (and
:class:`airflow_eo.table.storage.TableLocation`) take, so the operator, the sensor and the
trigger read a table's credentials the same way.

Example::

    >>> storage_options_of("aws_tables")["conditional_put"]        # doctest: +SKIP
    'etag'
"""

from __future__ import annotations

# Extras of an Airflow ``aws`` connection that map onto deltalake storage options.
_EXTRA_TO_OPTION = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region_name": "AWS_REGION",
    "region": "AWS_REGION",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "session_token": "AWS_SESSION_TOKEN",
}


def storage_options_from_connection(login: str | None, password: str | None,
                                    extra: dict | None = None) -> dict[str, str]:
    """deltalake storage options from the fields of an Airflow ``aws`` connection.

    login/password are the access key id and secret; extras ``endpoint_url``,
    ``region_name`` (or ``region``), ``aws_session_token`` map to their deltalake keys;
    an extra ``storage_options`` dict is passed through as is (``conditional_put``,
    ``allow_http``…). An ``http://`` endpoint turns on ``AWS_ALLOW_HTTP``.

    >>> storage_options_from_connection("AKIA", "s3cr3t", {"endpoint_url": "http://127.0.0.1:9000",
    ...     "region_name": "eu-west-1", "conditional_put": "etag"})["AWS_ALLOW_HTTP"]
    'true'
    """
    extra = dict(extra or {})
    options: dict[str, str] = {}
    if login:
        options["AWS_ACCESS_KEY_ID"] = login
    if password:
        options["AWS_SECRET_ACCESS_KEY"] = password
    for key, option in _EXTRA_TO_OPTION.items():
        if extra.get(key):
            options[option] = str(extra[key])
    if options.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    if extra.get("conditional_put"):
        options["conditional_put"] = str(extra["conditional_put"])
    options.update({k: str(v) for k, v in (extra.get("storage_options") or {}).items()})
    return options


def storage_options_from_airflow(conn_id: str) -> dict[str, str]:
    """Storage options of the Airflow connection ``conn_id`` (type ``aws``)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return storage_options_from_connection(conn.login, conn.password, conn.extra_dejson)


def storage_options_of(conn_id: str | None) -> dict[str, str] | None:
    """The options of ``conn_id``, or None when no connection is named."""
    return storage_options_from_airflow(conn_id) if conn_id else None
