"""Storage credentials through the Amazon provider's AwsBaseHook (role_arn, profiles, tokens).

STS is AWS: moto's in-process AWS stands in for it at that boundary; the hook, the
connection and the option mapping are the real ones.
"""

from __future__ import annotations

import json

from moto import mock_aws

from airflow_eo.hooks.storage import storage_options_from_airflow, storage_options_of


def aws_connection(monkeypatch, conn_id: str, login=None, password=None, **extra) -> None:
    conn = {"conn_type": "aws", "extra": extra}
    if login:
        conn.update(login=login, password=password)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_static_keys_region_and_commit_options(monkeypatch):
    aws_connection(monkeypatch, "aws_static", "AKIAEXAMPLE", "static-secret", region_name="eu-west-1",
                   endpoint_url="http://127.0.0.1:9000", conditional_put="etag")
    options = storage_options_of("aws_static")
    assert options["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE" and options["AWS_SECRET_ACCESS_KEY"] == "static-secret"
    assert options["AWS_REGION"] == "eu-west-1" and options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["conditional_put"] == "etag"
    assert "AWS_SESSION_TOKEN" not in options
    assert storage_options_of(None) is None


def test_role_arn_is_assumed_and_yields_session_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIABASE")  # the identity that assumes the role
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "base-secret")
    aws_connection(monkeypatch, "aws_role", role_arn="arn:aws:iam::123456789012:role/ingest",
                   region_name="eu-west-1", conditional_put="etag")
    with mock_aws():
        options = storage_options_from_airflow("aws_role")
    assert options["AWS_ACCESS_KEY_ID"].startswith("ASIA") and options["AWS_ACCESS_KEY_ID"] != "AKIABASE"
    assert options["AWS_SESSION_TOKEN"] and options["AWS_SECRET_ACCESS_KEY"] != "base-secret"
    assert options["AWS_REGION"] == "eu-west-1" and options["conditional_put"] == "etag"


def test_a_profile_of_the_shared_credentials_file(monkeypatch, tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text("[tables]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = profile-secret\n"
                           "aws_session_token = profile-token\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    aws_connection(monkeypatch, "aws_profile", profile_name="tables", region_name="us-east-2")
    options = storage_options_from_airflow("aws_profile")
    assert (options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"], options["AWS_SESSION_TOKEN"]) == (
        "AKIAPROFILE", "profile-secret", "profile-token")
    assert options["AWS_REGION"] == "us-east-2"
