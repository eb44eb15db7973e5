"""report.html of `plan --out` and `compare --out` (issue 12, item 7): self-contained
(every image inline), well-formed, every embedded image decodes; where Debian's chromium
is installed it renders headless to a screenshot that is not blank."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from disaggsim.cli import main
from disaggsim.html_report import CONFIRMATION_MISSING, Page, plan_report
from tests.conftest import REPO

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "wbr", "source"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Checker(HTMLParser):
    """Tracks nesting (every non-void element closed in order), images and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.images: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
        for key in ("src", "href"):
            v = a.get(key)
            if v and not v.startswith("data:"):
                self.external.append(v)
        if tag in ("script", "link", "iframe"):
            self.external.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_page(text: str) -> Checker:
    c = Checker()
    c.feed(text)
    c.close()
    assert text.startswith("<!DOCTYPE html>")
    assert not c.errors, c.errors[:3]
    assert c.stack == [], c.stack
    assert not c.external, c.external  # self-contained
    from PIL import Image

    for src in c.images:
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64"
        png = base64.b64decode(data, validate=True)
        assert png.startswith(PNG_MAGIC)
        with Image.open(io.BytesIO(png)) as im:
            im.load()
            assert im.width > 100 and im.height > 100
    return c


def _words(c: Checker) -> str:
    return " ".join(" ".join(c.text).split())


@pytest.fixture(scope="module")
def plan_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "out"
    path = REPO / "scenarios" / "advisor" / "pcie-only.yaml"
    argv = [
        "plan",
        str(path),
        "--gpus",
        "2",  # a small budget keeps the search (and the report) small
        "--quick",
        "--min-requests",
        "60",
        "--service-multiple",
        "0.5",
        "--workers",
        "1",
        "--quiet",
    ]
    assert main([*argv, "--price-per-gpu-hour", "2.5", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def compare_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    ci = REPO / "scenarios" / "ci"
    argv = [
        "compare",
        str(ci / "disaggregated.yaml"),
        str(ci / "chunked.yaml"),
        "--param",
        "workload.rate_per_s=0.5:3:3",
        "--set",
        "sim.duration_s=20",
        "--set",
        "sim.warmup_s=2",
        "--rate-hi",
        "12",
        "--workers",
        "1",
        "--quiet",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def test_plan_report_is_self_contained_and_complete(plan_out):
    import json

    plan = json.loads((plan_out / "plan.json").read_text())
    c = check_page((plan_out / "report.html").read_text())
    words = _words(c)
    assert len(c.images) == 2  # goodput per candidate, Pareto front
    assert f"Verdict: {plan['verdict']}" in words
    assert " ".join(plan["reason"].split()) in words
    assert " ".join(plan["slo_model"].split()) in words
    for row in plan["ranked"]:  # the ranked table: every candidate, its goodput per GPU
        assert row["label"] in words
        assert f"{row['goodput_per_gpu']:.4g}" in words
    for cond in plan["conditions"]:
        assert cond["name"] in words
    assert "Steady-state confirmation" in words
    # every plan goodput now carries its confirmation run (twice the horizon)
    assert " ".join(CONFIRMATION_MISSING.split()) not in words
    assert "confirm_duration_s" in words and "confirm_attainment" in words
    # the candidates checked as their recommended.yaml runs show that check too
    checked = [row for row in plan["ranked"] if row.get("as_written")]
    assert checked, "the fixture's plan is decided: its compared candidates are checked"
    assert "as_written" in words


def test_compare_report_is_self_contained_and_complete(compare_out):
    import pandas as pd

    g = pd.read_csv(compare_out / "goodput.csv")
    c = check_page((compare_out / "report.html").read_text())
    words = _words(c)
    # goodput bars, Pareto front, and the three sweep plots
    assert len(c.images) == 5
    for name in g["scenario"]:
        assert name in words
    assert "SLO model" in words and "Each measured request is judged on its own" in words
    assert "Steady-state confirmation" in words


def test_confirmation_data_is_rendered_when_present(plan_out):
    from disaggsim.plan import PlanOptions, plan
    from disaggsim.plan.report import plan_json
    from disaggsim.sweep import SerialExecutor

    with SerialExecutor() as ex:
        res, advice = plan(
            REPO / "scenarios" / "advisor" / "two-gpus.yaml",
            options=PlanOptions.quick(),
            executor=ex,
        )
    d = plan_json(res, advice)
    d["confirmation"] = {"rate_per_s": 1.25, "duration_s": 600.0, "slo_attainment": 0.931}
    words = _words(check_page(plan_report(res, advice, d)))
    assert "rate_per_s 1.25" in words and "slo_attainment 0.931" in words
    assert " ".join(CONFIRMATION_MISSING.split()) not in words
    # a quick plan's confirmation (Confirmation.as_dict): its lists of candidates are
    # tables of their own, one row each, never a list's repr
    from disaggsim.plan.search import Candidate, Confirmation

    pair = Candidate("disaggregate", 1, 1, 1, 1, max_batch_seqs=1024)
    chunked = Candidate("colocate_chunked", 2, 1, chunk_tokens=2048)
    d["confirmation"] = Confirmation(
        doubt="within its error", quick_gain=0.04,
        remeasured=((chunked, 470.73, 471.17),), num_simulations=92,
        options=PlanOptions(), walked_on=("vllm tp1", "vllm tp2"), climbed=((pair, 520.73),),
    ).as_dict()  # fmt: skip
    words = _words(check_page(plan_report(res, advice, d)))
    assert "'label'" not in words and "[" not in words
    assert f"{chunked.label} colocate_chunked 471 471" in words  # quick, full (3 digits)
    assert f"climbed label kind goodput_per_gpu {pair.label} disaggregate 521" in words
    assert "walked_on vllm tp1, vllm tp2" in words and "left_over none" in words
    assert "at_full_accuracy yes" in words
    # per-candidate confirmation fields are gathered into one table
    d.pop("confirmation")
    d["ranked"][0]["confirmed_goodput_per_s"] = 0.777
    words = _words(check_page(plan_report(res, advice, d)))
    assert "confirmed_goodput_per_s" in words and "0.777" in words


def test_page_escapes_text():
    p = Page("a <b> & c", "x\"y'")
    p.table(["<th>"], [["<td>&"]])
    text = p.render("<footer>")
    assert "a &lt;b&gt; &amp; c" in text and "&lt;td&gt;&amp;" in text
    check_page(text)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
@pytest.mark.parametrize("which", ["plan", "compare"])
def test_report_renders_headless_and_is_not_blank(which, plan_out, compare_out, tmp_path):
    from PIL import Image, ImageStat

    report = (plan_out if which == "plan" else compare_out) / "report.html"
    shot = tmp_path / "shot.png"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1100,1800",
        report.as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        grey = rgb.convert("L")
        # not blank: a good share of non-white pixels, many colours (text + plots)
        hist = grey.histogram()
        non_white = 1 - sum(hist[250:]) / (grey.width * grey.height)
        assert non_white > 0.05, non_white
        assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 100
        assert ImageStat.Stat(grey).stddev[0] > 20
