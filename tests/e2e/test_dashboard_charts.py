"""The charts (js/chart.js on the vendored uPlot) and the compare page in headless Chromium.

No training: jobs are submitted to a real API (no worker, so they stay queued) and their
metrics, events and checkpoints are written with the store's own ingest functions, the ones
the worker calls. The browser then drives each chart control — log y, drag-zoom and reset,
the smoothing slider, the x axis — and reads what uPlot drew (its scales, its data columns,
canvas pixels), the markers, the hover box, the accessible name and the data table, and the
compare page's final metrics and recipe differences. Screenshots go to
artifacts/screenshots/. Needs Debian's chromium and chromium-driver and `selenium`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

import pytest

STEPS, TOKENS_PER_STEP, SECONDS_PER_STEP = 120, 128, 0.5
pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from browser_kit import NEEDS_CHROMIUM, SHOTS, chromium, css, sign_in, wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = NEEDS_CHROMIUM


def train_records(curve: Callable[[int], float], steps: int = STEPS) -> list[dict]:
    """Train records of steps 1..steps: `curve(step)` as loss, with a little fixed noise."""
    return [
        {
            "kind": "train",
            "step": s,
            "loss": curve(s) + 0.05 * math.sin(s * 1.7),
            "grad_norm": 1.0 + 0.1 * math.cos(s),
            "lr": 1e-3 * min(1.0, s / 10),
            "tps": 900.0 + s,
            "num_tokens": TOKENS_PER_STEP,
            "timestamp": 1_700_000_000 + s * SECONDS_PER_STEP,
        }
        for s in range(1, steps + 1)
    ]


def val_records(curve: Callable[[int], float]) -> list[dict]:
    return [
        {
            "kind": "val",
            "step": s,
            "val_loss": curve(s) + 0.1,
            "num_tokens": 512,
            "timestamp": 1_700_000_000 + s * SECONDS_PER_STEP,
        }
        for s in (40, 80, 120)
    ]


def base_curve(step: int) -> float:
    return 2.0 + 8.0 * math.exp(-step / 4)


def fast_curve(step: int) -> float:
    return 1.8 + 8.0 * math.exp(-step / 3)


@pytest.fixture(scope="module")
def seeded(stack, valid_recipe) -> dict[str, str]:
    """Four queued jobs with metrics: two comparable runs (lr 1e-3 and 3e-3), a diverged run
    and a run with one step; the first also has checkpoints and events at nearby steps."""
    from jobs.store.engine import session_scope
    from jobs.store.ingest import record_trainer_events, upsert_checkpoints, upsert_metrics

    diverged = [*train_records(base_curve, 60)] + [
        {
            "kind": "train",
            "step": 60 + i,
            "loss": v,
            "num_tokens": TOKENS_PER_STEP,
            "timestamp": 1_700_000_000 + (60 + i) * SECONDS_PER_STEP,
        }
        for i, v in enumerate((1e3, 1e6, 1e12, 1e30, math.inf, math.nan), start=1)
    ]
    runs = {
        "base": (valid_recipe, train_records(base_curve) + val_records(base_curve)),
        "variant": (
            valid_recipe.replace("lr: 1.0e-3", "lr: 3.0e-3"),
            train_records(fast_curve) + val_records(fast_curve),
        ),
        "diverged": (valid_recipe, diverged),
        "single": (valid_recipe, train_records(base_curve, 1)),
    }
    ids = {}
    with stack.client() as client:
        for name, (recipe, _) in runs.items():
            created = client.post("/v1/jobs", json={"name": f"chart-{name}", "recipe_yaml": recipe})
            assert created.status_code == 201, created.text
            ids[name] = created.json()["id"]
    with session_scope(stack.settings) as session:
        for name, (_, records) in runs.items():
            upsert_metrics(session, ids[name], 1, records)
        saved = [{"event": "checkpoint_saved", "step": s, "path": f"step_{s}"} for s in (40, 80)]
        upsert_checkpoints(session, ids["base"], 1, saved)
        events = [
            (1, {"event": "preempted", "step": 80}),
            (2, {"event": "resumed", "step": 81}),
            (3, {"event": "rollback", "step": 82}),
        ]
        record_trainer_events(session, ids["base"], 1, events)
    return ids


@pytest.fixture(scope="module")
def browser(stack) -> Iterator[webdriver.Chrome]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as driver:
        yield sign_in(driver, stack)


def plot(driver, selector: str, expression: str):
    """Evaluate `expression` with `c` the LineChart and `u` its uPlot instance."""
    script = f"const c = document.querySelector(arguments[0]).chart; const u = c.plot; return {expression};"
    return driver.execute_script(script, selector)


def contrast_on_white(colour: str) -> float:
    """WCAG 2 contrast of a computed `rgb(...)`/`rgba(...)` colour against white."""
    channels = [int(c) / 255 for c in re.findall(r"[\d.]+", colour)[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return 1.05 / (luminance + 0.05)


def open_compare(driver, stack, *ids: str, metric: str = "loss") -> str:
    driver.get(f"{stack.url}/compare?ids={','.join(ids)}&metric={metric}")
    chart = "#compare-chart"
    wait_until(lambda: plot(driver, chart, "u && u.series.length - 1") or 0, 20, "the chart")
    return chart


def dataset(driver, selector: str, key: str) -> str:
    return driver.execute_script(
        "return document.querySelector(arguments[0]).dataset[arguments[1]];", selector, key
    )


def test_compare_chart_controls(stack, seeded, browser) -> None:
    driver = browser
    chart = open_compare(driver, stack, seeded["base"], seeded["variant"])
    # Two runs, smoothed: raw (faint) + smoothed each, and each run's dashed val loss.
    assert plot(driver, chart, "u.series.slice(1).map((s) => s.label)") == [
        "chart-base (raw)",
        "chart-base",
        "chart-base (val)",
        "chart-variant (raw)",
        "chart-variant",
        "chart-variant (val)",
    ]
    assert plot(driver, chart, "u.series[3].dash") == [6, 4]
    swatches = driver.find_elements(By.CSS_SELECTOR, f"{chart} .u-legend .u-marker")
    assert [s.value_of_css_property("border-top-style") for s in swatches[1:4]] == [  # [0]: x
        "solid",
        "solid",
        "dashed",
    ]
    # The first steps' spike (loss ~10) is clipped by default; "show outliers" shows it.
    assert plot(driver, chart, "u.scales.y.max") < 6
    css(driver, f"{chart} [data-control=outliers]").click()
    wait_until(lambda: plot(driver, chart, "u.scales.y.max") > 8, 5, "the full y range")
    css(driver, f"{chart} [data-control=outliers]").click()
    shot = SHOTS / "charts-compare-linear.png"
    driver.save_screenshot(str(shot))

    linear = plot(driver, chart, "[u.scales.y.distr, u.scales.y.min, u.scales.y.max]")
    css(driver, f"{chart} [data-control=log]").click()
    wait_until(lambda: dataset(driver, chart, "yScale") == "log", 5, "the log scale")
    log = plot(driver, chart, "[u.scales.y.distr, u.scales.y.min, u.scales.y.max]")
    assert linear[0] == 1 and log[0] == 3 and log[1:] != linear[1:] and log[1] > 0
    driver.save_screenshot(str(SHOTS / "charts-compare-log.png"))
    css(driver, f"{chart} [data-control=log]").click()

    # Drag-zoom across the middle of the plot, then Reset zoom.
    over = css(driver, f"{chart} .u-over")
    width = over.size["width"]
    ActionChains(driver).move_to_element_with_offset(
        over, -width // 4, 0
    ).click_and_hold().move_by_offset(width // 3, 0).release().perform()
    wait_until(lambda: dataset(driver, chart, "zoomed") == "true", 5, "the zoom")
    low, high = plot(driver, chart, "[u.scales.x.min, u.scales.x.max]")
    assert 1 < low < high < STEPS and high - low < STEPS / 2
    reset = css(driver, f"{chart} [data-control=reset]")
    assert reset.is_enabled()
    reset.click()
    wait_until(lambda: dataset(driver, chart, "zoomed") == "false", 5, "the reset")
    assert plot(driver, chart, "[u.scales.x.min, u.scales.x.max]") == [1, STEPS]
    assert not reset.is_enabled()

    # Smoothing: a heavier weight redraws the smoothed line (not the raw one); 0 drops the
    # faint raw copy.
    before = plot(
        driver, chart, "[u.data[1].slice(0, 50), u.data[2].slice(0, 50), u.ctx.canvas.toDataURL()]"
    )
    slider = css(driver, f"{chart} [data-control=smoothing]")
    driver.execute_script(
        "arguments[0].value = '0.95'; arguments[0].dispatchEvent(new Event('input'));", slider
    )
    after = plot(
        driver, chart, "[u.data[1].slice(0, 50), u.data[2].slice(0, 50), u.ctx.canvas.toDataURL()]"
    )
    assert after[0] == before[0] and after[1] != before[1] and after[2] != before[2]
    assert dataset(driver, chart, "smoothing") == "0.95"
    driver.execute_script(
        "arguments[0].value = '0'; arguments[0].dispatchEvent(new Event('input'));", slider
    )
    wait_until(lambda: plot(driver, chart, "u.series.length") == 5, 5, "the raw lines only")

    # x by tokens seen, then by wall time (from each run's own records).
    select = css(driver, f"{chart} [data-control=x]")
    for mode, last in (
        ("tokens", STEPS * TOKENS_PER_STEP),
        ("time", (STEPS - 1) * SECONDS_PER_STEP),
    ):
        driver.execute_script(
            "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'));",
            select,
            mode,
        )
        wait_until(lambda m=mode: dataset(driver, chart, "x") == m, 5, f"x by {mode}")
        assert plot(driver, chart, "u.data[0][u.data[0].length - 1]") == pytest.approx(last)
        assert (
            plot(driver, chart, "u.axes[0].label")
            == {"tokens": "tokens seen", "time": "wall time (elapsed)"}[mode]
        )
    driver.save_screenshot(str(SHOTS / "charts-compare-by-time.png"))


def test_hover_box_stays_inside_the_chart_and_legend_is_live(stack, seeded, browser) -> None:
    driver = browser
    chart = open_compare(driver, stack, seeded["base"], seeded["variant"])
    over = css(driver, f"{chart} .u-over")
    ActionChains(driver).move_to_element_with_offset(over, over.size["width"] // 2 - 3, 0).perform()
    tip = wait_until(lambda: css(driver, f"{chart} .chart-tip:not([hidden])"), 5, "the hover box")
    box = css(driver, f"{chart} .chart-plot").rect
    assert (
        tip.rect["x"] >= box["x"] and tip.rect["x"] + tip.rect["width"] <= box["x"] + box["width"]
    )
    assert "chart-base:" in tip.text and "chart-variant (val):" in tip.text
    values = [v.text for v in driver.find_elements(By.CSS_SELECTOR, f"{chart} .u-legend .u-value")]
    assert all(v and v != "--" for v in values), values
    driver.save_screenshot(str(SHOTS / "charts-compare-hover.png"))


def test_single_point_and_diverged_runs(stack, seeded, browser) -> None:
    driver = browser
    missing = "00000000-0000-4000-8000-000000000000"  # a job that does not exist is left out
    chart = open_compare(driver, stack, seeded["single"], missing)
    wait_until(lambda: missing not in driver.current_url, 5, "the unknown id dropped")
    shown, pixel = plot(
        driver,
        chart,
        """[u.series[2].points.show(u, 2), (() => {
        const i = u.data[2].findIndex((v) => Number.isFinite(v));
        const x = Math.round(u.valToPos(u.data[0][i], 'x', true));
        const y = Math.round(u.valToPos(u.data[2][i], 'y', true));
        return Array.from(u.ctx.getImageData(x, y, 1, 1).data);
    })()]""",
    )
    assert shown is True
    assert pixel[:3] == pytest.approx([0x2F, 0x6F, 0xDE], abs=40), pixel  # the run's blue
    ticks = dataset(driver, chart, "xTicks").split()
    assert ticks and all(t.isdigit() for t in ticks), ticks  # whole steps, never 1.1 1.2 ...
    driver.save_screenshot(str(SHOTS / "charts-single-point.png"))

    chart = open_compare(driver, stack, seeded["diverged"])
    assert plot(driver, chart, "u.scales.y.max") < 20  # 1e30 does not squash the axis
    assert dataset(driver, chart, "clipped") == "true"
    assert css(driver, f"{chart} .chart-note").is_displayed()
    driver.save_screenshot(str(SHOTS / "charts-diverged.png"))
    css(driver, f"{chart} [data-control=outliers]").click()
    wait_until(lambda: plot(driver, chart, "u.scales.y.max") >= 1e30, 5, "every value")


def test_compare_table_metric_choice_and_accessible_chart(stack, seeded, browser) -> None:
    driver = browser
    chart = open_compare(driver, stack, seeded["base"], seeded["variant"])
    row = wait_until(lambda: css(driver, "#compare-diff tr[data-key='optimizer.lr']"), 10, "lr")
    assert [td.text for td in row.find_elements(By.TAG_NAME, "td")] == ["0.001", "0.003"]
    keys = [
        tr.get_attribute("data-key")
        for tr in driver.find_elements(By.CSS_SELECTOR, "#compare-diff tbody tr")
    ]
    assert not any(k.startswith("model.") for k in keys), keys  # same model: not listed
    final = {
        tr.find_element(By.TAG_NAME, "th").get_attribute("textContent"): [
            td.text for td in tr.find_elements(By.TAG_NAME, "td")
        ]
        for tr in driver.find_elements(By.CSS_SELECTOR, "#compare-final tbody tr")
    }
    assert final["steps"] == [f"{STEPS} / 40", f"{STEPS} / 40"]
    assert final["tokens seen"] == ["15.4k", "15.4k"]

    figure = css(driver, chart)
    assert figure.get_attribute("role") == "figure"
    assert figure.get_attribute("aria-label") == "loss (nats / token) by step"
    summary = css(driver, f"#{figure.get_attribute('aria-describedby')}").get_attribute(
        "textContent"
    )
    assert "chart-base" in summary and f"at step {STEPS}" in summary
    for control in driver.find_elements(
        By.CSS_SELECTOR, f"{chart} .chart-tools input, {chart} .chart-tools select"
    ):
        assert control.accessible_name, control.get_attribute("data-control")
    texts = (".chart-tools label", ".chart-note", ".chart-data summary", ".u-legend th")
    for selector in texts:  # AA: 4.5:1 against the white panel
        colour = css(driver, f"{chart} {selector}").value_of_css_property("color")
        assert contrast_on_white(colour) >= 4.5, (selector, colour)
    css(driver, f"{chart} details.chart-data summary").click()
    rows = wait_until(
        lambda: driver.find_elements(By.CSS_SELECTOR, f"{chart} .chart-data tbody tr"),
        5,
        "the table",
    )
    assert len(rows) == 20 and rows[0].find_element(By.TAG_NAME, "th").text == str(STEPS)
    driver.save_screenshot(str(SHOTS / "charts-compare-table.png"))

    metric = css(driver, "#compare-metric")
    driver.execute_script(
        "arguments[0].value = 'grad_norm'; arguments[0].dispatchEvent(new Event('change'));", metric
    )
    wait_until(
        lambda: plot(driver, chart, "u.axes[1].label") == "gradient norm (L2)",
        5,
        "the grad norm axis",
    )
    assert "metric=grad_norm" in driver.current_url
    assert plot(driver, chart, "Math.max(...u.data[1].filter(Number.isFinite))") < 1.2


def test_job_page_markers_grouped_per_step_never_overlap(stack, seeded, browser) -> None:
    driver = browser
    driver.get(f"{stack.url}/jobs/{seeded['base']}")
    chart = "#chart-loss"
    wait_until(lambda: css(driver, f"{chart} .chart-marker[data-step='82']"), 20, "the markers")
    assert len(driver.find_elements(By.CSS_SELECTOR, f"{chart} .chart-marker[data-step='80']")) == 1
    label = css(driver, f"{chart} .chart-marker-label[data-step='80']")
    assert "ckpt" in label.get_attribute("textContent") and "preempt" in label.get_attribute(
        "textContent"
    )
    shown = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].filter((e) => !e.hidden)"
        ".map((e) => e.getBoundingClientRect()).map((r) => ({x: r.x, y: r.y, width: r.width, height: r.height}));",
        f"{chart} .chart-marker-label",
    )  # one read: the page may redraw between two
    assert len(shown) >= 3
    for i, a in enumerate(shown):
        for b in shown[i + 1 :]:
            apart = (
                a["x"] + a["width"] <= b["x"]
                or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"]
                or b["y"] + b["height"] <= a["y"]
            )
            assert apart, (a, b)
    assert css(driver, "#chart-mfu").get_attribute("aria-label") == "MFU (%) by step"
    driver.execute_script("document.querySelector('#chart-loss').scrollIntoView();")
    driver.save_screenshot(str(SHOTS / "charts-job-page.png"))
