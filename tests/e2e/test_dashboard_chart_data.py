"""js/chart_data.js run in node (no browser): the step -> tokens / wall-time clock of a run,
smoothing, the robust y range, marker grouping, label rows that never overlap, and text
colours that keep AA contrast. Skipped where `node` is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from api.dashboard import STATIC_DIR

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")


def run_js(body: str):
    """Run `body` (an ES module that may `import * as d from "CHART"`) and parse what it prints."""
    source = body.replace("CHART", (STATIC_DIR / "js" / "chart_data.js").as_uri())
    result = subprocess.run(
        ["node", "--input-type=module", "-e", source], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_clock_counts_tokens_and_time_even_when_downsampled():
    out = run_js("""
        import * as d from "CHART";
        const every = [1, 2, 3, 4].map((s) => ({ step: s, num_tokens: 100, timestamp: 50 + 2 * s }));
        const sparse = [1, 4, 10].map((s) => ({ step: s, num_tokens: 100, timestamp: 50 + 2 * s }));
        const a = d.stepClock(every), b = d.stepClock(sparse), none = d.stepClock([{ step: 1 }]);
        console.log(JSON.stringify({
          every: [1, 2, 4].map(a.tokensAt), time: [1, 3, 4].map(a.timeAt),
          sparse: [1, 4, 7, 10, 12].map(b.tokensAt), last: b.lastStep,
          none: [none.hasTokens, none.hasTime, none.tokensAt(1)],
        }));""")
    assert out == {
        "every": [100, 200, 400],
        "time": [0, 4, 6],
        "sparse": [100, 400, 700, 1000, 1000],
        "last": 10,
        "none": [False, False, None],
    }


def test_smoothing_is_debiased_and_skips_missing_values():
    out = run_js("""
        import * as d from "CHART";
        console.log(JSON.stringify({
          half: d.ema([1, 2, null, 3, NaN, undefined], 0.5),
          off: d.ema([1, 5, 2], 0), flat: d.ema([4, 4, 4], 0.99),
        }));""")
    assert out["half"][:2] == [1, pytest.approx(5 / 3)]
    assert out["half"][2] is None and out["half"][4] is None and len(out["half"]) == 6
    assert out["half"][3] == pytest.approx((0.125 * 1 + 0.25 * 2 + 0.5 * 3) / 0.875)
    assert out["off"] == [1, 5, 2] and out["flat"] == pytest.approx([4, 4, 4])


def test_robust_range_clips_spikes_and_divergence_not_a_clean_series():
    out = run_js("""
        import * as d from "CHART";
        const noisy = Array.from({ length: 200 }, (_, i) => 2 + 0.1 * Math.sin(i));
        const spiked = [11, 9, 7, ...noisy], diverged = [...noisy, 1e3, 1e12, 1e30, Infinity, NaN, null];
        const warmup = Array.from({ length: 100 }, (_, i) => 1e-3 * Math.min(1, (i + 1) / 10));
        console.log(JSON.stringify({
          spiked: d.robustRange(spiked), all: d.robustRange(spiked, { clip: false }),
          diverged: d.robustRange(diverged), log: d.robustRange(diverged, { log: true }),
          clean: d.robustRange(noisy), warmup: d.robustRange(warmup, { clip: false }),
          empty: d.robustRange([NaN, null]), one: d.robustRange([3]), zeroes: d.robustRange([0, 0, 1e-3]),
        }));""")
    assert out["spiked"]["clipped"] and 2.1 < out["spiked"]["max"] < 3
    assert not out["all"]["clipped"] and out["all"]["max"] > 11
    assert out["diverged"]["clipped"] and out["diverged"]["max"] < 3
    assert out["log"]["clipped"] and out["log"]["max"] < 3 and out["log"]["min"] > 1
    assert not out["clean"]["clipped"] and out["clean"]["min"] < 1.91 and out["clean"]["max"] > 2.09
    assert 0 <= out["warmup"]["min"] < 1e-4 and out["warmup"]["max"] > 1e-3  # nothing cut
    assert out["empty"] == {"min": 0, "max": 1, "clipped": False}
    assert out["one"]["min"] < 3 < out["one"]["max"]
    assert out["zeroes"]["min"] == 0


def test_markers_group_per_step_and_labels_never_overlap():
    out = run_js("""
        import * as d from "CHART";
        const groups = d.groupMarkers([
          { x: 80, short: "ckpt", label: "checkpoint step_80", color: "#1f9d55" },
          { x: 80, short: "preempt", label: "preempted" }, { x: 80, short: "ckpt", label: "again" },
          { x: 12, short: "pause", label: "paused" }, { x: NaN, short: "lost" },
        ]);
        const items = [0, 4, 8, 12, 16, 380].map((x) => ({ x, width: 40 }));
        console.log(JSON.stringify({ groups, rows: d.layoutLabels(items, 400) }));""")
    assert [(g["x"], g["text"]) for g in out["groups"]] == [(12, "pause"), (80, "ckpt · preempt")]
    assert out["groups"][1]["title"] == "step 80: checkpoint step_80; preempted; again"
    shown = [r for r in out["rows"] if not r["hidden"]]
    assert len(shown) == 4 and out["rows"][3]["hidden"]  # three rows full at x=12
    assert out["rows"][5] == {"left": 337, "row": 0, "hidden": False}  # hangs left at the edge
    for i, a in enumerate(shown):
        for b in shown[i + 1 :]:
            assert a["row"] != b["row"] or abs(a["left"] - b["left"]) >= 46, (a, b)


def test_marker_text_colours_reach_aa_contrast():
    out = run_js("""
        import * as d from "CHART";
        const colours = ["#1f9d55", "#9b51e0", "#c98a0b", "#d64545", "#7d8597", "#2f6fde", "junk"];
        console.log(JSON.stringify(colours.map((c) => [d.readableOn(c), d.contrast(d.readableOn(c), "#ffffff")])));""")
    assert all(ratio >= 4.5 for _, ratio in out), out
    assert out[5][0] == "#2f6fde"  # already readable: kept as is


def test_ticks_are_round_and_a_log_axis_within_a_decade_still_has_some():
    out = run_js("""
        import * as d from "CHART";
        console.log(JSON.stringify({
          linear: d.linearTicks(0.3, 2.6, 5), narrow: d.logTicks(1.71, 2.62),
          few: d.logTicks(0.04, 3), decades: d.logTicks(0.004, 30), many: d.logTicks(1e-3, 1e30),
        }));""")
    assert out["linear"] == [0.5, 1, 1.5, 2, 2.5]
    assert out["narrow"] == [1.8, 2, 2.2, 2.4, 2.6]
    assert out["few"] == [0.05, 0.1, 0.2, 0.5, 1, 2]
    assert out["decades"] == [0.01, 0.1, 1, 10]
    assert (
        len(out["many"]) <= 9
        and out["many"][0] == 1e-3
        and all(f"{v:e}".startswith("1.000") for v in out["many"])
    )
