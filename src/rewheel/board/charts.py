"""The board's charts: static SVG made by pygal, inlined into the pages.

pygal (a maintained, pure-Python SVG charting library) draws the axes, scales and legends;
what it adds for its optional tooltips — a `<script>` holding its configuration — is taken
out of the tree before the SVG is written, so a chart needs no JavaScript and the pages'
Content-Security-Policy can forbid every script. Text in a chart (titles, labels) is escaped
by the XML serializer."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime

import pygal
from pygal.style import Style

# At most this many points per series: a trend of the newest ones (a thousand runs would
# make an unreadable line and a heavy page).
MAX_POINTS = 200

_STYLE = Style(background="transparent", plot_background="transparent", foreground="#222",
               foreground_strong="#111", foreground_subtle="#999", opacity="0.9", opacity_hover="1",
               colors=("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df"),
               font_family="system-ui, sans-serif", label_font_size=11, major_label_font_size=11,
               legend_font_size=12, title_font_size=14, value_font_size=10)


def _svg(chart: pygal.graph.graph.Graph) -> str:
    root = chart.render_tree()
    for parent in root.iter():
        for child in list(parent):
            if isinstance(child.tag, str) and child.tag.rsplit("}", 1)[-1] == "script":
                parent.remove(child)
    return ET.tostring(root, encoding="unicode")


def _config() -> dict[str, object]:
    return {"js": [], "disable_xml_declaration": True, "explicit_size": False, "style": _STYLE,
            "width": 640, "height": 280, "legend_at_bottom": True, "truncate_legend": -1,
            "print_values": False}


def trend(title: str, series: dict[str, list[tuple[datetime, float | None]]], *, unit: str = "s") -> str | None:
    """A time series chart (one line per series, the newest MAX_POINTS points each); None
    when no series has two points."""
    data = {k: sorted((p for p in v if p[1] is not None), key=lambda p: p[0])[-MAX_POINTS:]
            for k, v in series.items()}
    data = {k: v for k, v in data.items() if v}
    if max((len(v) for v in data.values()), default=0) < 2:
        return None  # a single point is no trend (its run's page says it)
    chart = pygal.DateTimeLine(title=title, x_label_rotation=20, y_title=unit, dots_size=2.5,
                               x_value_formatter=lambda d: d.strftime("%Y-%m-%d %H:%M"),
                               x_labels_major_count=6, show_minor_x_labels=False, **_config())
    for name, points in data.items():
        chart.add(name, points)
    return _svg(chart)
