"""Catalogs: every id loads, shapes and parameter counts match the published models,
and the GPU table agrees with NVIDIA AIConfigurator's system specs."""

from __future__ import annotations

import pytest
import yaml

from disaggsim.catalog import GPU_IDS, MODEL_IDS, get_gpu, get_model, load_gpus, load_models
from disaggsim.errors import UserError
from disaggsim.hardware.profile import load_profile
from tests.conftest import SHARED_DATA as DATA

AIC_SYSTEMS = DATA / "kernels" / "aiconfigurator" / "systems"


def test_ids_are_exactly_the_published_ones():
    assert MODEL_IDS == (
        "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
        "opt-13b", "opt-66b", "mistral-7b", "qwen2-72b",
        "deepseek-v3", "deepseek-r1", "qwen3-235b-a22b", "qwen3-30b-a3b",
        "gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b", "llama-3.1-405b", "llama-4-maverick",
        "llama-3.1-8b", "llama-3.1-70b", "mixtral-8x22b", "llama-4-scout",
    )  # fmt: skip
    assert GPU_IDS == (
        "a100-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200", "l40s", "h800-sxm",
    )  # fmt: skip
    assert tuple(load_models()) == MODEL_IDS
    assert tuple(load_gpus()) == GPU_IDS


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_every_model_loads(model_id):
    m = get_model(model_id)
    assert m.id == model_id
    assert m.num_heads % m.num_kv_heads == 0
    assert get_model(m) is m


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_every_gpu_loads_and_its_profile_validates(gpu_id):
    g = get_gpu(gpu_id)
    prof = load_profile(gpu_id)
    assert prof.gpu == gpu_id
    # the shipped profile's peaks are the catalog's datasheet peaks
    assert prof.peaks.bf16_flop_per_s == g.bf16_flop_per_s
    assert prof.peaks.fp8_flop_per_s == g.fp8_flop_per_s
    assert prof.peaks.hbm_bytes_per_s == g.hbm_bytes_per_s
    assert prof.peaks.hbm_bytes == g.hbm_bytes


@pytest.mark.parametrize(
    "model_id, billions",
    [  # published parameter counts (model cards / HF safetensors totals)
        ("llama-2-7b", 6.74),
        ("llama-2-70b", 68.98),
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.55),
        ("opt-13b", 12.85),
        ("opt-66b", 65.7),
        ("mistral-7b", 7.24),
        ("qwen2-72b", 72.71),
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
    ],
)
def test_parameter_counts_match_published(model_id, billions):
    assert get_model(model_id).num_params / 1e9 == pytest.approx(billions, rel=0.002)


def test_llama_2_7b_parameter_count_by_hand():
    # 32 layers × (4 × 4096² attention + 3 × 4096 × 11008 MLP + 2 × 4096 norms)
    # + 2 × 32000 × 4096 (embedding, untied LM head) + 4096 final norm
    per_layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert get_model("llama-2-7b").num_params == 32 * per_layer + 2 * 32000 * 4096 + 4096


def test_kv_bytes_per_token_seed_facts():
    # 70B shape: 2 × 80 layers × 8 KV heads × 128 × 2 bytes
    for mid in ("llama-2-70b", "llama-3-70b", "qwen2-72b"):
        m = get_model(mid)
        assert m.kv_bytes_per_token("fp16") == 327_680
        assert m.kv_bytes_per_token("bf16") == 327_680
        assert m.kv_bytes_per_token("fp8") == 163_840
    # an 8k-token prompt hands off 2.5 GiB (8192 × 327680 = 2.5 × 2**30)
    assert get_model("llama-3-70b").kv_bytes_per_token() * 8192 == 2.5 * 2**30
    # MHA models: llama-2-7b 2 × 32 × 32 × 128 × 2
    assert get_model("llama-2-7b").kv_bytes_per_token() == 524_288


def test_weights_bytes():
    m = get_model("llama-3-70b")
    assert m.weights_bytes("bf16") == 2 * m.num_params
    assert m.weights_bytes("fp8") == m.num_params
    assert 140e9 < m.weights_bytes("bf16") < 142e9


def test_gpu_units_converted_to_si():
    a100 = get_gpu("a100-80gb")
    assert a100.bf16_flop_per_s == 312e12
    assert a100.fp8_flop_per_s == 0 and not a100.has_fp8
    assert a100.hbm_bytes == 81920 * 2**20  # nvidia-smi MiB
    assert a100.hbm_bytes_per_s == 2.039e12
    assert a100.nic_bytes_per_s == 25e9  # 200 Gb/s HDR
    assert get_gpu("h200-sxm").hbm_bytes == 143771 * 2**20
    assert get_gpu("h100-sxm").nic_bytes_per_s == 50e9  # 400 Gb/s NDR
    assert get_gpu("l40s").nvlink_bytes_per_s == 0


def test_cuda_total_is_what_engines_size_kv_from():
    """``usable_bytes`` is CUDA's total (gpus.yaml ``cuda_mib``, read from public logs), below
    nvidia-smi's ``hbm_mib`` on every catalog GPU; by hand for three of them."""
    assert get_gpu("h100-sxm").usable_bytes == 81090 * 2**20
    assert get_gpu("a100-80gb").usable_bytes == 81049 * 2**20
    assert get_gpu("l40s").usable_bytes == 45589 * 2**20
    for gpu_id in GPU_IDS:
        g = get_gpu(gpu_id)
        assert 0.98 * g.hbm_bytes < g.usable_bytes < g.hbm_bytes


def _gpus_with(monkeypatch, ident: str, **entry):
    """The GPU catalog loaded with ``ident``'s entry changed (keys set, None: removed)."""
    import disaggsim.catalog as catalog

    path, raw = catalog._read_yaml("gpus.yaml")
    raw = {k: dict(v) for k, v in raw.items()}
    for key, value in entry.items():
        if value is None:
            raw[ident].pop(key, None)
        else:
            raw[ident][key] = value
    monkeypatch.setattr(catalog, "_read_yaml", lambda name: (path, raw))
    return catalog.load_gpus.__wrapped__()


def test_gpu_without_cuda_total_takes_the_stated_offset(monkeypatch):
    from disaggsim.catalog import CUDA_RESERVED_MIB

    assert CUDA_RESERVED_MIB == 583  # the median of 469, 479, 551, 615, 717, 871 MiB
    gpus = _gpus_with(monkeypatch, "h200-sxm", cuda_mib=None)
    assert gpus["h200-sxm"].usable_bytes == (143771 - 583) * 2**20


@pytest.mark.parametrize("bad", [0, 143772, -5])
def test_bad_cuda_total_is_one_line_naming_file_and_field(monkeypatch, bad):
    with pytest.raises(UserError) as e:
        _gpus_with(monkeypatch, "h200-sxm", cuda_mib=bad)
    msg = str(e.value)
    assert "\n" not in msg and "gpus.yaml: h200-sxm.cuda_mib: must be" in msg
    assert f"got {bad}" in msg


@pytest.mark.parametrize("bad", ["llama-3-405b", "", "Llama-3-70B"])
def test_unknown_model_lists_allowed(bad):
    with pytest.raises(UserError, match="allowed: llama-2-7b, llama-2-70b") as e:
        get_model(bad)
    assert "\n" not in str(e.value)


def test_unknown_gpu_lists_allowed():
    with pytest.raises(UserError, match="unknown GPU 'v100'.*a100-80gb, h100-sxm"):
        get_gpu("v100")


# An unknown id that resembles catalog ids gets a hint; the id is never substituted.
@pytest.mark.parametrize(
    ("kind", "name", "hint"),
    [
        ("model", "meta-llama/Llama-3.1-8B-Instruct", " (did you mean llama-3.1-8b?)"),
        ("model", "LLAMA-3.1-8B", " (did you mean llama-3.1-8b?)"),
        ("model", "meta-llama/Meta-Llama-3-70B-Instruct", " (did you mean llama-3-70b?)"),
        ("model", "Qwen2-72B-Instruct", " (did you mean qwen2-72b?)"),
        ("model", "llama3.1-8b", " (did you mean llama-3.1-8b?)"),
        ("model", "llama-3", " (did you mean llama-3-8b or llama-3-70b?)"),
        ("model", "mixtral-8x13b", ""),  # another size: no hint
        ("model", "mistralai/Mixtral-8x22B-Instruct-v0.1", " (did you mean mixtral-8x22b?)"),
        ("model", "llama-9", ""),
        ("gpu", "H100", " (did you mean h100-sxm or h100-pcie?)"),
        ("gpu", "NVIDIA H100 80GB HBM3", " (did you mean h100-sxm?)"),
        ("gpu", "h200", " (did you mean h200-sxm?)"),
        ("gpu", "a100-40gb", ""),  # other memory: no hint
        ("gpu", "v100", ""),
    ],
)
def test_unknown_id_hint(kind, name, hint):
    get = get_model if kind == "model" else get_gpu
    with pytest.raises(UserError) as e:
        get(name)
    message = str(e.value)
    assert "allowed: " in message and "\n" not in message
    if hint:
        assert message.endswith(hint)
    else:
        assert "did you mean" not in message


AIC_FILE = {
    "a100-80gb": "a100_sxm.yaml",
    "h100-sxm": "h100_sxm.yaml",
    "h100-pcie": "h100_pcie.yaml",
    "h200-sxm": "h200_sxm.yaml",
    "b200": "b200_sxm.yaml",
    "l40s": "l40s.yaml",
}


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_gpu_peaks_agree_with_aiconfigurator_systems(gpu_id):
    if gpu_id not in AIC_FILE:
        pytest.skip(f"AIConfigurator has no system file for {gpu_id}")
    path = AIC_SYSTEMS / AIC_FILE[gpu_id]
    if not path.is_file():
        pytest.skip(f"{path} absent: public AIConfigurator system specs not available")
    aic = yaml.safe_load(path.read_text())
    g = get_gpu(gpu_id)
    assert g.bf16_flop_per_s == pytest.approx(aic["gpu"]["bfloat16_tc_flops"], rel=0.001)
    assert g.fp8_flop_per_s == pytest.approx(aic["gpu"].get("fp8_tc_flops", 0), rel=0.001)
    assert g.hbm_bytes_per_s == pytest.approx(aic["gpu"]["mem_bw"], rel=0.001)
    # capacity: nvidia-smi MiB vs AIC's round GiB figures, within 2%
    assert g.hbm_bytes == pytest.approx(aic["gpu"]["mem_capacity"], rel=0.02)
    assert g.gpus_per_node == aic["node"]["num_gpus_per_node"]
    if g.nvlink_bytes_per_s > 0:
        assert g.nvlink_bytes_per_s == aic["node"]["intra_node_bw"]
    # host link and NIC per GPU, per direction (B200: PCIe Gen6 128 GB/s, 800 Gb/s CX8)
    assert g.pcie_bytes_per_s == aic["node"]["pcie_bw"]
    assert g.nic_bytes_per_s == aic["node"]["inter_node_bw"]
    if "fp4_tc_flops" in aic["gpu"]:
        assert g.fp4_flop_per_s == aic["gpu"]["fp4_tc_flops"]
