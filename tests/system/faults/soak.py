"""The fault soak: kill the Spark job at least ``--kills`` times while data flows, then count.

Run::

    python -m tests.system.faults.soak --kills 50

Each trial retries one run key, killing its Spark job once per window (reading, after
staging, during the commit, a random moment, after the commit) and then once more
unharmed; every few trials the broker is restarted while a run is in flight. After
every run the table is checked against the broker; at the end the producer stops, one
last run drains the topic, and the table is printed: trials, kills per window, records
produced, records in the table, lost, duplicated. Exit code 1 if anything was lost,
doubled, or an aborted record reached the table.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from airflow_eo.demo.broker import EmbeddedBroker  # noqa: E402
from tests.system.faults.harness import (  # noqa: E402
    WINDOWS, FlowingProducer, Tally, check_table, ingest_config, kill_chain, run_once,
)
from tests.helpers import new_topic  # noqa: E402

PARTITIONS = 3
INGEST_ID = "soak"


def restart_broker_during_run(broker: EmbeddedBroker, config, run_key: str, delay: float) -> None:
    """One unharmed run with the broker restarted ``delay`` seconds into it."""
    timer = threading.Timer(delay, broker.restart)
    timer.start()
    run_once(config, run_key, None, random.Random())
    timer.join()


def soak(kills: int, seed: int, restart_every: int, out=sys.stdout) -> int:
    rng = random.Random(seed)
    tally = Tally()
    restarts = idle = 0
    started = time.monotonic()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="airflow-eo-soak-") as tmp:
        topic = new_topic(broker.config, PARTITIONS)
        table = os.path.join(tmp, "table")
        config = ingest_config(table, INGEST_ID, topic, broker.bootstrap_servers)
        with FlowingProducer(broker.config, topic, PARTITIONS) as producer:
            def checker():
                return check_table(table, INGEST_ID, topic, PARTITIONS, broker.bootstrap_servers, producer.aborted)

            while tally.total_kills < kills:
                if not producer.alive:
                    raise RuntimeError("the producer thread died: no new data, no kills; see the log")
                middle = [w for w in WINDOWS if w != "after_commit"]
                rng.shuffle(middle)
                before = tally.total_kills
                kill_chain(config, f"soak-{tally.trials + 1}", [*middle, "after_commit"], rng, tally, checker)
                idle = 0 if tally.total_kills > before else idle + 1
                if idle >= 3:  # nothing new to read (stuck producer or LSO): no kill can happen
                    raise RuntimeError("three trials in a row without a kill: is data still flowing?")
                if restart_every and tally.trials % restart_every == 0:
                    restart_broker_during_run(broker, config, f"soak-restart-{restarts}", rng.uniform(3, 20))
                    restarts += 1
                    check = checker()
                    if not check.ok:
                        tally.failures.append(("broker-restart", None, check.summary()))
                print(f"[{time.monotonic() - started:6.0f}s] trials={tally.trials} kills={dict(tally.kills)}",
                      file=out, flush=True)
            producer.stop()
            drain = run_once(config, "soak-drain", None, rng)
            final = checker()
        produced = final.visible
        print_table(out, tally, restarts, produced, final, time.monotonic() - started, drain.error)
    return 0 if final.ok and not tally.failures and final.expected == produced else 1


def print_table(out, tally: Tally, restarts: int, produced: int, final, seconds: float, drain_error) -> None:
    rows = [("trials (run keys)", tally.trials), ("spark runs", tally.runs), ("broker restarts", restarts)]
    rows += [(f"kills: {w}", tally.kills[w]) for w in WINDOWS]
    rows += [("kills: total", tally.total_kills),
             ("records produced (committed in Kafka)", produced),
             ("records in table", final.in_table),
             ("not ingested after the drain run", produced - final.expected),
             ("lost", len(final.lost)),
             ("duplicated", sum(n - 1 for n in final.duplicated.values())),
             ("aborted records in table", len(final.aborted_in_table)),
             ("failed checks after a run", len(tally.failures)),
             ("wall time (s)", round(seconds))]
    width = max(len(k) for k, _ in rows)
    print("\n| " + "metric".ljust(width) + " | value |", file=out)
    print("|" + "-" * (width + 2) + "|-------|", file=out)
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |", file=out)
    if drain_error or tally.failures:
        print(f"\ndrain error: {drain_error}\nfailures: {tally.failures}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.faults.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="stop after at least this many kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--restart-every", type=int, default=3, help="restart the broker every N trials (0: never)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    logging.getLogger("tests.system.faults.harness").setLevel(logging.INFO)
    return soak(args.kills, args.seed, args.restart_every)


if __name__ == "__main__":
    sys.exit(main())
