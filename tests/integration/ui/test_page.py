"""The "Exactly-once tables" page through Airflow's own API app (``create_app``, the plugin loaded
from the package's entry point) and FastAPI's test client, on a real SQLite metadata DB filled by
real ``dag.test()`` ingest runs: the embedded broker, spark-submit, real Delta tables.

Two DAGs: ``eo_ui_offsets`` (offsets mode, two runs) and ``eo_ui_interval`` (interval mode, hours
0 and 2 of a day: hour 1 is a gap). Tokens are Airflow's own JWTs for SimpleAuthManager users;
which DAGs a user may read is the auth manager's answer, stubbed at that boundary (the simple
auth manager has no per-DAG rules).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eo.core.offsets import TopicPartition
from airflow_eo.table.ledger import Ledger
from tests.conftest import SPARK_CONF
from tests.helpers import new_topic, produce
from tests.html_pages import SVG, check_page, svgs
from tests.integration.airflow.dagtest import run_dag, xcom
from tests.integration.test_interval_mode import H, hour_base, produce_at

SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"
OFFSETS_DAG, INTERVAL_DAG = "eo_ui_offsets", "eo_ui_interval"


def offsets_dag(topic: str, table: str):
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG(OFFSETS_DAG, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="ui_orders",
                             transform_sql=SQL, spark_conf=SPARK_CONF)
    return dag


def interval_dag(topic: str, table: str):
    from airflow.sdk import DAG
    from airflow.timetables.interval import DeltaDataIntervalTimetable

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG(INTERVAL_DAG, schedule=DeltaDataIntervalTimetable(timedelta(hours=1)), start_date=datetime(2026, 1, 1),
             catchup=False) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="ui_hourly",
                             mode="interval", transform_sql=SQL, spark_conf=SPARK_CONF)
    return dag


@pytest.fixture(scope="module")
def world(airflow_db, airflow_connections, kafka_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    tables = {"offsets": str(root / "orders"), "interval": str(root / "hourly")}
    runs: dict[str, list[tuple[str, dict]]] = {"offsets": [], "interval": []}

    topic = new_topic(kafka_config, 2)
    dag = offsets_dag(topic, tables["offsets"])
    for count, start in ((30, 0), (12, 30)):
        produce(kafka_config, topic, count, partitions=2, start=start)
        dr, states = run_dag(dag, logical_date=None)
        assert states["ingest"][0] == "success", states
        runs["offsets"].append((dr.run_id, xcom(OFFSETS_DAG, dr.run_id, "ingest")))

    hourly, base = new_topic(kafka_config, 1), hour_base()
    produce_at(kafka_config, hourly, [(0, base + h * H + 60_000 * k) for h in range(3) for k in range(1, 4)]
               + [(0, base + 3 * H + 1)])  # three records an hour, then one that closes hour 2
    dag = interval_dag(hourly, tables["interval"])
    for hour in (0, 2):  # a run at X owns [X - 1h, X): hour 1 is never run
        when = datetime.fromtimestamp((base + (hour + 1) * H) / 1000, tz=timezone.utc)
        dr, states = run_dag(dag, logical_date=when, run_after=when)
        assert states["ingest"][0] == "success", states
        runs["interval"].append((dr.run_id, xcom(INTERVAL_DAG, dr.run_id, "ingest")))

    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    auth = get_auth_manager()
    tokens = {name: auth.generate_jwt(SimpleAuthManagerUser(username=name, role=role))
              for name, role in (("admin", "ADMIN"), ("alice", "VIEWER"))}
    return {"client": client, "auth": auth, "tokens": tokens, "tables": tables, "runs": runs, "base": base}


def get(world, path: str, user: str | None = "admin"):
    headers = {"Authorization": f"Bearer {world['tokens'][user]}"} if user else {}
    return world["client"].get(f"/airflow-eo/{path}", headers=headers)


def plain(html: str) -> str:
    """The page without what it sets into long names so they wrap well: <wbr>, a path's segments."""
    return re.sub(r'<span class="seg">([^<]*)</span>', r"\1", html).replace("<wbr>", "")


def asset_link(html: str, table: str) -> str:
    """The relative link of ``table``'s row in the list."""
    row = next(r for r in plain(html).split("<tr>") if f">{table}</a>" in r)
    return re.search(r'href="(table\?[^"]+)"', row).group(1).replace("&amp;", "&")


def test_the_list_shows_each_table_with_its_last_run_lag_and_counts(world):
    r = get(world, "")
    assert r.status_code == 200, r.text
    page = check_page(r.text)
    html = plain(r.text)
    offsets_run, offsets_summary = world["runs"]["offsets"][-1]
    for table, ingest, mode in ((world["tables"]["offsets"], "ui_orders", "offsets · append"),
                                (world["tables"]["interval"], "ui_hourly", "interval · append")):
        row = next(r for r in html.split("<tr>") if f">{table}</a>" in r)
        assert f"<code>{ingest}</code>" in row and mode in row
        assert "success" in row and "committed" in row
    offsets_row = next(r for r in html.split("<tr>") if f">{world['tables']['offsets']}</a>" in r)
    assert f"version {offsets_summary['version']}, batch 2" in offsets_row
    assert f'>{sum(offsets_summary["lag"].values()):,}</td>' in offsets_row  # the last run's lag
    assert '<td data-label="Rows (24 h)" class="num">42</td>' in offsets_row  # 30 + 12 rows today
    assert f"../dags/{OFFSETS_DAG}/runs/{offsets_run.replace(':', '%3A').replace('+', '%2B')}/tasks/ingest" in page.urls
    assert f"../dags/{INTERVAL_DAG}" in page.urls


def test_a_tables_page_has_its_batches_lag_and_committed_offsets(world):
    listed = get(world, "").text
    r = get(world, asset_link(listed, world["tables"]["offsets"]))
    assert r.status_code == 200, r.text
    check_page(r.text)
    (first_run, first), (second_run, second) = world["runs"]["offsets"]
    batches = plain(r.text).split("<h2>Recent batches</h2>")[1].split("<h2>")[0]
    rows = re.findall(r'<tr>\n<td data-label="Batch" class="num">(\d+)<div class="sub">v(\d+)</div></td>', batches)
    assert rows == [("2", str(second["version"])), ("1", str(first["version"]))]  # newest first
    assert f">{second_run}</a>" in batches and f">{first_run}</a>" in batches
    assert '<td data-label="Rows" class="num">12<' in batches and '<td data-label="Rows" class="num">30<' in batches
    rows_chart, lag_chart = svgs(r.text)[:2]
    assert len(list(rows_chart.iter(f"{SVG}rect"))) == 2 and len(list(lag_chart.iter(f"{SVG}circle"))) == 2
    ledger = Ledger.open(world["tables"]["offsets"])
    partitions = [TopicPartition(x["topic"], x["partition"]) for x in second["ranges"]]
    for tp, offset in ledger.committed_offsets("ui_orders", partitions).items():
        assert (f'<td data-label="Topic">{tp.topic}</td><td data-label="Partition" class="num">{tp.partition}</td>'
                f'<td data-label="Next offset" class="num">{offset:,}</td>') in r.text


def test_an_interval_tables_page_shows_committed_gap_and_not_closed(world):
    listed = get(world, "").text
    r = get(world, asset_link(listed, world["tables"]["interval"]))
    assert r.status_code == 200, r.text
    check_page(r.text)
    strip = next(s for s in svgs(r.text) if "intervals" in (s.get("aria-label") or ""))
    assert [x.get("class") for x in strip.iter(f"{SVG}rect")] == ["committed", "gap", "committed", "not-closed"]
    base = world["base"]
    hour = datetime.fromtimestamp((base + H) / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
    assert re.search(rf'<tr class="span-gap"><td data-label="Interval \(UTC\)">{hour} – ', r.text)  # a backfill fills it


def test_each_tables_log_is_read_once_per_view(world, monkeypatch):
    opened: list[str] = []
    real = Ledger.open.__func__

    def spy(cls, uri, storage_options=None):
        opened.append(uri)
        return real(cls, uri, storage_options)

    monkeypatch.setattr(Ledger, "open", classmethod(spy))
    assert get(world, "").status_code == 200
    # The metadata DB is shared with the other Airflow tests of a session, whose tables are listed too.
    assert len(opened) == len(set(opened)) and set(world["tables"].values()) <= set(opened)
    opened.clear()
    listed = get(world, "").text
    opened.clear()
    assert get(world, asset_link(listed, world["tables"]["interval"])).status_code == 200
    assert opened == [world["tables"]["interval"]]


def test_without_a_token_it_is_refused(world):
    for path in ("", "table?asset=1&ingest=ui_orders"):
        r = get(world, path, user=None)
        assert r.status_code == 401 and world["tables"]["offsets"] not in plain(r.text)
        assert 'href="./../api/v2/auth/login?next=%2Fplugin%2Fexactly-once-tables" target="_top"' in r.text
    r = world["client"].get("/airflow-eo/", headers={"Authorization": "Bearer not-a-jwt"})
    assert r.status_code == 403


def test_airflows_api_server_sends_the_bare_prefix_to_the_list_and_bad_links_to_the_pages_error_page(world):
    """Through Airflow's own app: the plugin's root middleware answers /airflow-eo (else the UI's 404),
    and a table link with a missing or malformed parameter gets the page's error page, not JSON."""
    client, headers = world["client"], {"Authorization": f"Bearer {world['tokens']['admin']}"}
    r = client.get("/airflow-eo", headers=headers, follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "airflow-eo/"
    followed = client.get("/airflow-eo", headers=headers)
    assert followed.status_code == 200 and "Exactly-once tables" in followed.text
    assert world["tables"]["offsets"] in plain(followed.text)
    for query in ("", "?asset=1", "?asset=first&ingest=ui_orders"):
        bad = get(world, "table" + query)
        assert bad.status_code == 400 and bad.headers["content-type"].startswith("text/html"), bad.text
        check_page(bad.text)
        assert '<a href="./">Back to the table list</a>' in bad.text


def test_a_user_without_a_dag_does_not_see_its_tables(world, monkeypatch):
    auth, real = world["auth"], world["auth"].get_authorized_dag_ids

    def readable(*, user, method="GET", session=None):  # alice may read the offsets DAG only
        found = real(user=user, method=method, session=session)
        return found & {OFFSETS_DAG} if user.get_name() == "alice" else found

    monkeypatch.setattr(auth, "get_authorized_dag_ids", readable)
    admin_list = get(world, "").text
    r = get(world, "", user="alice")
    assert r.status_code == 200
    assert world["tables"]["offsets"] in plain(r.text)
    assert world["tables"]["interval"] not in plain(r.text) and INTERVAL_DAG not in plain(r.text)
    assert get(world, asset_link(admin_list, world["tables"]["offsets"]), user="alice").status_code == 200
    refused = get(world, asset_link(admin_list, world["tables"]["interval"]), user="alice")
    assert refused.status_code == 403 and world["tables"]["interval"] not in plain(refused.text)
