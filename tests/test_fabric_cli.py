"""``disaggsim cost kv`` with the fabric model: path, hops, shards and exposed time."""

from __future__ import annotations

import json

import pytest

from disaggsim.cli import main

TOKENS = 4578  # × 327,680 bytes (llama-3-70b, bf16) = 1.500 GB


def _kv(capsys, extra: str) -> dict:
    rc = main(f"cost kv --model llama-3-70b --tokens {TOKENS} {extra}".split())
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_paths_report_links_hops_and_seed_times(capsys):
    nbytes = TOKENS * 327_680
    nvl = _kv(capsys, "--gpu h100-sxm --path same-node")
    assert (nvl["path"], nvl["hops"], nvl["num_shards"], nvl["link"]) == ("nvlink", 2, 1, "nvlink")
    assert nvl["path_links"] == ["n0.g0.nvlink.out", "n0.g1.nvlink.in"]
    assert nvl["transfer_s"] == pytest.approx(nbytes / 450e9 + 10e-6)
    ib = _kv(capsys, "--gpu h100-sxm --path cross-node-rdma --nic-gbit-per-s 200")
    assert ib["path"] == "rdma" and ib["transfer_s"] == pytest.approx(nbytes / 25e9 + 15e-6)
    st = _kv(capsys, "--path cross-node-staged --nic-gbit-per-s 200")  # no GPU: PCIe Gen4
    assert st["path"] == "staged" and st["hops"] == 4
    assert st["transfer_s"] == pytest.approx(nbytes / 24e9 + 55e-6)
    assert st["exposed_s"] == pytest.approx(st["transfer_s"])  # no prefill given


def test_exposed_time_with_and_without_overlap(capsys):
    # IB at 25 GB/s: 60 ms; a 1 s prefill of 80 layers hides all but 1/80 of it
    on = _kv(
        capsys, "--gpu h100-sxm --path cross-node-rdma --nic-gbit-per-s 200 --prefill-s 1 --overlap"
    )
    serial = on["transfer_s"] - on["latency_s"]
    assert on["exposed_s"] == pytest.approx(serial / 80 + 15e-6, rel=1e-9)
    off = _kv(
        capsys,
        "--gpu h100-sxm --path cross-node-rdma --nic-gbit-per-s 200 --prefill-s 1 --no-overlap",
    )
    assert off["exposed_s"] == pytest.approx(off["transfer_s"])
    # a 20 ms prefill is shorter than the 60 ms transfer: 60 − 20 × 79/80 ms shows
    short = _kv(
        capsys,
        "--gpu h100-sxm --path cross-node-rdma --nic-gbit-per-s 200 --prefill-s 0.02 --overlap",
    )
    assert short["exposed_s"] == pytest.approx(serial - 0.02 * 79 / 80 + 15e-6, rel=1e-9)
    # the link-class mode uses the same formula
    legacy = _kv(capsys, "--link infiniband --prefill-s 1 --overlap")
    assert legacy["path"] is None
    assert legacy["exposed_s"] == pytest.approx((legacy["transfer_s"] - 15e-6) / 80 + 15e-6)


def test_kv_path_errors_are_one_line(capsys):
    rc = main(f"cost kv --model llama-3-70b --tokens {TOKENS} --path same-node --tp 8".split())
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--path same-node with --tp 8: fabric.placement.explicit: node 0 has 8 GPUs" in err
    rc = main(f"cost kv --model llama-3-70b --tokens {TOKENS} --prefill-s -1".split())
    _, err = capsys.readouterr()
    assert rc == 2 and "--prefill-s: must be a finite number >= 0, got -1" in err
