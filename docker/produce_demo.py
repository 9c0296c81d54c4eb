"""Demo data for docker-compose: create the topic and keep producing orders to it.

Runs in the airflow-eo image (confluent-kafka is installed there). Idempotent producer,
keys spread over the topic's partitions; a batch every PERIOD seconds so the hourly
example DAG always finds new records.
"""

import json
import os
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("BOOTSTRAP_SERVERS", "kafka:9092")
TOPIC = os.environ.get("AIRFLOW_EO_TOPIC", "orders")
PARTITIONS = int(os.environ.get("PARTITIONS", "3"))
BATCH = int(os.environ.get("BATCH", "1000"))
PERIOD = float(os.environ.get("PERIOD", "60"))


def ensure_topic() -> None:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    if TOPIC in admin.list_topics(timeout=30).topics:
        return
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result()


def main() -> None:
    ensure_topic()
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    n = 0
    while True:
        for _ in range(BATCH):
            order = {"order_id": n, "amount": round(10 + (n * 7919) % 990 / 10, 2), "ts": time.time()}
            producer.produce(TOPIC, key=str(n).encode(), value=json.dumps(order).encode())
            n += 1
        producer.flush(60)
        print(f"produced {n} orders to {TOPIC}", flush=True)
        time.sleep(PERIOD)


if __name__ == "__main__":
    main()
