"""Directives that render the reference pages from the code: settings, magics, variables, formats, endpoints.

Each directive writes reStructuredText and parses it in place, so pages use them inside ``{eval-rst}`` blocks.
A gap in the code that the reference would hide (a setting without help, a verb without a parser) is a warning,
which the build (``-W``) turns into an error.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from pydantic import TypeAdapter
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

log = logging.getLogger(__name__)


def esc(text: object) -> str:
    """Plain text as reStructuredText: markup characters escaped, on one line."""
    return re.sub(r"([\\`*_|<>\[\]])", r"\\\1", " ".join(str(text).split()))


def doc(text: str) -> str:
    """A docstring (written in reStructuredText) on one line."""
    return " ".join(text.split())


def code(text: object) -> str:
    """Inline literal text (no escaping inside literals)."""
    text = " ".join(str(text).split())
    return f":literal:`{text.replace('`', '')}`" if text else ""


def table(header: Sequence[str], rows: Iterable[Sequence[str]], widths: str = "auto") -> list[str]:
    """A list-table of already-marked-up cells."""
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [list(header), *rows]:
        lines += [f"   * - {row[0]}", *(f"     - {cell}" for cell in row[1:])]
    return lines + [""]


def load(dotted: str) -> Any:
    """``package.module.Name`` (or ``package.module:Name``) imported."""
    module, _, name = dotted.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


Section = tuple[str, str, list[str]]  # label (a reference target), title, body in reStructuredText


class _Rst(SphinxDirective):
    """A directive whose output is reStructuredText it builds: plain ``lines()``, or one section per item of
    ``sections()``, each a reference target (``{ref}`label```) of its own."""

    required_arguments = 0
    optional_arguments = 1

    def lines(self) -> list[str]:
        return []

    def sections(self) -> list[Section]:
        return []

    def parse(self, lines: list[str], into: nodes.Element) -> nodes.Element:
        nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]), into)
        return into

    def run(self) -> list[nodes.Node]:
        out = list(self.parse(self.lines(), nodes.container()).children)
        for label, title, body in self.sections():
            # top-level nodes' names become labels (MyST's eval-rst registers those of its top level only)
            section = nodes.section(ids=[nodes.make_id(label)], names=[label])
            out.append(self.parse(body, section))
            section.insert(0, nodes.title(title, title))
        return out

    def warn(self, message: str) -> None:
        log.warning(message, location=self.get_location())


class Settings(_Rst):
    """Every configurable trait a class defines itself, through autodoc-traits; a trait without help warns."""

    required_arguments = 1

    def lines(self) -> list[str]:
        cls = load(self.arguments[0])
        out: list[str] = []
        for name, trait in sorted(cls.class_own_traits(config=True).items()):
            if not trait.help.strip():
                self.warn(f"{cls.__name__}.{name} is configurable but has no help text")
            out += [f".. _setting-{name}:", "", f".. autotrait:: {self.arguments[0]}.{name}", ""]
        return out


class BatchspawnerSettings(_Rst):
    """batchspawner's settings under HPCSlurmSpawner, from ``spawner/compat.py``'s tables."""

    def lines(self) -> list[str]:
        from jupyter_hpcai.spawner import compat

        rows = [[code(k), f"{code('#SBATCH ' + v)} for every job"] for k, v in compat.SBATCH.items()]
        rows += [[code(k), esc(v)] for k, v in compat.USED.items()]
        refused = [[code(k), esc(v)] for k, v in sorted(compat.REFUSED.items())]
        return (["Used, as batchspawner uses them:", "", *table(["setting", "what it does"], rows, "1 3"),
                 "Refused: the hub stops at its config and names what to use instead:", "",
                 *table(["setting", "use instead"], refused, "1 3"),
                 "Options in ``req_options`` or a profile's ``extra_sbatch`` may not set what the hub writes itself:",
                 ", ".join(code(o) for o in (*compat.OWN_OPTIONS, *compat.OWN_SHORT)) + ".", ""])


def _arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(action.option_strings) or (action.metavar or action.dest).upper()
        if action.option_strings and action.nargs != 0:
            name += " " + (action.metavar or action.dest.upper())
        extra = []
        if action.choices:
            extra.append("one of " + ", ".join(code(c) for c in action.choices))
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS, ""):
            extra.append(f"default {code(action.default)}")
        if not action.option_strings and action.nargs == "?":
            extra.append("optional")
        rows.append([code(name), "; ".join(filter(None, [esc(action.help or ""), *extra]))])
    return rows


def _parser_section(title: str, label: str, parser: argparse.ArgumentParser, about: str) -> Section:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    body = [about, "", ".. code-block:: text", "", *(f"   {line}" for line in usage.splitlines()), ""]
    rows = _arguments(parser)
    return label, title, body + (table(["argument", "meaning"], rows, "1 3") if rows else ["No arguments.", ""])


class Magics(_Rst):
    """``hpc``: ``%hpc``'s verbs from its subparsers (which must match ``SUBCOMMANDS``); ``rank``: the rank magics."""

    required_arguments = 1

    def sections(self) -> list[Section]:
        from jupyter_hpcai import magic_args, magics

        if self.arguments[0] == "rank":
            out = []
            from jupyter_hpcai.ranks.frameworks import FRAMEWORKS

            for name, about in ((f.magic, esc(magics.rank_magic_help(f))) for f in FRAMEWORKS.values()):
                out += [_parser_section(f"%%{name}", f"magic-{name}", magic_args.run_parser(f"%%{name}"), about),
                        _parser_section(f"%{name} SCRIPT", f"magic-{name}-script",
                                        magic_args.run_parser(f"%{name}", script=True),
                                        "The line form: runs the script's ``__main__`` block on every rank.")]
            return out
        sub = next(a for a in magic_args.hpc_parser()._actions if isinstance(a, argparse._SubParsersAction))
        helps = {c.dest: c.help or "" for c in sub._choices_actions}
        for verb in set(sub.choices) ^ set(magics.SUBCOMMANDS):
            self.warn(f"%hpc {verb}: in only one of magic_args.hpc_parser and magics.SUBCOMMANDS")
        return [_parser_section(f"%hpc {verb}", f"hpc-{verb}", parser, esc(helps.get(verb, "")))
                for verb, parser in sub.choices.items()]


class Variables(_Rst):
    """Every ``HPCAI_*`` variable of ``contract.VARIABLES``: who sets it, who reads it, what it means."""

    def lines(self) -> list[str]:
        from jupyter_hpcai.contract import VARIABLES

        rows = [[code(v.name), esc(", ".join(v.set_by) or "(nobody: a fallback)"), esc(", ".join(v.read_by)),
                 esc(v.meaning)] for v in VARIABLES.values()]
        return table(["variable", "set by", "read by", "meaning"], rows, "2 1 1 4")


def _type(prop: dict[str, Any]) -> str:
    """A JSON schema property's type in a few words."""
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if "oneOf" in prop:
        return " or ".join(_type(p) for p in prop["oneOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        kind = f"list of {_type(prop.get('items', {}))}"
    elif kind == "object" and prop.get("patternProperties"):
        (keys, value), = prop["patternProperties"].items()
        kind = f"map of keys matching {keys} to {_type(value)}"
    elif kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        kind = f"map to {_type(prop['additionalProperties'])}"
    limits = [f"{k} {prop[k]}" for k in ("pattern", "const", "minLength", "minItems", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum") if k in prop]
    return f"{kind} ({', '.join(limits)})" if limits else kind


class ModelSchema(_Rst):
    """A pydantic model's (or annotated type's) JSON schema: a table per object, then the schema itself."""

    required_arguments = 1

    def lines(self) -> list[str]:
        schema = TypeAdapter(load(self.arguments[0])).json_schema(mode="serialization")
        objects = {**schema.get("$defs", {})}
        if "properties" in schema:
            objects = {schema.get("title", "top"): schema, **objects}
        out: list[str] = []
        for title, obj in objects.items():
            if "properties" not in obj:
                continue
            required = set(obj.get("required", []))
            rows = [[code(name), esc(_type(prop)), "yes" if name in required else code(json.dumps(prop.get("default")))]
                    for name, prop in obj["properties"].items()]
            extra = "unknown keys refused" if obj.get("additionalProperties") is False else "unknown keys kept"
            about = " ".join(filter(None, [doc(obj.get("description", "")), f"({extra}.)"]))
            out += [f".. rubric:: {esc(title)}", "", about, "",
                    *table(["field", "type", "required, or default"], rows, "1 3 1")]
        body = json.dumps(schema, indent=2).splitlines()
        return out + [".. code-block:: json", "   :caption: JSON schema", "", *(f"   {line}" for line in body), ""]


def _methods(handler: type) -> list[str]:
    return [m.upper() for m in ("get", "post", "put", "patch", "delete") if m in vars(handler)]


class Endpoints(_Rst):
    """REST endpoints: ``server`` (the jupyter_server extension's) or ``hub`` (this package's in the hub)."""

    required_arguments = 1

    def routes(self) -> list[tuple[str, type]]:
        if self.arguments[0] == "server":
            from jupyter_hpcai.server.handlers import setup_handlers

            found: list[tuple[str, type]] = []

            class App:
                settings = {"base_url": "/"}

                def add_handlers(self, host: str, rules: list[tuple[str, type]]) -> None:
                    found.extend(rules)

            setup_handlers(App())
            return found
        from jupyter_hpcai.spawner.hub_api import HANDLERS

        return [("/hub" + path, h) for path, h in HANDLERS]

    def sections(self) -> list[Section]:
        out = []
        for path, handler in self.routes():
            for method in _methods(handler):
                title = f"{method} {path}"
                text = inspect.getdoc(getattr(handler, method.lower())) or inspect.getdoc(handler) or ""
                if not text:
                    self.warn(f"{handler.__qualname__}.{method.lower()} has no docstring")
                label = "api-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
                out.append((label, title, [doc(text), "",
                                           f"Handler: {code(handler.__module__ + '.' + handler.__qualname__)}."]))
        return out


class NotebookCells(_Rst):
    """The code cells of a notebook in the repository, read from the file (``:cells: 1,3``: those only)."""

    required_arguments = 1
    option_spec = {"cells": lambda text: [int(n) for n in text.split(",")]}

    def lines(self) -> list[str]:
        path = Path(self.config.hpcai_repo) / self.arguments[0]
        self.env.note_dependency(str(path))
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        chosen = self.options.get("cells") or range(1, len(cells) + 1)
        out: list[str] = []
        for number in chosen:
            if not 1 <= number <= len(cells):
                self.warn(f"{self.arguments[0]} has {len(cells)} code cells, not {number}")
                continue
            source = "".join(cells[number - 1]["source"]).splitlines()
            out += [".. code-block:: ipython", "", *(f"   {line}" for line in source), ""]
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("hpcai_repo", "", "env")
    for name, directive in {"hpcai-settings": Settings, "hpcai-batchspawner-settings": BatchspawnerSettings,
                            "hpcai-magics": Magics, "hpcai-variables": Variables, "hpcai-schema": ModelSchema,
                            "hpcai-endpoints": Endpoints, "hpcai-notebook-cells": NotebookCells}.items():
        app.add_directive(name, directive)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
