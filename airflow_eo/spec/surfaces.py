"""The surfaces derived from the spec's fields: the command-line flags (``airflow-eo ingest``, the
standalone job), the operator's ``:param:`` lines and README's options table. No I/O.
"""

from __future__ import annotations

import argparse
import inspect
import json
from dataclasses import MISSING
from typing import Any, Callable, Iterable

from airflow_eo.spec.ingest import all_options, default_of, dump_option, required
from airflow_eo.spec.options import Cli, Option


def add_arguments(parser: argparse.ArgumentParser, skip: Iterable[str] = (), require: bool = True) -> None:
    """The options as flags of ``parser`` (``airflow-eo ingest``, the standalone driver). Every flag
    defaults to None (not given: the spec's default applies); ``@file`` where an option takes it."""
    skip = set(skip)
    for opt in all_options():
        if opt.name in skip:
            continue
        default = default_of(opt)
        help_ = opt.help + ("" if default is MISSING or default in (None, (), {}) or default is False
                            else f" (default: {_shown(opt, default)})")
        if opt.from_file:
            help_ += "; or @file"
        kw: dict[str, Any] = {"dest": opt.name, "help": help_.replace("%", "%%"), "default": None}
        if opt.cli is Cli.SWITCH:
            kw.update(action="store_true")
        else:
            kw.update(action="append" if opt.cli is Cli.REPEAT else "store", metavar=opt.metavar,
                      choices=list(opt.choices) or None)
        if require and required(opt):
            kw["required"] = True
        parser.add_argument(opt.flag, **kw)


def options_from_args(args: argparse.Namespace, read_file: Callable[[str], str]) -> dict[str, Any]:
    """The options given on a command line parsed with :func:`add_arguments` (raw values)."""
    given = {}
    for opt in all_options():
        value = getattr(args, opt.name, None)
        if value is None or (opt.cli is Cli.SWITCH and not value):
            continue
        if opt.from_file and isinstance(value, str) and value.startswith("@"):
            value = read_file(value[1:])
        given[opt.name] = value
    return given


def _shown(opt: Option, default: Any) -> str:
    value = dump_option(opt, default)
    return value if isinstance(value, str) else json.dumps(value)


def options_table() -> str:
    """README's options table (Markdown), one row per option, from the fields."""
    rows = ["| option | CLI flag | default | templated | meaning |", "|---|---|---|---|---|"]
    for opt in all_options():
        default = default_of(opt)
        shown = "required" if default is MISSING else ("none" if default in (None, (), {}) else
                                                      f"`{_shown(opt, default)}`")
        flag = opt.flag + (f" {opt.metavar or 'VALUE'}" if opt.cli is not Cli.SWITCH else "")
        flag += " (repeatable)" if opt.cli is Cli.REPEAT else ""
        rows.append(f"| `{opt.name}` | `{flag}` | {shown} | {'yes' if opt.templated else 'no'} | "
                    f"{opt.help.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


def operator_signature(own: inspect.Signature) -> inspect.Signature:
    """An operator's ``__init__`` signature with every option as a keyword of its name (required
    ones without a default, but ``ingest_id``: the operator defaults it), so Airflow's
    ``default_args``, ``partial()`` and ``expand()`` know them as the operator's arguments."""
    params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=inspect.Parameter.empty if required(o) and o.name != "ingest_id" else
                                 dump_option(o, None if required(o) else default_of(o)))
               for o in all_options()]
    return own.replace(parameters=[*params, *options, *[p for p in own.parameters.values() if p.kind is p.VAR_KEYWORD]])


def operator_param_docs() -> str:
    """The operator's ``:param:`` lines for the spec's options."""
    return "".join(f"    :param {opt.name}: {opt.help}{' (templated)' if opt.templated else ''}.\n"
                   for opt in all_options())


if __name__ == "__main__":  # README's options table: python -m airflow_eo.spec.surfaces
    print(options_table(), end="")
