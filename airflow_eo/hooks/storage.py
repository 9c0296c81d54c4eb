"""Table storage credentials from an Airflow ``aws`` connection, as deltalake storage options.

Credentials are resolved by the Amazon provider's ``AwsBaseHook`` when it is installed. Owns
the mapping from the connection's fields to the options deltalake (and
:class:`airflow_eo.table.storage.TableLocation`) take, so the operator, the sensor and the
trigger read a table's credentials the same way.

Example::

    >>> storage_options_of("aws_tables")["conditional_put"]        # doctest: +SKIP
    'etag'
"""

from __future__ import annotations

from airflow_eo.core.errors import ConfigError

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
    """Storage options of the Airflow connection ``conn_id`` (type ``aws``).

    With apache-airflow-providers-amazon installed (``airflow-eo[amazon]``), credentials come
    from its ``AwsBaseHook``: ``role_arn`` (assumed role), ``profile_name``, session tokens and
    the default credential chain work as for every other AWS task. Assumed-role credentials
    are resolved once per run and expire (default 1 h): a longer batch needs static or
    instance credentials.
    """
    from airflow.providers.common.compat.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = dict(conn.extra_dejson)
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        needs_provider = sorted(k for k in ("role_arn", "profile_name", "assume_role_method") if k in extra)
        if needs_provider:
            raise ConfigError(
                f"connection {conn_id!r} sets {needs_provider}, which needs the Amazon provider: "
                "pip install 'airflow-eo[amazon]'"
            ) from None
        return storage_options_from_connection(conn.login, conn.password, extra)
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    try:
        credentials = hook.get_credentials()
    except Exception as exc:  # STS or profile lookup failed: the connection is wrong, not the table
        raise ConfigError(f"connection {conn_id!r}: AWS credentials could not be resolved ({exc})") from exc
    extra.update({"endpoint_url": hook.conn_config.endpoint_url or extra.get("endpoint_url"),
                  "region_name": hook.conn_region_name or extra.get("region_name") or extra.get("region"),
                  "aws_session_token": getattr(credentials, "token", None)})
    return storage_options_from_connection(getattr(credentials, "access_key", None),
                                           getattr(credentials, "secret_key", None), extra)


def storage_options_of(conn_id: str | None, overrides: dict[str, str] | None = None) -> dict[str, str] | None:
    """The options of ``conn_id`` updated with ``overrides`` (options set in code), or None when
    there are none."""
    options = {**(storage_options_from_airflow(conn_id) if conn_id else {}), **(overrides or {})}
    return options or None
