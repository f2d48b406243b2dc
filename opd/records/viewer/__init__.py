"""The records viewer: a self-contained HTML page per groups file (`write_viewer`); `summary`
(the index's per-group row), `payload` (a group packed for the page), `page` (the page itself;
its markup, style and script are page.html, page.css and page.js)."""

from opd.records.viewer.page import write_viewer

__all__ = ["write_viewer"]
