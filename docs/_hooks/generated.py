"""MkDocs hook and Griffe extension: the parts of the site generated from the code at build time.

- ``<!-- cli-reference -->`` in a page becomes the help of every ``airflow-eo`` subcommand and of
  the standalone spark-submit job, rendered by their own argparse parsers, so the page cannot
  drift from the flags. (The options table is checked by a test instead,
  tests/unit/test_spec_surfaces.py, so it stays readable in the Markdown source.)
- :class:`RuntimeDocstrings` gives the API reference the operator's docstring and signature as
  the class has them at run time: ``KafkaToDeltaOperator`` gets one keyword argument and one
  ``:param:`` per option of the spec when its module loads, which a static read misses.
  (Inspecting the whole package instead imports every module, Spark included: ~3× slower.)
- Placeholders such as ``<first topic>`` outside code are escaped, or Markdown would take them
  for HTML tags and drop them.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re

import griffe

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # argparse wraps at $COLUMNS: a fixed width makes the page the same on every machine
RUNTIME = {"airflow_eo.operators.kafka_to_delta.KafkaToDeltaOperator"}
_CODE = re.compile(r"(`+).+?\1")
_PLACEHOLDER = re.compile(r"<(?=[a-z][\w ,…-]*>)")


def escape_placeholders(text: str) -> str:
    """``<word …>`` outside code spans and fenced blocks → ``&lt;word …>``."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and "<!--" not in line:
            parts, last = [], 0
            for m in _CODE.finditer(line):
                parts += [_PLACEHOLDER.sub("&lt;", line[last:m.start()]), m.group(0)]
                last = m.end()
            line = "".join(parts) + _PLACEHOLDER.sub("&lt;", line[last:])
        out.append(line)
    return "\n".join(out)


def _help(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    from airflow_eo import cli
    from airflow_eo.driver.main import job_parser

    top = cli.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parts = [f"```text\n{_help(top)}```\n"]
    for name, parser in sub.choices.items():
        parts.append(f"## `airflow-eo {name}`\n\n```text\n{_help(parser)}```\n")
    parts.append("## `spark_jobs/kafka_to_delta.py` (standalone spark-submit job)\n\n"
                 f"```text\n{_help(job_parser())}```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return escape_placeholders(markdown)


class RuntimeDocstrings(griffe.Extension):
    def on_class_members(self, *, cls: griffe.Class, **kwargs) -> None:
        if cls.path not in RUNTIME or cls.docstring is None:
            return
        module, _, name = cls.path.rpartition(".")
        runtime = getattr(importlib.import_module(module), name)
        # dedented as griffe reads a docstring
        cls.docstring.value = escape_placeholders(griffe.Docstring(runtime.__doc__).value)
        init = cls.members["__init__"]
        static = {p.name for p in init.parameters}
        added = [griffe.Parameter(p.name, kind=griffe.ParameterKind.keyword_only,
                                  default=None if p.default is p.empty else repr(p.default))
                 for p in inspect.signature(runtime.__init__).parameters.values() if p.name not in static]
        params = list(init.parameters)
        at = next((i for i, p in enumerate(params) if p.kind is griffe.ParameterKind.var_keyword), len(params))
        init.parameters = griffe.Parameters(*params[:at], *added, *params[at:])

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_placeholders(obj.docstring.value)
