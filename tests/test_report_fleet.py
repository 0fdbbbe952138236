"""The fleet report's order and shape: a NO-GO of any device class first, in every form."""

from __future__ import annotations

import math
from pathlib import Path

from abbench.analysis.decide import INCONCLUSIVE, Decision
from abbench.analysis.fleet import DeviceOutcome, FleetAnalysis, combine
from abbench.analysis.stats import Interval, Noise
from abbench.records.fleet import FleetPlan
from abbench.report.fleet import html_page, markdown, text_lines, to_json


def _decision(ratio: float, se: float = 0.01) -> Decision:
    iv = Interval(ratio, ratio * math.exp(-2.3 * se), ratio * math.exp(2.3 * se))
    return Decision("B", "A", 0.0, INCONCLUSIVE, None, iv, (), (), "r", None, None,
                    noise=Noise(se * se, 8), se=se)


def test_a_no_go_class_comes_first(tmp_path: Path) -> None:
    phones = [("sim:phone#1", _decision(1.10), ""), ("sim:phone#2", _decision(1.11), "")]
    laptops = [("sim:laptop#1", _decision(0.80), ""), ("sim:laptop#2", _decision(0.81), "")]
    per_class = (combine("B", "A", "simulated laptop", laptops),
                 combine("B", "A", "simulated phone", phones))
    combined = (combine("B", "A", "all devices", phones + laptops),)
    assert per_class[0].verdict == "NO-GO" and per_class[1].verdict == "GO"
    devices = tuple(DeviceOutcome(d, "simulated " + d[4:].split("#")[0], "failed", None, None,
                                  "vm", "lost with its host") for d, _, _ in phones + laptops)
    a = FleetAnalysis(tmp_path / "fleet-x", FleetPlan("x", "x.toml", tuple(
        d.device for d in devices), 0.0), devices, combined, per_class, 1)
    lines = text_lines(a)
    assert lines[1].startswith("NO-GO on simulated laptop: B vs A NO-GO: ratio 0.805")
    assert lines[2].startswith("B vs A across devices: INCONCLUSIVE")
    md = markdown(a)
    assert md.index("## NO-GO") < md.index("## Across devices") < md.index("## Per device")
    assert "| sim:laptop#1 | simulated laptop | vm | failed | failed: lost with its host |" in md
    page = html_page(a)
    assert page.index("<h2>NO-GO</h2>") < page.index("<h2>Across devices</h2>")
    j = to_json(a)
    assert [c["scope"] for c in j["no_go_classes"]] == ["simulated laptop"]
    assert j["exit_status"] == 1 and j["devices"][0]["decisions"] == []
