"""Notes on an unset ``workload.max_tokens`` (disaggsim.cap_notes): the default cap, the
model's context less the prompt, refuses requests, holds them at a kv_aware router (with
a reserve as large as the cap) and moves a comparison; the run, the plan and the comparison say so, and say nothing when the
clients' cap is given."""

from __future__ import annotations

import numpy as np
import yaml

from disaggsim.cap_notes import default_caps, plan_cap_note, rejections_note, scenario_cap_note
from disaggsim.cli import main
from disaggsim.config.loader import load_scenario
from disaggsim.plan.analytic import sample_requests
from disaggsim.plan.search import _cap_note
from disaggsim.run import make_requests


def _write(tmp_path, name, doc):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _colocated_70b(max_tokens=None):
    """Llama-3.1-70B (context 131,072) on two A100 TP2 workers: about 44k tokens of KV
    per worker, so a whole-context cap never fits."""
    wl = {
        "kind": "synthetic",
        "rate_per_s": 1.0,
        "arrival": "poisson",
        "prompt_tokens": {"dist": "fixed", "value": 1000},
        "output_tokens": {"dist": "fixed", "value": 200},
    }
    if max_tokens is not None:
        wl["max_tokens"] = max_tokens
    return {
        "name": "colo-70b",
        "seed": 1,
        "model": "llama-3.1-70b",
        "architecture": "colocated",
        "pool": {"gpu": "a100-80gb", "num_workers": 2, "tp": 2, "scheduler": "chunked"},
        "slo": {"ttft_ms": 2000, "itl_ms": 100},
        "workload": wl,
        "sim": {"duration_s": 30, "warmup_s": 5},
    }


def _disaggregated_8b(max_tokens=None):
    """Llama-3.1-8B (context 131,072), one prefill and one decode H100 worker at a load
    far under their capacity once each request's cap is its reply."""
    wl = {
        "kind": "synthetic",
        "rate_per_s": 20.0,
        "arrival": "poisson",
        "prompt_tokens": {"dist": "fixed", "value": 128},
        "output_tokens": {"dist": "fixed", "value": 64},
    }
    if max_tokens is not None:
        wl["max_tokens"] = max_tokens
    return {
        "name": "disagg-8b",
        "seed": 1,
        "model": "llama-3.1-8b",
        "architecture": "disaggregated",
        "prefill_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1},
        "decode_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1},
        "fabric": {"link": "nvlink"},
        "slo": {"ttft_ms": 500, "itl_ms": 50},
        "workload": wl,
        "sim": {"duration_s": 20, "warmup_s": 2},
    }


def _notes(capsys):
    return [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]


def _run(path, out):
    return main(["run", str(path), "--out", str(out), "--quiet", "--no-plots"])


def test_run_says_why_every_request_was_refused(tmp_path, capsys):
    path = _write(tmp_path, "colo", _colocated_70b())
    assert _run(path, tmp_path / "a") == 0
    refused, cap = _notes(capsys)
    assert refused.startswith("note: refused or abandoned by reason: exceeds_kv_capacity ")
    assert cap.startswith(
        "note: workload.max_tokens is not set, so each request's cap is llama-3.1-70b's "
        "context (131,072 tokens) less its prompt: "
    )
    assert "were refused as exceeds_kv_capacity" in cap and "workload.max_tokens" in cap
    # the clients' cap given: every request fits, nothing refused, no note
    path = _write(tmp_path, "colo-capped", _colocated_70b(max_tokens=200))
    assert _run(path, tmp_path / "b") == 0
    assert _notes(capsys) == []


def test_run_says_kv_aware_back_pressure_held_requests(tmp_path, capsys):
    # promised its 512-token reserve, no request is held at this load: no note
    path = _write(tmp_path, "disagg-reserve", _disaggregated_8b())
    assert _run(path, tmp_path / "r") == 0
    assert _notes(capsys) == []
    # a reserve as large as the cap (the whole-context promise) holds requests
    doc = _disaggregated_8b()
    doc["router"] = {"reserved_decode_tokens": 131_072}
    path = _write(tmp_path, "disagg", doc)
    assert _run(path, tmp_path / "a") == 0
    (cap,) = _notes(capsys)
    assert (
        "kv_aware back-pressure promised each request decode KV for prompt + "
        "min(cap, 131,072 reply tokens) and held up to " in cap
    )
    path = _write(tmp_path, "disagg-capped", _disaggregated_8b(max_tokens=64))
    assert _run(path, tmp_path / "b") == 0
    assert _notes(capsys) == []


def test_default_caps_tells_filled_from_given(tmp_path):
    loaded = load_scenario(_write(tmp_path, "a", _colocated_70b()))
    reqs = make_requests(loaded)  # filled by with_context
    assert reqs.max_tokens is not None and default_caps(loaded.scenario, reqs)
    given = load_scenario(_write(tmp_path, "b", _colocated_70b(max_tokens=200)))
    assert not default_caps(given.scenario, make_requests(given))
    # one request with a cap of its own below the context: not the default
    caps = reqs.max_tokens.copy()
    caps[0] -= 1
    assert not default_caps(loaded.scenario, reqs.with_max_tokens(np.maximum(caps, 200)))


def test_plan_and_compare_notes(tmp_path, capsys):
    loaded = load_scenario(_write(tmp_path, "d", _disaggregated_8b()))
    (line,) = _cap_note(loaded, sample_requests(loaded))
    assert line == plan_cap_note(loaded.scenario)
    assert "kv_aware back-pressure" in line and "min(cap, 512 reply tokens)" in line
    capped = load_scenario(_write(tmp_path, "c", _disaggregated_8b(max_tokens=64)))
    assert _cap_note(capped, sample_requests(capped)) == ()
    # the colocated scenario has no back-pressure: its note names only the admission check
    colo = load_scenario(_write(tmp_path, "e", _colocated_70b())).scenario
    assert "kv_aware" not in scenario_cap_note(colo)
    assert "admission refuses requests" in scenario_cap_note(colo)
    assert "kv_aware back-pressure" in scenario_cap_note(loaded.scenario)


def test_compare_prints_the_note_per_uncapped_scenario(tmp_path, capsys):
    from disaggsim.cli.compare import _print_cap_notes

    a = _write(tmp_path, "a", _disaggregated_8b())
    b = _write(tmp_path, "b", _disaggregated_8b(max_tokens=64))
    _print_cap_notes([(p.name, load_scenario(p)) for p in (a, b)])
    (line,) = _notes(capsys)
    assert line.startswith("note: a.yaml: workload.max_tokens is not set")


def test_rejections_note_lists_reasons_in_order():
    class S:
        num_reason = {"queue_full": 3, "exceeds_context": 1, "client_timeout": 0}

    assert rejections_note(S()) == (
        "note: refused or abandoned by reason: exceeds_context 1, queue_full 3 (docs/metrics.md)"
    )

    class Empty:
        num_reason: dict = {}

    assert rejections_note(Empty()) is None
