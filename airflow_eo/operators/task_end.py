"""What an operator leaves behind when ``execute`` returns: no native client in a garbage cycle.

After ``execute`` Airflow's listeners run in the task process, and the OpenLineage provider,
at its defaults, ``fork``\\ s it once per event. A forked child has only the thread that forked:
a librdkafka client (or a gRPC channel) that is garbage by then but still waiting for the
cyclic collector is destroyed in the child when the child's first collection runs, and its
destructor waits there for threads the child does not have, until the provider kills it
(seen: ``rd_kafka_destroy_app`` under ``Admin_dealloc`` in an expired OpenLineage child; no
COMPLETE event). Collecting at the end of ``execute`` destroys such garbage in the process
whose threads it belongs to.

Example::

    >>> with released_at_end():
    ...     pass
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def released_at_end() -> Iterator[None]:
    """Run a block, then collect garbage cycles (on success and on failure alike)."""
    try:
        yield
    finally:
        gc.collect()
