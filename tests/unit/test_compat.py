"""airflow_eo.compat: each private third-party API it leans on still looks as it did when checked.

No broker and no Spark session: the private attributes, signatures and sources are inspected,
and each function runs against stand-ins of the objects it touches. A failure names the
installed version: an upgrade changed what a compat function relies on, so review that function
(its docstring says what it leans on) before changing the pin in VERIFIED.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import types
from importlib.metadata import version

import pytest

from airflow_eo import compat

# The versions compat.py was checked against (the constraints-3.X.txt files pin these: Python 3.10
# gets the Kafka provider 2.0.0, the last release for 3.10; 3.11-3.13 get 2.1.0).
VERIFIED = {"pyspark": {"4.1.1"}, "apache-airflow-providers-apache-kafka": {"2.0.0", "2.1.0"}}


def installed(dist: str) -> str:
    return f"{dist} {version(dist)} (compat.py checked against {', '.join(sorted(VERIFIED[dist]))})"


@pytest.mark.parametrize("dist", sorted(VERIFIED))
def test_the_checked_versions_are_installed(dist):
    assert version(dist) in VERIFIED[dist], (
        f"{installed(dist)}: review each function of airflow_eo/compat.py that leans on {dist} "
        "against the new version, run this file, then update VERIFIED")


# --- apache-airflow-providers-apache-kafka ----------------------------------------------------


def test_kafka_build_config_is_a_method_without_arguments():
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    kafka = installed("apache-airflow-providers-apache-kafka")
    assert callable(getattr(KafkaBaseHook, "_build_config", None)), f"{kafka}: KafkaBaseHook._build_config is gone"
    assert list(inspect.signature(KafkaBaseHook._build_config).parameters) == ["self"], (
        f"{kafka}: KafkaBaseHook._build_config's signature changed")


def test_msk_iam_callback_is_a_partial_of_the_named_function_with_the_region_first(monkeypatch):
    from airflow.providers.apache.kafka.hooks import base
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    kafka = installed("apache-airflow-providers-apache-kafka")
    assert getattr(base, compat.MSK_IAM_CALLBACK_NAME, None) is not None, (
        f"{kafka}: {compat.MSK_IAM_CALLBACK_NAME} is gone from {base.__name__}")
    signer = types.ModuleType("aws_msk_iam_sasl_signer")  # the AWS SDK, imported by the provider
    signer.MSKAuthTokenProvider = object
    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", signer)
    monkeypatch.setenv("AIRFLOW_CONN_COMPAT_MSK", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098",
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}}))
    config = compat.kafka_hook_config(KafkaBaseHook(kafka_config_id="compat_msk"))
    callback = config.get("oauth_cb")
    assert isinstance(callback, functools.partial), f"{kafka}: MSK IAM's oauth_cb is no longer a functools.partial"
    assert callback.func.__name__ == compat.MSK_IAM_CALLBACK_NAME and callback.args == ("eu-west-1",), (
        f"{kafka}: MSK IAM's oauth_cb is {callback.func.__name__}{callback.args}")
    assert compat.msk_iam_region(callback) == "eu-west-1"


def test_other_callbacks_have_no_msk_region():
    assert compat.msk_iam_region(print) is None
    assert compat.msk_iam_region(functools.partial(print, "eu-west-1")) is None


# --- pyspark: Spark <-> Arrow types --------------------------------------------------------


def test_the_arrow_conversions_keep_their_defaults():
    from pyspark.sql.pandas import types

    spark = installed("pyspark")
    for name in ("to_arrow_schema", "to_arrow_type"):
        params = inspect.signature(getattr(types, name)).parameters
        assert params["timestamp_utc"].default is True and params["prefers_large_types"].default is False, (
            f"{spark}: pyspark.sql.pandas.types.{name} defaults changed: {dict(params)}")
    assert "arrow_schema" in inspect.signature(types.from_arrow_schema).parameters, f"{spark}: from_arrow_schema"


def test_the_kafka_schema_round_trips_between_spark_and_arrow():
    from airflow_eo.driver.reader import KAFKA_SCHEMA

    spark = installed("pyspark")
    struct = compat.spark_schema_of(KAFKA_SCHEMA)
    assert struct.simpleString() == (
        "struct<topic:string,partition:int,offset:bigint,timestamp:timestamp,timestampType:int,key:binary,"
        "value:binary,headers:array<struct<key:string,value:binary>>>"), f"{spark}: {struct.simpleString()}"
    back = compat.arrow_schema_of(struct)
    assert back.equals(KAFKA_SCHEMA), f"{spark}: Spark's Arrow schema of the Kafka columns is now {back}"
    assert compat.arrow_type_of(struct["timestamp"].dataType) == KAFKA_SCHEMA.field("timestamp").type


# --- pyspark: classic Observation -----------------------------------------------------------


def test_a_classic_observation_holds_its_jvm_observation_in_jo():
    from pyspark.sql.observation import Observation

    spark = installed("pyspark")
    with compat.connect_mode(False):
        observation = Observation("compat")
    assert hasattr(observation, "_jo") and observation._jo is None, f"{spark}: Observation has no _jo before use"
    assert "self._jo = " in inspect.getsource(Observation._on), f"{spark}: Observation._on no longer sets _jo"
    assert "self._jo.getRow()" in inspect.getsource(Observation.get.fget), (
        f"{spark}: Observation.get no longer reads _jo (whose future() says whether it would block)")
    assert not compat.observation_pending(observation)


def test_observation_pending_asks_the_jvm_future():
    def attached(done: bool):
        future = types.SimpleNamespace(isCompleted=lambda: done)
        return types.SimpleNamespace(_jo=types.SimpleNamespace(future=lambda: future))

    assert compat.observation_pending(attached(False))
    assert compat.observation_pending(attached(False), wait_seconds=0.05)
    assert not compat.observation_pending(attached(True))
    answers = iter([False, False, True])  # the metrics arrive while it waits
    future = types.SimpleNamespace(isCompleted=lambda: next(answers))
    assert not compat.observation_pending(types.SimpleNamespace(_jo=types.SimpleNamespace(future=lambda: future)),
                                          wait_seconds=5)
    assert not compat.observation_pending(types.SimpleNamespace())  # Spark Connect's: no _jo


# --- pyspark: the Spark Connect client ------------------------------------------------------


def test_connect_session_closes_its_client_again_at_garbage_collection():
    from pyspark.sql.connect.client.core import SparkConnectClient
    from pyspark.sql.connect.session import SparkSession

    spark = installed("pyspark")
    assert isinstance(inspect.getattr_static(SparkSession, "client"), property), f"{spark}: SparkSession.client"
    assert "self.client.close()" in inspect.getsource(SparkSession.__del__), (
        f"{spark}: Connect's SparkSession.__del__ no longer closes the client (close_client_once may be moot)")
    assert list(inspect.signature(SparkConnectClient.close).parameters) == ["self"], f"{spark}: client.close()"


def test_close_client_once_closes_then_disarms():
    closed: list[bool] = []
    spark = types.SimpleNamespace(client=types.SimpleNamespace(close=lambda: closed.append(True)))
    compat.close_client_once(spark)
    spark.client.close()  # what __del__ does
    assert closed == [True]


def test_client_closed_and_release_session_are_there():
    from pyspark.sql.connect.client.core import SparkConnectClient
    from pyspark.sql.connect.session import SparkSession

    spark = installed("pyspark")
    stopped = inspect.getattr_static(SparkSession, "is_stopped", None)
    assert isinstance(stopped, property) and "client.is_closed" in inspect.getsource(stopped.fget), (
        f"{spark}: Connect's SparkSession.is_stopped no longer reports the client's is_closed")
    assert isinstance(inspect.getattr_static(SparkConnectClient, "is_closed"), property), f"{spark}: is_closed"
    assert list(inspect.signature(SparkConnectClient.release_session).parameters) == ["self"], (
        f"{spark}: SparkConnectClient.release_session() changed")


def test_client_retry_policies_take_a_default_policy_with_our_keywords():
    from pyspark.sql.connect.client.core import SparkConnectClient
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark = installed("pyspark")
    assert list(inspect.signature(SparkConnectClient.set_retry_policies).parameters) == ["self", "policies"], (
        f"{spark}: SparkConnectClient.set_retry_policies changed")
    keywords = set(inspect.signature(DefaultPolicy).parameters)
    assert {"max_retries", "initial_backoff", "backoff_multiplier", "max_backoff"} <= keywords, (
        f"{spark}: DefaultPolicy takes {sorted(keywords)}")
    policies: list = []
    session = types.SimpleNamespace(client=types.SimpleNamespace(set_retry_policies=policies.extend))
    compat.limit_client_retries(session, max_retries=4, initial_backoff_ms=200, backoff_multiplier=2.0,
                                max_backoff_ms=2000)
    (policy,) = policies
    assert (policy.max_retries, policy.initial_backoff, policy.backoff_multiplier, policy.max_backoff) == (
        4, 200, 2.0, 2000), f"{spark}: DefaultPolicy keeps its settings elsewhere"


# --- pyspark: the process-wide Spark Connect mark -------------------------------------------


def test_the_connect_mark_is_what_pyspark_reads(monkeypatch):
    from pyspark.sql.utils import is_remote

    spark = installed("pyspark")
    monkeypatch.delenv(compat.CONNECT_MODE_MARK, raising=False)
    assert compat.CONNECT_MODE_MARK in inspect.getsource(is_remote), (
        f"{spark}: is_remote() no longer reads {compat.CONNECT_MODE_MARK}")
    with compat.connect_mode(True):
        assert is_remote(), f"{spark}: is_remote() ignores {compat.CONNECT_MODE_MARK}"
        with compat.connect_mode(False):
            assert not is_remote(), f"{spark}: is_remote() is true without {compat.CONNECT_MODE_MARK}"
        assert os.environ[compat.CONNECT_MODE_MARK] == "1"  # restored
    assert compat.CONNECT_MODE_MARK not in os.environ


def test_forget_connect_mode_drops_what_a_connect_parent_passed_on(monkeypatch):
    for name in (compat.CONNECT_MODE_MARK, "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        monkeypatch.setenv(name, "1")
    compat.forget_connect_mode()
    assert not {compat.CONNECT_MODE_MARK, "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"} & set(os.environ)


# --- pyspark: a flag on a session object ----------------------------------------------------


def test_sessions_take_attributes_of_ours():
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.session import SparkSession

    spark = installed("pyspark")
    for cls in (SparkSession, ConnectSession):
        assert cls.__dictoffset__ != 0, f"{spark}: {cls.__module__}.{cls.__name__} instances take no attributes"


def test_a_session_flag_belongs_to_one_object():
    a, b = types.SimpleNamespace(), types.SimpleNamespace()
    assert not compat.session_flagged(a, "_flag")
    compat.flag_session(a, "_flag")
    assert compat.session_flagged(a, "_flag") and not compat.session_flagged(b, "_flag")
