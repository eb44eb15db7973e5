"""The decode-kernel diagnostics of ``calibration.fit_public`` that docs/calibration.md cites:
what they establish about TensorRT-LLM's public kernel tables, checked on the tables."""

from __future__ import annotations

import pytest

from tests.conftest import SHARED_DATA as DATA
from tests.conftest import needs_kernel_tables


@needs_kernel_tables
def test_a100_tables_stream_faster_than_hbm_h100_never() -> None:
    """A decode kernel reading its KV from HBM streams it at most at the HBM's bandwidth. The
    A100 tables have XQA rows of 64 MB of KV or more above that counting K and V (up to
    1.69 x 2.04 TB/s; 230 of the 307 rows beyond the fit's 90th percentile until the fit
    read them in their table's frame, none since); the H100's never (at most 0.93 x)."""
    from calibration.fit_public import decode_rows_over_roofline

    a100 = decode_rows_over_roofline(DATA, "a100-80gb").set_index(["kernel", "kv"])
    xqa = a100.loc[("trtllm", "bf16")]
    assert xqa["over_hbm"] == 298 and xqa["max_share_of_hbm"] > 1.6
    beyond, of = (int(x) for x in xqa["over_hbm_beyond_p90"].split(" of "))
    assert beyond == 0 and of > 300
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


def test_table_hbm_share_by_collector_layout() -> None:
    """AIConfigurator's TensorRT-LLM decode tables before its 1.3.0rc20 collector timed a
    K-only cache (CacheType.SELFKONLY): XQA rows read half their KV bytes from HBM; masked
    MHA (K and V in two passes) and the 1.3.0rc20 tables (CacheType.SELF) read them all;
    other frameworks' tables too. Rows of two tables or two kernels are refused."""
    import pandas as pd

    from calibration.fit_public import _table_version, peaks_of, table_hbm_share, table_peaks

    assert _table_version("aiconfigurator/h100_sxm/attention/trtllm/1.3.0rc20/g.parquet") == (1, 3)
    assert _table_version("aiconfigurator/a100_sxm/attention/trtllm/1.0.0/g.parquet") == (1, 0, 0)

    def rows(table: str, fw: str, heads: list[float]) -> pd.DataFrame:
        n = len(heads)
        return pd.DataFrame(
            {"table": [table] * n, "framework": [fw] * n, "heads": heads,
             "kv_heads": [8.0] * n, "head_dim": [128.0] * n}
        )  # fmt: skip

    old = "aiconfigurator/a100_sxm/attention/trtllm/1.0.0/generation_attention_perf.parquet"
    new = "aiconfigurator/h100_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf.parquet"
    assert table_hbm_share(rows(old, "trtllm", [64.0, 32.0])) == 0.5  # XQA (8 and 4 per KV)
    assert table_hbm_share(rows(old, "trtllm", [8.0])) == 1.0  # vanilla MHA: masked MHA
    assert table_hbm_share(rows(new, "trtllm", [64.0])) == 1.0
    assert table_hbm_share(rows(old.replace("trtllm", "vllm"), "vllm", [64.0])) == 1.0
    with pytest.raises(ValueError, match="two|tables"):
        table_hbm_share(pd.concat([rows(old, "trtllm", [64.0]), rows(new, "trtllm", [64.0])]))
    with pytest.raises(ValueError, match="XQA and masked MHA"):
        table_hbm_share(rows(old, "trtllm", [64.0, 8.0]))
    pk = peaks_of("a100-80gb")
    assert table_peaks(pk, rows(old, "trtllm", [64.0])).hbm_bytes_per_s == 2 * pk.hbm_bytes_per_s
    assert table_peaks(pk, rows(new, "trtllm", [64.0])) == pk


@needs_kernel_tables
def test_k_only_table_frame_explains_the_rows_over_hbm() -> None:
    """Counted in the bytes its kernel read from HBM, no A100 XQA row streams faster than
    the HBM (298 do counting K and V, up to 1.69 x); the A100's masked-MHA rows over it
    (50) all hold at most 256 tokens a sequence: the K of the blocks in flight fits the
    40 MB L2, so its V pass (K's addresses in a K-only cache) hits L2 there and nowhere
    else."""
    import numpy as np

    from calibration import public
    from calibration.fit_public import (
        TRTLLM_PER_QUERY_HEAD_BACKEND,
        _decode_backend_rows,
        decode_rows_over_roofline,
    )

    t = decode_rows_over_roofline(DATA, "a100-80gb").set_index(["kernel", "kv"])
    xqa = t.loc[("trtllm", "bf16")]
    assert xqa["over_hbm"] == 298 and xqa["over_hbm_as_timed"] == 0
    assert 0.8 < xqa["max_share_as_timed"] < 1.0
    mmha = t.loc[(TRTLLM_PER_QUERY_HEAD_BACKEND, "bf16")]
    assert mmha["over_hbm_as_timed"] == mmha["over_hbm"] == 50
    r = _decode_backend_rows(public.aic_decode_attention(DATA, "a100-80gb"), "trtllm-mmha")
    kv = 2.0 * r["context_tokens"] * r["kv_heads"] * r["head_dim"] * 2.0
    over = (kv >= 64e6) & (kv / r["t_s"] / 2.039e12 > 1.0)
    per_seq = (r["context_tokens"] / r["batch"])[over]
    assert over.sum() == 50 and np.all(per_seq <= 257)
