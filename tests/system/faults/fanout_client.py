"""A fan-out run on a Spark Connect server in a process of its own, for the fault tests to kill.

``python tests/system/faults/fanout_client.py SPEC.json sc://HOST:PORT RUN_KEY``: the fan-out of the
spec file (the operator's argument names, ``sinks`` a list) run with the Kafka config of
``$AIRFLOW_EO_KAFKA_CONFIG``; prints its summary (``FanOutResult.to_dict()``) as one JSON line. The
client is the attempt's driver (it plans, commits and verifies every table), as ``airflow-eo ingest
--remote`` is a single table's; the CLI has no way to run a fan-out yet (``--spec``, issue #39).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from airflow_eo.attempt import Secrets
from airflow_eo.fanout import FanOut
from airflow_eo.offsets import RunIdentity
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.submit.connect import ConnectSubmitter, close_clients


def main(spec_path: str, url: str, run_key: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    with open(spec_path) as f:
        spec = FanOutSpec.of(**json.load(f))
    result = FanOut(spec, Secrets.from_env(), ConnectSubmitter(url)).run(RunIdentity(run_key))
    print(json.dumps(result.to_dict()), flush=True)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
        code = 0
    except Exception as exc:  # noqa: BLE001 - one line, as the CLI reports it
        print(f"fanout_client: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        code = 2
    close_clients()  # as the CLI ends: its pending release calls go out, no interpreter teardown
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)
