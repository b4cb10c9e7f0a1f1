"""Accessibility checked by a library: axe-core (vendored, ``vendor/axe-4.14.1.min.js``, from npm's
``axe-core@4.14.1``) run in the page over every demo page at 1280 and 390 px, with no serious or critical
violation; charts named images with their toolbars out of the Tab order; a skip link first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import wait_for_charts

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
BLOCKING = ("serious", "critical")
# axe's result, one line per violation: rule, impact, how many nodes and the first two.
RUN_AXE = """async () => (await axe.run(document, {resultTypes: ['violations']})).violations.map((v) =>
  `${v.id} (${v.impact}, ${v.nodes.length} nodes: ${v.nodes.slice(0, 2).map((n) => n.target.join(' ')).join('; ')})`
  + (v.impact === 'serious' || v.impact === 'critical' ? ' BLOCKING' : ''))"""


@pytest.mark.parametrize("width", (1280, 390))
def test_axe_finds_no_serious_or_critical_violation_on_any_page(page, demo_dashboard, demo_pages, width):
    page.context.add_init_script(path=str(AXE))  # an init script runs outside the page's CSP
    page.set_viewport_size({"width": width, "height": 900})
    blocking, checked = {}, 0
    for name, path in demo_pages.items():
        page.goto(demo_dashboard + path)
        wait_for_charts(page)
        found = page.evaluate(RUN_AXE)
        checked += 1
        if any(v.endswith("BLOCKING") for v in found):
            blocking[name] = found
    assert checked == len(demo_pages) >= 15 and not blocking, blocking


def test_axe_does_fail_a_page_with_a_serious_violation(page, demo_dashboard):
    """The check above can fail: text of too little contrast is reported serious."""
    page.context.add_init_script(path=str(AXE))
    page.goto(demo_dashboard + "/import")
    page.evaluate("() => { const p = document.createElement('p'); p.textContent = 'faint';"
                  " p.style.color = '#f4f4f4'; document.querySelector('main').append(p); }")
    assert any("color-contrast" in v and v.endswith("BLOCKING") for v in page.evaluate(RUN_AXE))


def test_charts_are_named_images_and_their_toolbars_take_no_tab_stop(page, demo_dashboard, demo_runs):
    page.goto(f"{demo_dashboard}/runs/{demo_runs['healthy']}")
    wait_for_charts(page)
    charts = page.locator("div.plot[data-figure]")
    assert charts.count() >= 4
    for i in range(charts.count()):
        chart = charts.nth(i)
        label = chart.get_attribute("aria-label")
        assert label and len(label) > 20
        assert chart.locator("svg.main-svg").first.get_attribute("role") == "img"
        assert chart.locator("svg.main-svg").first.get_attribute("aria-label") == label
        assert chart.locator(".modebar-btn").count() > 0  # the toolbar is there (on hover) ...
    # ... but not in the Tab order: nothing inside a chart takes focus from the keyboard.
    tabbable = page.evaluate("() => [...document.querySelectorAll('div.plot a[href], div.plot button, "
                             "div.plot [tabindex]')].filter((e) => e.tabIndex >= 0).length")
    assert tabbable == 0


def test_the_first_tab_stop_skips_to_the_content(page, demo_dashboard, demo_runs):
    page.goto(f"{demo_dashboard}/runs/{demo_runs['kimi-aux-off']}")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to the content"
    assert page.locator(".skip-link").is_visible()  # shown once focused
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.id === 'main'")
