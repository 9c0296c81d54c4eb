"""Checks of a rendered HTML page, for the unit and integration tests of the UI page (airflow_eo/ui/).

:func:`check_page` parses a page strictly (every element closed, in order; what a browser
would silently repair fails), refuses forms, frames, event-handler attributes and any script but
the page's own (``static/ui.js``, once), requires every link to be relative (no scheme, no host,
no leading ``/``: the page lives under Airflow's base URL and behind proxies), every link to an
Airflow page (``../…``) to open in the whole window (``target="_top"``) and every link between the
page's own views to stay in the frame (no ``target``), and parses every inline ``<svg>`` as XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from urllib.parse import urlsplit

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
URL_ATTRIBUTES = ("href", "src", "action", "formaction", "xlink:href", "poster", "srcset")
SVG = "{http://www.w3.org/2000/svg}"


class StrictHTML(HTMLParser):
    """Fails on an element closed out of order or never; collects the URLs and tag names."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self.links: list[dict] = []  # each <a>'s attributes
        self.scripts: list[str] = []  # each <script>'s text
        self.script_attributes: list[list] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.urls += [v for k, v in attrs if k in URL_ATTRIBUTES and v is not None]
        if tag == "a":
            self.links.append(dict(attrs))
        if tag == "script":
            self.scripts.append("")
            self.script_attributes.append(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "script":
            self.scripts[-1] += data

    def handle_startendtag(self, tag, attrs):
        self.tags.add(tag)
        self.urls += [v for k, v in attrs if k in URL_ATTRIBUTES and v is not None]

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-3:]}"
        self.stack.pop()


def svgs(html: str) -> list[ET.Element]:
    """Every inline SVG of the page, parsed as XML (a malformed one raises)."""
    return [ET.fromstring(svg) for svg in re.findall(r"<svg\b.*?</svg>", html, re.S)]


def check_page(html: str) -> StrictHTML:
    assert html.startswith("<!doctype html>")
    parser = StrictHTML()
    parser.feed(html)
    parser.close()
    assert parser.stack == [], f"never closed: {parser.stack}"
    assert not parser.tags & {"form", "iframe", "object", "embed", "base", "input", "button"}
    assert not re.search(r"\son\w+\s*=", html), "an event handler attribute"
    from airflow_eo.ui.render import script

    # one script, the page's own (the CSP allows it by its hash): no other, no src
    assert parser.scripts == [script()] and parser.script_attributes == [[]], parser.scripts
    for link in parser.links:  # Airflow's pages in the whole window, the page's own views in the frame
        airflow_page = bool(re.match(r"(\./)?(\.\./)+[^./]", link.get("href", "")))  # not the list: ./ or ../../
        assert link.get("target") == ("_top" if airflow_page else None), link
    for url in parser.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and not url.startswith("/"), f"not a relative URL: {url}"
    for root in svgs(html):
        assert root.tag == f"{SVG}svg" and root.get("viewBox")
    return parser
