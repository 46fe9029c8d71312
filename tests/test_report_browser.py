"""The HTML reports render in a real browser: headless Chromium (Debian's chromium + chromium-driver, which
.ci/run installs) opens the demo's pages and a cluster's load-balance page, and every figure must draw
(its SVG is there) with nothing on the console at warning level or above. Skips without Chromium."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sim.app.plotlyjs import JS_NAME

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="headless Chromium not installed (apt-get install chromium chromium-driver)")  # fmt: skip

_RENDERED = """return Array.from(document.querySelectorAll('.plotly-graph-div')).map(
    d => [d.id, Boolean(d._fullLayout), d.querySelectorAll('.main-svg').length])"""


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def render(driver, page: Path) -> tuple[list[list], list[dict]]:
    """Open ``page``; per figure [id, laid out, number of SVG layers], and the console's warnings/errors."""
    driver.get(page.resolve().as_uri())
    figures = driver.execute_script(_RENDERED)
    logs = [e for e in driver.get_log("browser") if e.get("level") in ("WARNING", "SEVERE")]
    return figures, logs


def assert_renders(driver, page: Path, at_least: int) -> None:
    figures, logs = render(driver, page)
    expected = page.read_text(encoding="utf-8").count("Plotly.newPlot")
    assert len(figures) == expected >= at_least, (page, figures)
    assert all(laid_out and svgs >= 1 for _, laid_out, svgs in figures), (page, figures)
    assert not logs, (page, logs)


def test_demo_pages_render_with_one_shared_plotlyjs(browser, tmp_path):
    from sim.app.demo import run_demo

    out = tmp_path / "demo"
    run_demo(out, quick=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.js")) == [JS_NAME]
    pages = sorted(out.rglob("*.html"))
    assert len(pages) == 5  # the comparison and one report per concurrency level
    for page in pages:
        assert_renders(browser, page, at_least=2)


def test_a_single_figure_page_renders(browser, tmp_path):
    import plotly.graph_objects as go

    from sim.app.plotlyjs import write_figure

    page = write_figure(go.Figure(go.Bar(x=["a", "b"], y=[1, 3])), tmp_path / "sub" / "fig.html",
                        "directory")  # fmt: skip
    assert (tmp_path / "sub" / JS_NAME).is_file()
    assert_renders(browser, page, at_least=1)


def test_the_check_fails_when_plotlyjs_is_missing(browser, tmp_path):
    """The detector itself: a page whose plotly.min.js is gone draws nothing and logs an error."""
    from sim.app.report import write_report
    from sim.app.results import summarize
    from tests.test_report import synthetic

    res = synthetic()
    page = write_report(res, tmp_path / "report.html", summarize(res))
    (tmp_path / JS_NAME).unlink()
    figures, logs = render(browser, page)
    assert not any(laid_out for _, laid_out, _ in figures)
    assert any(e["level"] == "SEVERE" for e in logs)
