"""The terminal report: rich on a terminal, plain full-width text anywhere else."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from abbench.analysis.campaign import CampaignAnalysis, analyze
from abbench.report.terminal import print_report

RUN = Path(__file__).resolve().parent / "fixtures" / "runs" / "synthetic"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> CampaignAnalysis:
    run = tmp_path_factory.mktemp("run") / "synthetic"
    shutil.copytree(RUN, run)
    return analyze(run)


def test_off_a_terminal_rich_is_plain_full_width_text(analysis: CampaignAnalysis) -> None:
    piped, plain = io.StringIO(), io.StringIO()
    print_report(analysis, "rich", piped)  # a pipe, a file, a CI log
    print_report(analysis, "plain", plain)
    text = piped.getvalue()
    assert text == plain.getvalue()
    assert "\x1b[" not in text  # no colour codes
    assert max(map(len, text.splitlines())) > 80  # rows and prose whole, not cut at 80
    assert not set("┃━│─╇") & set(text)  # ASCII rules only


def test_on_a_terminal_rich_draws_boxes(analysis: CampaignAnalysis) -> None:
    tty = Terminal()
    print_report(analysis, "rich", tty)
    assert set("│─") & set(tty.getvalue())
