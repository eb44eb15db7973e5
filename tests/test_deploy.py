"""Launch configurations for the recommended deployment (issue 12, item 6): every flag,
environment variable and YAML field the vLLM, SGLang and Dynamo files use is in the
checked-in list taken from those projects' docs (disaggsim/plan/deploy_flags.yaml), each
file names those docs, the scripts are valid bash, and the files describe the deployment
the plan recommended (instances, TP, roles, nodes)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from disaggsim.config.loader import load_scenario
from disaggsim.plan import PlanOptions, plan
from disaggsim.plan.deploy import DEPLOY_FILES, SOURCES, launch_configs, weight_serving
from disaggsim.plan.search import Candidate, CandidateResult
from disaggsim.sweep import SerialExecutor
from tests.conftest import REPO

FLAGS = yaml.safe_load((REPO / "disaggsim" / "plan" / "deploy_flags.yaml").read_text())


@pytest.fixture(scope="module")
def planned():
    """A real (quick) plan result on H100 for llama-3-70b; candidates are swapped in."""
    with SerialExecutor() as ex:
        return plan(
            REPO / "scenarios" / "advisor" / "two-gpus.yaml",
            options=PlanOptions.quick(),
            executor=ex,
        )


def configs(planned, cand: Candidate, overrides: list[str] | None = None) -> dict[str, str]:
    res, advice = planned
    if overrides:
        loaded = load_scenario(res.loaded.raw, overrides, base_dir=res.loaded.base_dir)
        res = dataclasses.replace(res, loaded=loaded)
    rec = CandidateResult(cand, 1.0, 1.0 / cand.num_gpus, "found")
    return launch_configs(res, dataclasses.replace(advice, recommended=rec))


CASES = {
    "disagg-in-node": (Candidate("disaggregate", 3, 2, 2, 4), []),
    "disagg-tp16": (Candidate("disaggregate", 1, 8, 1, 16), []),
    "chunked": (Candidate("colocate_chunked", 4, 2, chunk_tokens=512), []),
    "vllm-fp8": (
        Candidate("colocate_vllm", 8, 2),
        ["weight_dtype=fp8", "kv_dtype=fp8"],
    ),
    "disagg-fp8": (Candidate("disaggregate", 2, 2, 1, 4), ["weight_dtype=fp8", "kv_dtype=fp8"]),
}


def shell_commands(script: str) -> list[list[str]]:
    """The commands of a generated script: comments dropped, continuations joined,
    shell keywords and case labels skipped."""
    text = re.sub(r"\\\n\s*", " ", script)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if (
            not line
            or line.startswith("#")
            or line.startswith(":")
            or line in ("wait", ";;", "esac")
        ):
            continue
        if re.fullmatch(r"\d+\)", line) or line.startswith(("case ", "set ", "*)", "MODEL=")):
            continue
        words = shlex.split(line.rstrip("&").strip())
        out.append(words)
    return out


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return env, words


def servers(engine: str, script: str) -> list[dict[str, list[str]]]:
    """Flags of each serving instance's command (not the router or proxy), in order."""
    out = []
    for words in shell_commands(script):
        program, flags = check_command(engine, split_env(list(words))[1])
        if program in ("vllm serve", "python -m sglang.launch_server"):
            out.append(flags)
    return out


def check_command(engine: str, words: list[str]) -> tuple[str, dict[str, list[str]]]:
    """Match the program against the list's commands; every flag listed, every checked
    value allowed. Returns the command and its flags with their values."""
    spec = FLAGS[engine]
    program = next((c for c in spec["commands"] if words[: len(c.split())] == c.split()), None)
    assert program is not None, f"{engine}: command {' '.join(words[:4])} is not in the list"
    rest = words[len(program.split()) :]
    if program == "vllm serve":
        rest = rest[1:]  # the model
    flags: dict[str, list[str]] = {}
    current = None
    for w in rest:
        if w.startswith("--"):
            assert w in spec["commands"][program], f"{engine}: {program} {w} is not in the list"
            current = w
            flags[w] = []
        else:
            assert current is not None, f"{engine}: stray word {w!r}"
            flags[current].append(w)
    for flag, values in flags.items():
        allowed = spec.get("values", {}).get(flag)
        if allowed is not None:
            assert all(v in allowed for v in values), f"{engine}: {flag} {values} not in {allowed}"
        if flag == "--kv-transfer-config":
            cfg = json.loads(values[0])
            for key, v in cfg.items():
                assert v in spec["kv_transfer_config"][key], f"{engine}: {key}={v}"
    return program, flags


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_flag_and_field_is_in_the_documented_list(planned, case):
    cand, overrides = CASES[case]
    files = configs(planned, cand, overrides)
    assert set(files) == set(DEPLOY_FILES)
    for name, engine in (("deploy-vllm.sh", "vllm"), ("deploy-sglang.sh", "sglang")):
        cmds = shell_commands(files[name])
        assert cmds
        for words in cmds:
            env, words = split_env(list(words))
            assert set(env) <= set(FLAGS[engine]["env"]), (name, env)
            check_command(engine, words)
    doc = yaml.safe_load(files["deploy-dynamo.yaml"])
    spec = FLAGS["dynamo"]

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in doc["spec"]["services"]:  # service names are ours to choose
                    assert k in spec["fields"], f"dynamo: field {k} is not in the list"
                allowed = spec["values"].get(k)
                if allowed is not None:
                    assert v in allowed, f"dynamo: {k}: {v} not in {allowed}"
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    for svc in doc["spec"]["services"].values():
        c = svc["extraPodSpec"]["mainContainer"]
        check_command("dynamo", [*c["command"], *c["args"]])


@pytest.mark.parametrize("name, engine", [(n, n.split("-")[1].split(".")[0]) for n in DEPLOY_FILES])
def test_each_file_names_the_docs_it_follows(planned, name, engine):
    text = configs(planned, *CASES["disagg-in-node"])[name]
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert tuple(FLAGS[engine]["sources"]) == SOURCES[engine]
    for url in FLAGS[engine]["sources"]:
        assert url in header


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_are_valid_bash(planned, case, tmp_path):
    for name in ("deploy-vllm.sh", "deploy-sglang.sh"):
        path = tmp_path / name
        path.write_text(configs(planned, *CASES[case])[name])
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_disaggregated_configs_describe_the_deployment(planned):
    files = configs(planned, *CASES["disagg-in-node"])  # 3 prefill x tp2 + 2 decode x tp4
    vllm = [split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"])]
    serve = [(env, check_command("vllm", w)[1]) for env, w in vllm if w[:2] == ["vllm", "serve"]]
    roles = [json.loads(f["--kv-transfer-config"][0])["kv_role"] for _, f in serve]
    assert roles == ["kv_producer"] * 3 + ["kv_consumer"] * 2
    assert [f["--tensor-parallel-size"] for _, f in serve] == [["2"]] * 3 + [["4"]] * 2
    # packed on 8-GPU nodes: 3 x tp2 on node 0, 2 x tp4 on node 1
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in serve] == [
        "0,1",
        "2,3",
        "4,5",
        "0,1,2,3",
        "4,5,6,7",
    ]
    # the proxy sends to every instance's port
    proxy = next(w for _, w in vllm if w[0] == "python")
    p = check_command("vllm", proxy)[1]
    assert len(p["--prefiller-ports"]) == 3 and len(p["--decoder-ports"]) == 2
    # SGLang: the same instances in disaggregation mode, all behind the PD router
    sg = servers("sglang", files["deploy-sglang.sh"])
    assert [s["--disaggregation-mode"] for s in sg] == [["prefill"]] * 3 + [["decode"]] * 2
    routers = [w for w in shell_commands(files["deploy-sglang.sh"]) if "--pd-disaggregation" in w]
    assert len(routers) == 1
    assert routers[0].count("--prefill") == 3 and routers[0].count("--decode") == 2
    # Dynamo: one service per pool, replicas and GPUs per replica
    svcs = yaml.safe_load(files["deploy-dynamo.yaml"])["spec"]["services"]
    assert svcs["VllmPrefillWorker"]["replicas"] == 3
    assert svcs["VllmPrefillWorker"]["resources"]["limits"]["gpu"] == "2"
    assert svcs["VllmDecodeWorker"]["replicas"] == 2
    assert svcs["VllmDecodeWorker"]["subComponentType"] == "decode"


def test_tp_across_nodes_spans_whole_nodes(planned):
    files = configs(planned, *CASES["disagg-tp16"])  # 1 x tp8 prefill, 1 x tp16 decode
    svcs = yaml.safe_load(files["deploy-dynamo.yaml"])["spec"]["services"]
    dec = svcs["VllmDecodeWorker"]
    assert dec["multinode"] == {"nodeCount": 2} and dec["resources"]["limits"]["gpu"] == "8"
    assert "multinode" not in svcs["VllmPrefillWorker"]
    sg = shell_commands(files["deploy-sglang.sh"])
    ranks = [w[w.index("--node-rank") + 1] for w in sg if "--node-rank" in w]
    assert ranks == ["0", "1"]  # the decode instance is launched on both of its nodes
    vl = [w for _, w in (split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"]))]
    decode = [w for w in vl if "kv_consumer" in " ".join(w)]
    assert decode and "--distributed-executor-backend" in decode[0]


def test_fp8_and_chunk_settings_reach_the_engines(planned):
    files = configs(planned, *CASES["vllm-fp8"])
    serve = servers("vllm", files["deploy-vllm.sh"])
    assert len(serve) == 8
    assert all(f["--quantization"] == ["fp8"] and f["--kv-cache-dtype"] == ["fp8"] for f in serve)
    sg = servers("sglang", files["deploy-sglang.sh"])
    assert len(sg) == 8
    assert all(f["--chunked-prefill-size"] == ["-1"] for f in sg)  # whole prompts
    chunked = configs(planned, *CASES["chunked"])
    sg = servers("sglang", chunked["deploy-sglang.sh"])
    assert len(sg) == 4 and all(f["--chunked-prefill-size"] == ["512"] for f in sg)
    vl = [
        check_command("vllm", split_env(list(w))[1])[1]
        for w in shell_commands(chunked["deploy-vllm.sh"])
    ]
    assert all(f["--max-num-batched-tokens"] == ["512"] for f in vl)


# --------------------------------------------------------------- MoE layouts (issue 17)

QWEN_MOE = ["model=qwen3-30b-a3b", "weight_dtype=bf16", "kv_dtype=bf16"]
DSV3 = ["model=deepseek-v3", "weight_dtype=released", "kv_dtype=bf16"]
MOE_CASES = {
    # 2 prefill workers of tp1 x dp4 (experts over their 4 GPUs by default) on node 0,
    # one decode worker of tp2 x dp4 with ep 8 on node 1
    "moe-in-node": (
        Candidate("disaggregate", 2, 1, 1, 2, prefill_dp=4, decode_dp=4, decode_ep=8),
        QWEN_MOE,
    ),
    # DeepSeek-V3: one prefill worker of tp1 x dp8 (node 0), one decode worker of
    # tp1 x dp16 over nodes 1 and 2
    "moe-two-nodes": (
        Candidate("disaggregate", 1, 1, 1, 1, prefill_dp=8, decode_dp=16),
        DSV3,
    ),
}


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_moe_layout_flags_are_in_the_documented_list(planned, case, tmp_path):
    files = configs(planned, *MOE_CASES[case])
    assert set(files) == set(DEPLOY_FILES)
    for name, engine in (("deploy-vllm.sh", "vllm"), ("deploy-sglang.sh", "sglang")):
        for words in shell_commands(files[name]):
            env, words = split_env(list(words))
            assert set(env) <= set(FLAGS[engine]["env"]), (name, env)
            check_command(engine, words)
        path = tmp_path / name
        path.write_text(files[name])
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(files["deploy-dynamo.yaml"])
    for svc in doc["spec"]["services"].values():
        c = svc["extraPodSpec"]["mainContainer"]
        check_command("dynamo", [*c["command"], *c["args"]])


def test_moe_layout_in_one_node_gets_its_degrees(planned):
    files = configs(planned, *MOE_CASES["moe-in-node"])
    vllm = [split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"])]
    serve = [(env, check_command("vllm", w)[1]) for env, w in vllm if w[:2] == ["vllm", "serve"]]
    assert len(serve) == 3  # one vllm serve per worker: DP ranks are engines inside it
    assert [f["--tensor-parallel-size"] for _, f in serve] == [["1"], ["1"], ["2"]]
    assert [f["--data-parallel-size"] for _, f in serve] == [["4"], ["4"], ["4"]]
    # ep = tp x dp everywhere (prefill by default, decode 8 = 2 x 4): vLLM's EP flag
    assert all("--enable-expert-parallel" in f for _, f in serve)
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in serve] == [
        "0,1,2,3",
        "4,5,6,7",
        "0,1,2,3,4,5,6,7",
    ]
    assert not any("--data-parallel-address" in f for _, f in serve)  # one node each
    sg = servers("sglang", files["deploy-sglang.sh"])
    # SGLang's TP size counts all the worker's GPUs; DP attention over dp ranks
    assert [s["--tp-size"] for s in sg] == [["4"], ["4"], ["8"]]
    assert [s["--dp-size"] for s in sg] == [["4"], ["4"], ["4"]]
    assert [s["--ep-size"] for s in sg] == [["4"], ["4"], ["8"]]
    assert all("--enable-dp-attention" in s for s in sg)
    assert [s["--base-gpu-id"] for s in sg] == [["0"], ["4"], ["0"]]
    svcs = yaml.safe_load(files["deploy-dynamo.yaml"])["spec"]["services"]
    dec = svcs["VllmDecodeWorker"]
    assert dec["resources"]["limits"]["gpu"] == "8" and "multinode" not in dec
    args = dec["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--data-parallel-size") + 1] == "4"
    assert "--enable-expert-parallel" in args
    assert svcs["VllmPrefillWorker"]["replicas"] == 2


def test_moe_layout_over_nodes_starts_a_server_per_node(planned):
    files = configs(planned, *MOE_CASES["moe-two-nodes"])
    vllm = [split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"])]
    serve = [(env, check_command("vllm", w)[1]) for env, w in vllm if w[:2] == ["vllm", "serve"]]
    pre, head, rest = serve  # prefill (node 0), decode on node 1 and node 2
    assert pre[1]["--data-parallel-size"] == ["8"] and "--data-parallel-size-local" not in pre[1]
    for _, f in (head, rest):
        assert f["--data-parallel-size"] == ["16"] and f["--tensor-parallel-size"] == ["1"]
        assert f["--data-parallel-size-local"] == ["8"]  # 16 ranks of tp1 on 8-GPU nodes
        assert f["--data-parallel-address"] == ["$NODE_1"]
        assert "--enable-expert-parallel" in f
        assert "--distributed-executor-backend" not in f  # DP ranks, not a TP group: no Ray
    assert "--headless" not in head[1] and "--port" in head[1]
    assert "--headless" in rest[1] and rest[1]["--data-parallel-start-rank"] == ["8"]
    assert head[1]["--data-parallel-rpc-port"] == rest[1]["--data-parallel-rpc-port"]
    # the script dispatches the two decode commands to nodes 1 and 2
    script = files["deploy-vllm.sh"]
    assert script.index("1)\n  # decode") < script.index("2)\n  # decode")
    sg = shell_commands(files["deploy-sglang.sh"])
    dec = [w for w in sg if "decode" in w and "sglang.launch_server" in w]
    assert [w[w.index("--node-rank") + 1] for w in dec] == ["0", "1"]
    for w in dec:
        assert w[w.index("--nnodes") + 1] == "2" and w[w.index("--tp-size") + 1] == "16"
        assert w[w.index("--dp-size") + 1] == "16" and w[w.index("--ep-size") + 1] == "16"
    svcs = yaml.safe_load(files["deploy-dynamo.yaml"])["spec"]["services"]
    d = svcs["VllmDecodeWorker"]
    assert d["multinode"] == {"nodeCount": 2} and d["resources"]["limits"]["gpu"] == "8"
    args = d["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--data-parallel-size") + 1] == "16"


def test_ranks_over_nodes_sit_where_the_fabric_puts_them(planned):
    """A topology fabric of 4-GPU nodes runs a decode worker of tp1 x dp12 on three
    nodes of 4 (the simulation's placement); the catalog's 8-GPU H100 node would have
    given two of 6."""
    cand = Candidate("disaggregate", 1, 1, 1, 1, prefill_dp=4, decode_dp=12)
    files = configs(planned, cand, [*QWEN_MOE, "fabric={kind: topology, gpus_per_node: 4}"])
    assert set(files) == set(DEPLOY_FILES)
    vllm = [split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"])]
    dec = [(env, check_command("vllm", w)[1]) for env, w in vllm if w[:2] == ["vllm", "serve"]][1:]
    assert [f["--data-parallel-size-local"] for _, f in dec] == [["4"], ["4"], ["4"]]
    assert [f.get("--data-parallel-start-rank") for _, f in dec] == [None, ["4"], ["8"]]
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in dec] == ["0,1,2,3"] * 3
    sg = [w for w in shell_commands(files["deploy-sglang.sh"]) if "decode" in w]
    assert [w[w.index("--nnodes") + 1] for w in sg] == ["3"] * 3
    d = yaml.safe_load(files["deploy-dynamo.yaml"])["spec"]["services"]["VllmDecodeWorker"]
    assert d["multinode"] == {"nodeCount": 3} and d["resources"]["limits"]["gpu"] == "4"


def test_ranks_that_do_not_fill_their_last_node_get_vllm_only(planned):
    """tp4 x dp3 on 8-GPU nodes: two ranks on the first node, one on the second (8 + 4,
    as the fabric places whole TP groups), which vLLM takes as a local size per node;
    SGLang's --nnodes and Dynamo's multinode put as many GPUs on every node."""
    from disaggsim.plan.deploy import deployment_of, uneven_nodes

    cand = Candidate("disaggregate", 1, 1, 1, 4, decode_dp=3)
    files = configs(planned, cand, QWEN_MOE)
    assert set(files) == {"deploy-vllm.sh"}
    vllm = [split_env(list(w)) for w in shell_commands(files["deploy-vllm.sh"])]
    dec = [(env, check_command("vllm", w)[1]) for env, w in vllm if w[:2] == ["vllm", "serve"]][1:]
    assert [f["--data-parallel-size-local"] for _, f in dec] == [["2"], ["1"]]
    assert [f.get("--data-parallel-start-rank") for _, f in dec] == [None, ["2"]]
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in dec] == ["0,1,2,3,4,5,6,7", "0,1,2,3"]
    assert all(f["--data-parallel-size"] == ["3"] for _, f in dec)
    res, advice = planned
    loaded = load_scenario(res.loaded.raw, QWEN_MOE, base_dir=res.loaded.base_dir)
    rec = CandidateResult(cand, 1.0, 1.0 / cand.num_gpus, "found")
    dep = deployment_of(
        dataclasses.replace(res, loaded=loaded), dataclasses.replace(advice, recommended=rec)
    )
    assert "8 + 4 GPUs" in (uneven_nodes(dep) or "")


def test_an_ep_degree_vllm_cannot_express_writes_sglang_only(planned):
    from disaggsim.plan.deploy import unsupported

    # tp8 with experts over 4 GPUs (each expert split 2 ways): SGLang --ep-size 4; vLLM's
    # EP degree is always tp x dp
    cand = Candidate("disaggregate", 1, 8, 1, 8, decode_ep=4)
    assert "ep 4 over 8 GPUs" in (unsupported(cand) or "")
    files = configs(planned, cand, QWEN_MOE)
    assert set(files) == {"deploy-sglang.sh"}
    sg = servers("sglang", files["deploy-sglang.sh"])
    assert [s.get("--ep-size") for s in sg] == [None, ["4"]]
    assert all("--dp-size" not in s for s in sg)


# ------------------------------------------- pre-quantised and released weights (issue 17)


def test_weight_serving_by_format_and_release():
    """Which flags and which checkpoint, by hand from the engines' docs: online FP8 from
    a bf16 checkpoint (an FP8-block one would be served block-scaled, not the per-tensor
    FP8 simulated; an mxfp4 one is refused); a pre-quantised format is read
    from the checkpoint (--dtype auto, no --quantization); a format the release is not in
    needs a checkpoint that is."""
    want = {
        ("bf16", "bf16"): ("bfloat16", None, None),
        ("fp16", "bf16"): ("float16", None, None),
        ("fp8", "bf16"): (None, "fp8", None),
        ("released", "bf16"): ("bfloat16", None, None),
        ("fp8-block", "bf16"): ("auto", None, "fp8-block"),
        ("mxfp4", "bf16"): ("auto", None, "mxfp4"),
        ("nvfp4", "bf16"): ("auto", None, "nvfp4"),
        ("released", "fp8-block"): ("auto", None, None),
        ("fp8-block", "fp8-block"): ("auto", None, None),
        ("fp8", "fp8-block"): (None, "fp8", "bf16"),
        ("bf16", "fp8-block"): ("bfloat16", None, "bf16"),
        ("nvfp4", "fp8-block"): ("auto", None, "nvfp4"),
        ("released", "mxfp4-moe"): ("auto", None, None),
        ("mxfp4", "mxfp4-moe"): ("auto", None, None),
        ("fp8", "mxfp4-moe"): (None, "fp8", "bf16"),
        ("bf16", "mxfp4-moe"): ("bfloat16", None, "bf16"),
    }
    for (wd, rel), (dtype, quant, ckpt) in want.items():
        w = weight_serving(wd, rel)
        assert (w.dtype, w.quantization, w.checkpoint) == (dtype, quant, ckpt), (wd, rel)
    with pytest.raises(ValueError, match="weight_dtype 'int4'"):
        weight_serving("int4")
    with pytest.raises(ValueError, match="released_weights 'fp4'"):
        weight_serving("bf16", "fp4")


QWEN_FP8_BLOCK = ["model=qwen3-30b-a3b", "weight_dtype=fp8-block", "kv_dtype=bf16"]


def test_released_fp8_block_checkpoint_is_served_as_it_ships(planned):
    files = configs(planned, *MOE_CASES["moe-two-nodes"])  # deepseek-v3, released weights
    for engine, name in (("vllm", "deploy-vllm.sh"), ("sglang", "deploy-sglang.sh")):
        srv = servers(engine, files[name])
        assert srv and all(f["--dtype"] == ["auto"] and "--quantization" not in f for f in srv)
        assert 'MODEL="${MODEL:-deepseek-ai/DeepSeek-V3}"' in files[name]
        assert "bfloat16" not in files[name]
    doc = yaml.safe_load(files["deploy-dynamo.yaml"])
    for svc in list(doc["spec"]["services"].values())[1:]:
        args = svc["extraPodSpec"]["mainContainer"]["args"]
        assert args[args.index("--model") + 1] == "deepseek-ai/DeepSeek-V3"
        assert args[args.index("--dtype") + 1] == "auto" and "--quantization" not in args


def test_per_tensor_fp8_of_a_block_fp8_release_needs_a_bf16_checkpoint(planned, tmp_path):
    """DeepSeek-V3 ships block-scaled FP8: with --quantization fp8 its checkpoint would be
    served as fp8-block, not the per-tensor FP8 the plan simulated. The scripts quantise a
    bf16 checkpoint online and refuse to start without MODEL; the header says how to
    serve the released one."""
    cand, overrides = MOE_CASES["moe-two-nodes"]
    files = configs(planned, cand, [*overrides, "weight_dtype=fp8"])
    for engine, name in (("vllm", "deploy-vllm.sh"), ("sglang", "deploy-sglang.sh")):
        srv = servers(engine, files[name])
        assert srv and all(f["--quantization"] == ["fp8"] for f in srv)
        assert "plan with weight_dtype fp8-block to serve it as it ships" in files[name]
        path = tmp_path / name
        path.write_text(files[name])
        env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "NODE_0": "127.0.0.1"}
        r = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
        assert r.returncode != 0
        assert "set MODEL to a bf16 checkpoint of deepseek-ai/DeepSeek-V3" in r.stderr
    doc = yaml.safe_load(files["deploy-dynamo.yaml"])
    for svc in list(doc["spec"]["services"].values())[1:]:
        args = svc["extraPodSpec"]["mainContainer"]["args"]
        assert args[args.index("--model") + 1] == "${MODEL}"
        assert args[args.index("--quantization") + 1] == "fp8"


def test_a_format_the_release_lacks_needs_a_checkpoint(planned, tmp_path):
    """qwen3-30b-a3b ships bf16: fp8-block weights need an FP8-block checkpoint; the
    scripts refuse to start without MODEL and name the format."""
    files = configs(planned, Candidate("colocate_vllm", 2, 1), QWEN_FP8_BLOCK)
    for engine, name in (("vllm", "deploy-vllm.sh"), ("sglang", "deploy-sglang.sh")):
        srv = servers(engine, files[name])
        assert len(srv) == 2
        assert all(f["--dtype"] == ["auto"] and "--quantization" not in f for f in srv)
        path = tmp_path / name
        path.write_text(files[name])
        env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "NODE_0": "127.0.0.1"}
        r = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
        assert r.returncode != 0
        assert "set MODEL to a fp8-block checkpoint of Qwen/Qwen3-30B-A3B" in r.stderr
    doc = yaml.safe_load(files["deploy-dynamo.yaml"])
    worker = doc["spec"]["services"]["VllmWorker"]["extraPodSpec"]["mainContainer"]["args"]
    assert worker[worker.index("--model") + 1] == "${MODEL}"
    assert "set MODEL to a fp8-block checkpoint" in files["deploy-dynamo.yaml"]
    for svc in doc["spec"]["services"].values():
        c = svc["extraPodSpec"]["mainContainer"]
        check_command("dynamo", [*c["command"], *c["args"]])


@pytest.mark.parametrize(
    "cand, overrides",
    [
        (Candidate("disaggregate", 3, 2, 2, 4), []),  # all three files
        (Candidate("disaggregate", 1, 1, 1, 4, decode_dp=3), QWEN_MOE),  # uneven: vLLM only
        (Candidate("disaggregate", 1, 8, 1, 8, decode_ep=4), QWEN_MOE),  # ep: SGLang only
    ],
)
def test_report_names_the_launch_files_plan_writes(planned, cand, overrides):
    """report.html's deployment paragraph names exactly the files plan --out writes
    (it said all three for an uneven placement that writes deploy-vllm.sh alone)."""
    from disaggsim.html_report import _launch_files_text

    res, advice = planned
    if overrides:
        loaded = load_scenario(res.loaded.raw, overrides, base_dir=res.loaded.base_dir)
        res = dataclasses.replace(res, loaded=loaded)
    advice = dataclasses.replace(
        advice, recommended=CandidateResult(cand, 1.0, 1.0 / cand.num_gpus, "found")
    )
    written = set(launch_configs(res, advice))
    text = _launch_files_text(res, advice)
    listed = text.split(";")[0]  # the files; the reasons for any left out follow
    assert {name for name in DEPLOY_FILES if name in listed} == written
    if written != set(DEPLOY_FILES):
        assert "only deploy-vllm.sh is written" in text or "are not written" in text
