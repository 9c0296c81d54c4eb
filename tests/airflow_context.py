"""What a task's ``execute`` gets from Airflow, without Airflow's database: the context of one run
and the outlet event accessors (they record the Asset events the task adds through its alias)."""

from __future__ import annotations

from types import SimpleNamespace


class OutletEvents:
    """Airflow's outlet event accessors, recording what ``add`` emits through an alias. Keyed by the
    alias's name, as Airflow's own accessors are: Airflow 3.0's ``AssetAlias`` is not hashable."""

    def __init__(self):
        self.by_name: dict[str, SimpleNamespace] = {}

    def __getitem__(self, alias):
        if alias.name not in self.by_name:
            emitted: list = []
            self.by_name[alias.name] = SimpleNamespace(extra=None, emitted=emitted,
                                                       add=lambda asset, extra=None: emitted.append((asset, extra)))
        return self.by_name[alias.name]


def context_for(op, run_id, try_number=1, params=None, **more):
    ti = SimpleNamespace(dag_id=op.dag_id, run_id=run_id, task_id=op.task_id, map_index=-1, try_number=try_number)
    return {"ti": ti, "params": params or {}, "outlet_events": OutletEvents(), **more}
