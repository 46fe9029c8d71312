"""Where a report's HTML finds plotly.js (4.6 MB): once per output directory, not once per file.

``directory`` (the default) writes ``plotly.min.js`` once into the output directory and every HTML file
under it loads it by a relative path, so a folder of reports opens offline and carries one copy;
``cdn`` loads it from plotly's CDN (smallest files, needs a network); ``inline`` embeds it in each file
(one self-contained file, the old behaviour). plotly's own ``include_plotlyjs`` does the same for one
figure per file; the reports here put several figures on one page, so the tag is written here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import plotly
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from sim.core.errors import ConfigError

PLOTLYJS_MODES = ("directory", "cdn", "inline")
JS_NAME = "plotly.min.js"


@dataclass(frozen=True)
class PlotlyJS:
    """How the HTML written under one output directory loads plotly.js.

    ``directory``: the folder that holds the one ``plotly.min.js`` (None: each HTML file's own folder);
    reports in sub-folders (the demo's per-run reports) point up to it.
    """

    mode: str = "directory"
    directory: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in PLOTLYJS_MODES:
            raise ConfigError(f"--plotlyjs {self.mode!r}: expected one of {', '.join(PLOTLYJS_MODES)}")

    def rooted(self, directory: str | Path) -> PlotlyJS:
        """The same mode with the shared copy in ``directory`` unless a folder was set already."""
        return self if self.directory is not None else PlotlyJS(self.mode, Path(directory))

    def src(self, html_path: str | Path) -> str:
        """What ``html_path`` puts in ``<script src=...>`` (directory and cdn modes); writes the shared
        copy the first time it is needed."""
        if self.mode == "cdn":
            return f"https://cdn.plot.ly/plotly-{plotly.offline.get_plotlyjs_version()}.min.js"
        html_dir = Path(html_path).resolve().parent
        js = (self.directory.resolve() if self.directory is not None else html_dir) / JS_NAME
        write_plotlyjs(js)
        return Path(os.path.relpath(js, html_dir)).as_posix()

    def script_tag(self, html_path: str | Path) -> str:
        if self.mode == "inline":
            return f'<script type="text/javascript">{get_plotlyjs()}</script>'
        return f'<script src="{self.src(html_path)}" charset="utf-8"></script>'


def as_plotlyjs(value: PlotlyJS | str | None) -> PlotlyJS:
    if isinstance(value, PlotlyJS):
        return value
    return PlotlyJS() if value is None else PlotlyJS(str(value))


def write_plotlyjs(path: Path) -> None:
    """Write plotly.js to ``path`` unless an identical copy is there already (same size)."""
    text = get_plotlyjs()
    if path.is_file() and path.stat().st_size == len(text.encode("utf-8")):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_figure(fig: go.Figure, path: str | Path, plotlyjs: PlotlyJS | str | None = None) -> Path:
    """One figure as an HTML file, loading plotly.js as ``plotlyjs`` says."""
    mode = as_plotlyjs(plotlyjs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    include: bool | str = {"inline": True, "cdn": "cdn"}.get(mode.mode) or mode.src(path)
    fig.write_html(path, include_plotlyjs=include, full_html=True)
    return path
