"""The decode-kernel diagnostics of ``calibration.fit_public`` that docs/calibration.md cites:
what they establish about TensorRT-LLM's public kernel tables, checked on the tables."""

from __future__ import annotations

import pytest

from tests.conftest import SHARED_DATA as DATA
from tests.conftest import needs_kernel_tables


@needs_kernel_tables
def test_a100_tables_stream_faster_than_hbm_h100_never() -> None:
    """A decode kernel reading its KV from HBM streams it at most at the HBM's bandwidth. The
    A100 tables have XQA rows of 64 MB of KV or more above that (up to 1.69 x 2.04 TB/s),
    most of the A100 XQA fit's worst decile; the H100's never (at most 0.93 x)."""
    from calibration.fit_public import decode_rows_over_roofline

    a100 = decode_rows_over_roofline(DATA, "a100-80gb").set_index(["kernel", "kv"])
    xqa = a100.loc[("trtllm", "bf16")]
    assert xqa["over_hbm"] == 298 and xqa["max_share_of_hbm"] > 1.6
    beyond, of = (int(x) for x in xqa["over_hbm_beyond_p90"].split(" of "))
    assert beyond > of / 2
    h100 = decode_rows_over_roofline(DATA, "h100-sxm")
    assert (h100["over_hbm"] == 0).all() and (h100["max_share_of_hbm"] < 1.0).all()


@needs_kernel_tables
def test_no_masked_mha_fallback_in_the_xqa_tables() -> None:
    """Where TensorRT-LLM's mayHavePerfGain rule would refuse XQA, the FP8 rows at head dim
    128-256 follow the XQA fit (0.9-1.0 x) and run at most 0.7 x what masked MHA would
    take: the tables timed XQA there. The FP8 head-dim-64 excess is on both sides of the
    rule (> 1.1 x the XQA fit)."""
    from calibration.fit_public import xqa_fallback_ratios

    t = xqa_fallback_ratios(DATA, "h100-sxm")
    for d in (128, 256):
        refused = t.loc[("fp8", d, False)]
        assert 0.9 <= refused["ratio_xqa"] <= 1.0 and refused["ratio_mmha"] <= 0.7
    assert t.loc[("fp8", 64, False)]["ratio_xqa"] > 1.1
    assert t.loc[("fp8", 64, True)]["ratio_xqa"] > 1.1


@needs_kernel_tables
def test_layout_rows_name_the_kernel_tensorrt_llm_runs(capsys) -> None:
    """Llama-3-70B's TP8 shard (8 query heads, 1 KV head) decodes on XQA, vanilla MHA on
    masked MHA; a GPU without tables is a one-line usage error."""
    from calibration.fit_public import main, trtllm_layout_rows

    assert set(trtllm_layout_rows(DATA, "h100-sxm", 8, 1, 128)["kernel"]) == {"trtllm"}
    assert set(trtllm_layout_rows(DATA, "h100-sxm", 32, 32, 128)["kernel"]) == {"trtllm-mmha"}
    with pytest.raises(SystemExit) as err:
        main(["--data", str(DATA), "--trtllm-layout", "l40s", "8", "1", "128"])
    assert err.value.code == 2
    assert "has no kernel tables" in capsys.readouterr().err
