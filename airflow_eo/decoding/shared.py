"""What the column decoders share: records into one Arrow column (a record that does not fit: a dead letter), and a per-process cache.

Example::

    >>> import pyarrow as pa
    >>> reasons = [None, None]
    >>> fitted_array([1, 2**70], reasons, pa.int64(), "Avro").to_pylist(), reasons[1][:40]
    ([1, None], 'decoded Avro record does not fit its col')
"""

from __future__ import annotations

from dataclasses import fields


def fitted_array(records: list, reasons: list, arrow_type, format_name: str):
    """One conversion per batch; a record that does not fit its column (an out-of-range decimal, a date
    beyond Arrow's) is found record by record, becomes null and gets its reason in ``reasons``."""
    import pyarrow as pa

    try:
        return pa.array(records, type=arrow_type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        fitted = []
        for i, record in enumerate(records):
            try:
                pa.array([record], type=arrow_type)
                fitted.append(record)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                fitted.append(None)
                if reasons[i] is None:
                    reasons[i] = f"decoded {format_name} record does not fit its column type: {str(exc)[:200]}"
        return pa.array(fitted, type=arrow_type)


class TaskCache:
    """A frozen dataclass decoder with a ``_cache`` field (parsed schemas, validators, builders) that a
    pickle leaves behind: each Spark task's process builds its own, once."""

    def __getstate__(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_cache"}  # type: ignore[arg-type]

    def __setstate__(self, state):
        for key, value in state.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_cache", {})
