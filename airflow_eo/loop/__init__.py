"""The loops that tie the steps together: ingest (one table), fan-out (one read, several tables),
reprocess; their planner, runner, plan preview, result and the config they run from.
"""
