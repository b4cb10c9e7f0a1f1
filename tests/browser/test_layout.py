"""Every demo page on a 1280 px laptop and a 390 px phone: no page wider than its viewport (a wide table
scrolls inside its own region), charts within their card, no chart toolbar or legend over the data or
an axis title; the runs list readable at 1280 px with runs named by their draft, not a cache hash."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import SCREENSHOTS, wait_for_charts

pytestmark = pytest.mark.browser

WIDTHS = (1280, 390)

# What overflows its box on the page, in words (empty: nothing): the page itself, a card (only a
# .scroll-x region may scroll), a chart wider than its slot; a legend over the x-axis title; the toolbar
# over the plot area, or shown at all on a phone.
LAYOUT_PROBLEMS = """(phone) => {
  const problems = [], box = (e) => e.getBoundingClientRect();
  const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const page = document.documentElement;
  if (page.scrollWidth > innerWidth) problems.push(`page ${page.scrollWidth} px wide in ${innerWidth}`);
  document.querySelectorAll('.card').forEach((c) => {
    if (c.scrollWidth > c.clientWidth + 1) problems.push(`card #${c.id} scrolls (${c.scrollWidth} > ${c.clientWidth})`);
  });
  document.querySelectorAll('div.plot[data-figure]').forEach((d) => {
    const svg = d.querySelector('svg.main-svg');
    if (box(svg).width > box(d).width + 1) problems.push(`${d.id} drawn ${box(svg).width} px in ${box(d).width}`);
    const legend = d.querySelector('g.legend'), title = d.querySelector('.xtitle');
    if (legend && title && overlap(box(legend), box(title))) problems.push(`${d.id}: legend over the x-axis title`);
    const bar = d.querySelector('.modebar'), plot = d.querySelector('.nsewdrag');
    if (phone && bar) problems.push(`${d.id}: a toolbar on a phone`);
    if (bar && plot && box(bar).bottom > box(plot).top + 0.5) problems.push(`${d.id}: toolbar over the plot`);
  });
  return problems;
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_its_viewport(page, demo_dashboard, demo_pages, width):
    page.set_viewport_size({"width": width, "height": 900})
    problems = {}
    for name, path in demo_pages.items():
        page.goto(demo_dashboard + path)
        wait_for_charts(page)
        found = page.evaluate(LAYOUT_PROBLEMS, width < 700)
        if found:
            problems[name] = found
    assert len(demo_pages) >= 15 and not problems, problems


def test_charts_follow_the_window_width(page, demo_dashboard, demo_runs):
    page.goto(f"{demo_dashboard}/runs/{demo_runs['healthy']}")
    wait_for_charts(page)
    wide = page.evaluate("() => document.querySelector('#plot-norms svg.main-svg').getBoundingClientRect().width")
    page.set_viewport_size({"width": 390, "height": 900})
    page.wait_for_function("() => document.querySelector('#plot-norms svg.main-svg')"
                           ".getBoundingClientRect().width <= 390")
    assert wide > 600


def test_runs_list_at_1280_names_runs_by_their_draft(page, demo_dashboard, demo_runs):
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(demo_dashboard + "/")
    table = page.locator("table.runs")
    region = page.locator("#runs .scroll-x")
    assert region.evaluate("(r) => r.scrollWidth <= r.clientWidth"), "the runs table scrolls at 1280 px"
    # No cache hash (nor any long hex) in view: run ids show their first 8 characters.
    assert not re.search(r"[0-9a-f]{12,}", table.inner_text())
    names = {}  # every demo run named apart (the healthy, algo-eagle and tree runs share a draft folder)
    for scenario in demo_runs:
        link = page.locator(f"tr[data-run='{demo_runs[scenario]}'] td.run-name a")
        names[scenario] = link.inner_text()
        draft = link.get_attribute("title")  # the full path, on hover
        folder = names[scenario].split(" (")[0].split("/")[-1]  # the bracket: what sets it apart
        assert folder and folder in draft, (names[scenario], draft)
    assert len(set(names.values())) == len(demo_runs), names
    page.screenshot(path=str(SCREENSHOTS / "runs-list-1280.png"))


def test_runs_list_shows_random_weights_and_names_the_other_findings(page, demo_dashboard, demo_runs):
    page.goto(demo_dashboard + "/")
    aux_off = page.locator(f"tr[data-run='{demo_runs['kimi-aux-off']}']")
    assert aux_off.locator(".badge.error").inner_text() == "fc-bypassed"
    assert aux_off.locator(".badge.random").is_visible()
    assert aux_off.locator(".badge.random").inner_text() == "random weights"
    healthy = page.locator(f"tr[data-run='{demo_runs['kimi-healthy']}']")
    assert healthy.locator(".badge.random").is_visible() and healthy.locator(".badge.error").count() == 0
    more = aux_off.locator(".more")
    if more.count():  # the rest of its findings, named on hover
        rules = more.get_attribute("title").removeprefix("also: ").split(", ")
        assert len(rules) == int(re.match(r"\+(\d+)", more.inner_text()).group(1)) and all(rules)
    # A run without random weights has no such badge.
    assert page.locator(f"tr[data-run='{demo_runs['healthy']}'] .badge.random").count() == 0


def test_aux_off_run_page_on_a_phone(page, demo_dashboard, demo_runs):
    page.set_viewport_size({"width": 390, "height": 900})
    page.goto(f"{demo_dashboard}/runs/{demo_runs['kimi-aux-off']}")
    wait_for_charts(page)
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
    region = page.locator("#spec-diff .scroll-x")
    assert region.evaluate("(r) => r.scrollWidth > r.clientWidth")  # the table scrolls in its card
    assert page.locator(".modebar").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "kimi-aux-off-run-390.png"),
                    clip={"x": 0, "y": 0, "width": 390, "height": 1700}, full_page=True)


def test_compare_of_the_kimi_runs_says_the_weights_are_random(page, demo_dashboard, demo_pages):
    page.goto(demo_dashboard + demo_pages["compare-kimi"])
    wait_for_charts(page)
    for side in ("a", "b"):
        assert "random" in page.locator(f"#random-weights-{side}").inner_text()
    assert "No check failed" not in page.locator("main").inner_text()
    # The aux-off side (B): what its target fed, and fc's width it never got, highlighted.
    fed = page.locator("#engines-fed td.engine-fed_hf").nth(1)
    assert "aux capture off" in fed.inner_text() and "flagged" in fed.get_attribute("class")
    fc = page.locator("#engines-fed td.engine-fc_in_features")
    assert "flagged" in fc.nth(1).get_attribute("class") and "flagged" not in fc.nth(0).get_attribute("class")
    assert "not recorded" not in page.locator("#engines-fed").inner_text()
    # Both runs' lines drawn apart: no colour shared, B dashed with larger open markers.
    traces = page.evaluate("() => document.getElementById('plot-cmp-norms').data.map("
                           "(t) => [t.name, t.line.color, t.line.dash])")
    colours = {side: {c for name, c, _ in traces if name.startswith(side)} for side in ("A", "B")}
    assert colours["A"] and colours["B"] and not colours["A"] & colours["B"], traces
    seq = page.evaluate("() => document.getElementById('plot-cmp-by-seq-pos').data.map("
                        "(t) => [t.line.color, t.line.dash, t.marker.symbol, t.marker.size])")
    assert len(seq) == 2 and seq[0] != seq[1] and seq[1][3] > seq[0][3], seq
    # Nothing accepted on either side: the per-position chart says so instead of drawing empty axes.
    notes = page.evaluate("() => document.getElementById('plot-cmp-per-position').layout.annotations"
                          ".map((a) => a.text).join(' ')")
    assert "0 of" in notes and "drafts accepted" in notes, notes


def test_request_page_legend_and_chart_agree_and_a_step_replaces_the_last(page, demo_dashboard, demo_pages):
    page.goto(demo_dashboard + demo_pages["request:healthy"])
    wait_for_charts(page)
    names = page.evaluate("() => document.getElementById('plot-timeline').data.map((t) => t.name)")
    legend = page.locator("#timeline-legend").inner_text()
    assert all(f"{n}:" in legend for n in names), (names, legend)
    bonus = page.locator("#plot-timeline .trace.bars").nth(1).locator(".point path")  # one token high each
    steps = page.evaluate("() => document.getElementById('plot-timeline').data[1].x")
    for i in (0, len(steps) - 1):
        # plotly.js clicks the point its hover found: hover first, until its label shows, then click.
        bonus.nth(i).hover(force=True)
        page.wait_for_function(f"() => [...document.querySelectorAll('#plot-timeline .hoverlayer .hovertext')]"
                               f".some((t) => t.textContent.includes('step {steps[i]}:'))")
        bonus.nth(i).click(force=True)
        page.wait_for_function(f"() => [...document.querySelectorAll('#step-detail h2')].some("
                               f"(h) => (h.textContent.trim() + ' ').startsWith('Step {steps[i]} '))")
    assert page.locator("#step-detail").count() == 1
    assert page.locator("#step-detail #step-detail").count() == 0


def test_random_weights_and_non_finite_probabilities_said_on_request_pages(page, demo_dashboard, demo_pages):
    page.goto(demo_dashboard + demo_pages["request:kimi-aux-off"])
    assert "random" in page.locator("#random-weights").inner_text()
    page.goto(demo_dashboard + demo_pages["request:weights-dropped"])
    first_step = page.locator("#timeline details a").first.get_attribute("href")
    page.goto(demo_dashboard + first_step)
    assert page.locator("#draft-nonfinite").is_visible()
    assert page.locator("table.topk .bad:has-text('non-finite')").count() > 0
    assert page.locator("#run-root-cause .badge.error").inner_text() == "draft-weights-not-loaded"
