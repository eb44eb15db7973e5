"""Launch configurations for the deployment ``disaggsim plan`` recommends: vLLM and SGLang
launch scripts and an NVIDIA Dynamo ``DynamoGraphDeployment`` (docs/planning.md,
"Deployment configs").

Every flag and field comes from the project's own documentation, at the versions in
:data:`SOURCES` (each written file repeats them in a comment); the checked-in list
``disaggsim/plan/deploy_flags.yaml`` holds every flag these files may use, and a test
checks the emitted files against it.

How disaggsim's deployment maps onto each engine:

- workers are placed on nodes of the fabric's ``gpus_per_node`` (a topology's, else the
  catalog's) in pool order (prefill, then decode), as the simulation placed them: a
  worker inside one node when it fits; the data-parallel ranks of a larger one over
  fresh nodes, whole TP groups per node (the last node may hold fewer: vLLM takes a
  ``--data-parallel-size-local`` per node, SGLang's ``--nnodes`` and Dynamo's
  ``multinode`` cannot, :func:`uneven_nodes`); one TP group beyond a node evenly over
  whole nodes (:mod:`disaggsim.costmodel.tp_layout`);
- TP → ``--tensor-parallel-size`` (vLLM, Dynamo) / ``--tp-size`` (SGLang);
  ``gpu_mem_util`` → ``--gpu-memory-utilization`` / ``--mem-fraction-static``;
  ``max_batch_seqs`` → ``--max-num-seqs`` / ``--max-running-requests``;
- a whole-prompt prefill (disaggregated prefill pool, colocated ``vllm``) gets a token
  budget of at least the longest prompt (``--max-num-batched-tokens`` /
  ``--max-prefill-tokens`` with ``--chunked-prefill-size -1``), so no prompt is split;
  a colocated ``chunked`` pool gets its chunk as the budget;
- weights (:func:`weight_serving`): bf16/fp16 → ``--dtype bfloat16|float16``; FP8
  (per-tensor) → ``--quantization fp8``, which both engines apply online to a bf16
  checkpoint; a pre-quantised format (fp8-block, mxfp4, nvfp4, ``released``) is the
  checkpoint's own: ``--dtype auto`` and no ``--quantization``, since both engines read
  the method from the checkpoint's ``quantization_config`` (vLLM refuses a
  ``--quantization`` that differs from it). When the model's released checkpoint is not
  in the planned format (DeepSeek-V3 in bf16, Qwen3 in fp8-block, anything in nvfp4)
  the scripts need ``MODEL`` set to a checkpoint that is, and say so; FP8 KV →
  ``--kv-cache-dtype fp8`` (vLLM) / ``fp8_e4m3`` (SGLang);
- MoE layouts (a worker of ``tp × dp`` GPUs, experts over ``ep`` of them): vLLM
  ``--tensor-parallel-size tp --data-parallel-size dp`` and ``--enable-expert-parallel``
  when ``ep = tp × dp`` (vLLM's EP degree is always TP × DP; ``ep = 1`` leaves the
  experts tensor-parallel over all GPUs, vLLM's default), a worker over several nodes as
  one ``vllm serve`` per node (``--data-parallel-size-local``, ``--data-parallel-address``,
  ``--data-parallel-rpc-port``; ``--headless --data-parallel-start-rank`` off the head
  node); SGLang ``--tp-size tp × dp --dp-size dp --enable-dp-attention --ep-size ep``
  (its TP size counts every GPU, attention TP = tp-size / dp-size), over nodes with
  ``--nnodes``/``--node-rank``/``--dist-init-addr``; Dynamo passes the vLLM flags through
  and its operator adds the per-node data-parallel flags to a ``multinode`` service. A
  layout with ``1 < ep < tp × dp`` has no vLLM form: only ``deploy-sglang.sh`` is written
  (:func:`unsupported`);
- disaggregated KV transfer: vLLM's ``NixlConnector`` (producer on prefill, consumer on
  decode instances) behind vLLM's example proxy; SGLang ``--disaggregation-mode`` with the
  Mooncake transfer backend behind ``sglang_router`` in PD mode; Dynamo's vLLM workers in
  ``--disaggregation-mode prefill|decode`` with the NIXL connector.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import yaml

from disaggsim.catalog import get_gpu, get_model
from disaggsim.costmodel.tp_layout import TpLayout, tp_layout

if TYPE_CHECKING:
    from disaggsim.config.scenario import PoolConfig, Scenario
    from disaggsim.plan.advisor import Advice
    from disaggsim.plan.search import Candidate, SearchResult

__all__ = [
    "DEPLOY_FILES",
    "SOURCES",
    "Deployment",
    "Instance",
    "WeightServing",
    "deployment_of",
    "effective_ep",
    "launch_configs",
    "uneven_nodes",
    "unsupported",
    "weight_serving",
]

DEPLOY_FILES = ("deploy-vllm.sh", "deploy-sglang.sh", "deploy-dynamo.yaml")

# Where each engine's flag and field names were taken from (kept equal to the sources
# in deploy_flags.yaml by a test).
SOURCES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "https://github.com/vllm-project/vllm/blob/026c83f974fcee0e1887060ebdcc53dc427bacfc"
        "/docs/features/nixl_connector_usage.md",
        "https://docs.vllm.ai/en/latest/serving/engine_args.html",
        "https://github.com/vllm-project/vllm/blob/624b7aff3e997f284b2149b3798099029b916687"
        "/docs/serving/data_parallel_deployment.md",
    ),
    "sglang": (
        "https://github.com/sgl-project/sglang/blob/b36e8e198b71553316b55bce53de6ecf9b3a9a47"
        "/docs/advanced_features/server_arguments.md",
        "https://github.com/sgl-project/sglang/blob/08edc506b2da77e7fa8a6a3a1ec7a704241703d4"
        "/docs/advanced_features/pd_disaggregation.md",
        "https://github.com/sgl-project/sglang/blob/046ed665927fef15969f34e06a2552b721edd063"
        "/docs/advanced_features/router.md",
    ),
    "dynamo": (
        "https://github.com/ai-dynamo/dynamo/blob/0044eb903566e0632bdf7bb7388c967d946643af"
        "/examples/backends/vllm/deploy/disagg-multinode.yaml",
        "https://github.com/ai-dynamo/dynamo/blob/d195d280e13e5532510a1004ad8d8d06f2f8266a"
        "/components/src/dynamo/vllm/backend_args.py",
        "https://github.com/ai-dynamo/dynamo/blob/000a36a7399ab3fa8e27d9537d8b1f5020e34db4"
        "/components/src/dynamo/vllm/args.py",
        "https://github.com/ai-dynamo/dynamo/blob/f15b4f4a9bd05cfdc985feeffaf3b8c9c0149e0d"
        "/deploy/cloud/operator/internal/dynamo/backend_vllm.go",
    ),
}

VLLM_HTTP_PORT = 8100  # + the instance's first GPU in its node
NIXL_SIDE_CHANNEL_PORT = 5600  # + the instance's first GPU (each TP rank adds its rank)
PROXY_PORT = 8000
SGLANG_HTTP_PORT = 30000
SGLANG_BOOTSTRAP_PORT = 8998
SGLANG_DIST_PORT = 5000
VLLM_DP_RPC_PORT = 13345  # + the instance's first GPU (vLLM's data-parallel example port)
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:${VERSION}"


@dataclass(frozen=True, slots=True)
class Instance:
    """One serving instance (a disaggsim worker): where it runs."""

    role: str  # prefill | decode | colocated
    index: int  # within its role
    tp: int  # attention TP per data-parallel rank
    layout: TpLayout  # the placement of all tp x dp GPUs
    nodes: tuple[int, ...]  # the nodes it uses (several when the worker spans nodes)
    first_gpu: int  # its first GPU in each of those nodes
    dp: int = 1  # attention data-parallel ranks
    ep: int = 1  # GPUs the experts are spread over (1: tensor-parallel experts)
    # data-parallel ranks on each of its nodes, when its ranks span nodes (the last node
    # may hold fewer: whole TP groups, as the fabric places them)
    node_ranks: tuple[int, ...] = ()

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp

    def ranks_on(self, i: int) -> int:
        """Data-parallel ranks on its ``i``-th node (a rank's TP group stays in a node)."""
        if self.node_ranks:
            return self.node_ranks[i]
        return max(1, self.layout.gpus_in_node // self.tp)

    def first_rank_on(self, i: int) -> int:
        return sum(self.ranks_on(j) for j in range(i))

    def gpus_on(self, i: int) -> str:
        """Its GPUs (CUDA_VISIBLE_DEVICES) on its ``i``-th node."""
        g = self.ranks_on(i) * self.tp if self.node_ranks else self.layout.gpus_in_node
        return ",".join(str(self.first_gpu + k) for k in range(g))

    @property
    def gpus(self) -> str:
        return self.gpus_on(0)

    @property
    def uneven(self) -> bool:
        """Its nodes hold different numbers of its GPUs."""
        return len(set(self.node_ranks)) > 1


@dataclass(frozen=True, slots=True)
class WeightServing:
    """How the engines are told to serve the weights the plan simulated."""

    format: str  # bf16 | fp16 | fp8 | fp8-block | mxfp4 | nvfp4 (what the plan simulated)
    dtype: str | None  # --dtype: bfloat16 | float16 | auto (None: not given)
    quantization: str | None  # --quantization for online quantisation (None: not given)
    checkpoint: str | None  # None: the model's released checkpoint serves it; else the
    # format a checkpoint must have (the scripts then need MODEL)


# the catalog's released_weights -> disaggsim's weight format of that checkpoint
_RELEASED_FORMAT = {"bf16": "bf16", "fp8-block": "fp8-block", "mxfp4-moe": "mxfp4"}


def weight_serving(weight_dtype: str, released_weights: str = "bf16") -> WeightServing:
    """The engine flags and the checkpoint for weights of ``weight_dtype`` (a scenario's,
    ``released`` included) of a model released as ``released_weights`` (the catalog's).

    - ``bf16``/``fp16``: ``--dtype bfloat16|float16``; a model released quantised needs a
      bf16 checkpoint;
    - ``fp8`` (per-tensor): ``--quantization fp8``, online quantisation of a bf16
      checkpoint (vLLM's and SGLang's docs). A model released in another format needs a
      bf16 checkpoint: an mxfp4 one is refused (vLLM refuses a ``--quantization`` that
      differs from the checkpoint's), and an fp8-block one (DeepSeek-V3's ``quant_method:
      fp8`` with ``weight_block_size``) is accepted but served block-scaled, which is
      ``fp8-block``, not the per-tensor FP8 the plan simulated;
    - a pre-quantised format (fp8-block, mxfp4, nvfp4; ``released``): ``--dtype auto`` and
      no ``--quantization``, the engines read the method from the checkpoint's
      ``quantization_config``; the released checkpoint when it is in that format, else
      a checkpoint in it (``MODEL``).
    """
    if released_weights not in _RELEASED_FORMAT:
        raise ValueError(
            f"released_weights {released_weights!r} (allowed: {', '.join(_RELEASED_FORMAT)})"
        )
    released = _RELEASED_FORMAT[released_weights]
    fmt = released if weight_dtype == "released" else weight_dtype
    if fmt in ("bf16", "fp16"):
        dtype = "float16" if fmt == "fp16" else "bfloat16"
        return WeightServing(fmt, dtype, None, None if released == "bf16" else "bf16")
    if fmt == "fp8":
        return WeightServing(fmt, None, "fp8", None if released == "bf16" else "bf16")
    if fmt in ("fp8-block", "mxfp4", "nvfp4"):
        return WeightServing(fmt, "auto", None, None if fmt == released else fmt)
    raise ValueError(
        f"weight_dtype {weight_dtype!r} (allowed: bf16, fp16, fp8, fp8-block, mxfp4, nvfp4, "
        "released)"
    )


@dataclass(frozen=True, slots=True)
class Deployment:
    """The recommended deployment, as the engines need it."""

    label: str
    kind: str  # disaggregate | colocate_chunked | colocate_vllm
    model_id: str
    hf_model: str
    gpu: str
    gpus_per_node: int
    num_nodes: int
    instances: tuple[Instance, ...]
    pools: dict[str, PoolConfig]
    weight_dtype: str
    kv_dtype: str
    released_weights: str = "bf16"  # how the model's checkpoint ships (catalog)

    @property
    def weights(self) -> WeightServing:
        return weight_serving(self.weight_dtype, self.released_weights)

    def of(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]


def _placement(gpu: str, tp: int, dp: int, node: int) -> tuple[TpLayout, tuple[int, ...]]:
    """Where a worker of ``dp`` ranks of ``tp`` GPUs sits on nodes of ``node`` GPUs, as the
    fabric places it (:func:`disaggsim.fabric.topology.build_topology`): in one node when
    it fits; a unit of several ranks over whole TP groups per node, ``node // tp`` ranks
    on each node but the last (12 GPUs of 4 x dp3 on 8-GPU nodes: 8 + 4, two ranks and
    one); one TP group beyond a node split evenly (the largest divisor of ``tp`` that fits
    a node, :func:`~disaggsim.costmodel.tp_layout.tp_layout`). Returns the layout (its
    ``gpus_in_node``: the GPUs on its first node) and the ranks on each node (empty
    unless the ranks span nodes)."""
    lay = tp_layout(gpu, tp * dp)
    gpus = tp * dp
    if gpus <= node:
        return replace(lay, gpus_per_node=node, gpus_in_node=gpus, num_nodes=1), ()
    if dp > 1:
        per = node // tp  # whole TP groups a node holds
        ranks = tuple(min(per, dp - k) for k in range(0, dp, per))
        return replace(lay, gpus_per_node=node, gpus_in_node=per * tp, num_nodes=len(ranks)), ranks
    g = max(d for d in range(1, node + 1) if tp % d == 0)
    return replace(lay, gpus_per_node=node, gpus_in_node=g, num_nodes=tp // g), ()


def deployment_of(res: SearchResult, advice: Advice) -> Deployment:
    """The recommended candidate with its pools as the plan simulated them (prefill
    budgets, batch limits, memory share) and its instances placed on nodes."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.search import candidate_scenario

    if not advice.decided or advice.recommended is None:
        raise ValueError(f"plan: verdict {advice.verdict!r} recommends no deployment")
    cand = advice.recommended.candidate
    s: Scenario = load_scenario(
        candidate_scenario(res.loaded, cand), base_dir=res.loaded.base_dir
    ).scenario
    gpu = get_gpu(res.gpu)
    # the node the simulation placed workers on: a topology fabric's, else the catalog's
    node = getattr(s.fabric, "gpus_per_node", None) or gpu.gpus_per_node
    instances: list[Instance] = []
    cur_node, cur_gpu = 0, 0
    for role, pool in s.pools.items():
        gpus = pool.gpus_per_worker
        lay, ranks = _placement(gpu.id, pool.tp, pool.dp, node)
        ep = effective_ep(pool.tp, pool.dp, pool.ep)
        for i in range(pool.num_workers):
            if lay.cross_node:
                if cur_gpu:
                    cur_node, cur_gpu = cur_node + 1, 0
                nodes = tuple(range(cur_node, cur_node + lay.num_nodes))
                instances.append(Instance(role, i, pool.tp, lay, nodes, 0, pool.dp, ep, ranks))
                cur_node += lay.num_nodes
                continue
            if cur_gpu + gpus > node:
                cur_node, cur_gpu = cur_node + 1, 0
            instances.append(Instance(role, i, pool.tp, lay, (cur_node,), cur_gpu, pool.dp, ep))
            cur_gpu += gpus
    num_nodes = cur_node + (1 if cur_gpu else 0)
    return Deployment(
        label=cand.label,
        kind=cand.kind,
        model_id=s.model,
        hf_model=get_model(s.model).hf_id,
        gpu=gpu.id,
        gpus_per_node=node,
        num_nodes=num_nodes,
        instances=tuple(instances),
        pools={str(role): pool for role, pool in s.pools.items()},
        weight_dtype=s.weight_dtype,
        kv_dtype=s.kv_dtype,
        released_weights=get_model(s.model).released_weights,
    )


def _header(dep: Deployment, engine: str, how: Sequence[str]) -> list[str]:
    lines = [
        f"# {engine} launch configuration for the deployment disaggsim plan recommends:",
        f"#   {dep.label} ({dep.kind}) of {dep.model_id} ({dep.hf_model}) on {dep.gpu},",
        f"#   {len(dep.instances)} instances on {dep.num_nodes} node(s) of "
        f"{dep.gpus_per_node} GPUs.",
        f"# Flag and field names from {engine}'s documentation (versions in the URLs):",
    ]
    lines += [f"#   {url}" for url in SOURCES[engine.lower()]]
    lines += [f"# {h}" for h in how]
    return lines


def _arg(a: str) -> str:
    """Shell-quoted, except words that expand a variable (built already double-quoted)."""
    return a if "$" in a else shlex.quote(a)


def _q(args: Sequence[str]) -> str:
    """A command with each flag and its values on a line of its own."""
    lines: list[str] = []
    for a in args:
        if a.startswith("--") or not lines:
            lines.append(_arg(a))
        else:
            lines[-1] += " " + _arg(a)
    return " \\\n    ".join(lines)


def _weight_args(dep: Deployment) -> list[str]:
    """``--dtype`` and ``--quantization`` as :func:`weight_serving` says (the same flag
    names in vLLM and SGLang)."""
    w = dep.weights
    out = []
    if w.quantization is not None:
        out += ["--quantization", w.quantization]
    if w.dtype is not None:
        out += ["--dtype", w.dtype]
    return out


def _checkpoint_note(dep: Deployment) -> list[str]:
    """Header lines when the planned weights need a checkpoint other than the released one."""
    w = dep.weights
    if w.checkpoint is None:
        return []
    if w.quantization is not None:
        how = f"--quantization {w.quantization} quantises it when it loads"
    elif w.checkpoint in ("bf16", "fp16"):
        how = "unquantised"
    else:
        how = "the engine reads the method from its quantization_config"
    released = _RELEASED_FORMAT[dep.released_weights]
    out = [
        f"The plan simulated {w.format} weights; {dep.hf_model} is released in {released}:",
        f"set MODEL to a {w.checkpoint} checkpoint of it ({how}).",
    ]
    if w.format == "fp8" and released == "fp8-block":
        out.append(
            "Its released checkpoint would be served block-scaled (fp8-block), not the "
            "per-tensor FP8 simulated: plan with weight_dtype fp8-block to serve it as it ships."
        )
    return out


def _model_line(dep: Deployment) -> str:
    w = dep.weights
    if w.checkpoint is None:
        return 'MODEL="${MODEL:-' + dep.hf_model + '}"'
    return (
        'MODEL="${MODEL:?set MODEL to a '
        + f"{w.checkpoint} checkpoint of {dep.hf_model}, the weights the plan simulated"
        + '}"'
    )


def _dtype_args_vllm(dep: Deployment) -> list[str]:
    out = _weight_args(dep)
    if dep.kv_dtype == "fp8":
        out += ["--kv-cache-dtype", "fp8"]
    return out


def effective_ep(tp: int, dp: int, ep: int | None) -> int:
    """The layout's EP degree with the cost model's default filled in (all GPUs when
    ``dp > 1``, else 1: docs/costmodel.md)."""
    if ep is not None:
        return ep
    return tp * dp if dp > 1 else 1


def unsupported(cand: Candidate) -> str | None:
    """Why vLLM (and Dynamo's vLLM backend) cannot launch ``cand``'s layouts, or None:
    vLLM's EP degree is always TP × DP (``--enable-expert-parallel``) or 1."""
    for role, lay in (("prefill", cand.prefill_layout), ("decode", cand.decode_layout)):
        if lay.tp == 0:
            continue
        ep = effective_ep(lay.tp, lay.dp, lay.ep)
        if ep not in (1, lay.gpus):
            return (
                f"the {role} layout's ep {ep} over {lay.gpus} GPUs has no vLLM form (vLLM "
                "spreads experts over tp x dp GPUs with --enable-expert-parallel, or none): "
                "deploy-vllm.sh and deploy-dynamo.yaml are not written, deploy-sglang.sh "
                "is (--ep-size)"
            )
    return None


def _vllm_engine_args(dep: Deployment, inst: Instance) -> list[str]:
    """Per-rank batch limits: a pool's ``max_batch_seqs``/``max_batch_tokens`` count the
    whole worker, vLLM's ``--max-num-seqs``/``--max-num-batched-tokens`` one DP rank."""
    pool = dep.pools[inst.role]
    seqs = -(-pool.max_batch_seqs // inst.dp)
    # a step holds at most max_num_batched_tokens tokens: at least one per running sequence
    budget = max(-(-pool.max_batch_tokens // inst.dp), seqs)
    args = [
        "--tensor-parallel-size",
        str(inst.tp),
        "--max-num-seqs",
        str(seqs),
        "--max-num-batched-tokens",
        str(budget),
        "--gpu-memory-utilization",
        f"{pool.gpu_mem_util:g}",
        *_dtype_args_vllm(dep),
    ]
    if inst.dp > 1:
        args += ["--data-parallel-size", str(inst.dp)]
    if inst.ep > 1:
        args.append("--enable-expert-parallel")
    if inst.layout.cross_node and inst.dp == 1:  # one TP group over nodes
        args += ["--distributed-executor-backend", "ray"]
    return args


def _kv_transfer(role: str) -> str:
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}, separators=(",", ":"))


def _script(dep: Deployment, engine: str, how: list[str], per_node: dict[int, list[str]]) -> str:
    how = [*how, *_checkpoint_note(dep)]
    lines = ["#!/usr/bin/env bash", *_header(dep, engine, how), "set -euo pipefail", ""]
    lines.append(_model_line(dep))
    for n in range(dep.num_nodes):
        lines.append(f': "${{NODE_{n}:?set NODE_{n} to the address of node {n}}}"')
    lines.append(': "${NODE_RANK:?set NODE_RANK to this node (0..' + f"{dep.num_nodes - 1})" + '}"')
    lines.append("")
    lines.append('case "$NODE_RANK" in')
    for n in range(dep.num_nodes):
        lines.append(f"{n})")
        for cmd in per_node.get(n, []):
            lines.append("  " + cmd.replace("\n", "\n  "))
        lines.append("  ;;")
    lines.append('*) echo "NODE_RANK must be 0..' + f'{dep.num_nodes - 1}" >&2; exit 2 ;;')
    lines.append("esac")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def vllm_script(dep: Deployment) -> str:
    """``vllm serve`` per instance (NixlConnector for a disaggregated deployment, with
    vLLM's example proxy in front), dispatched on ``NODE_RANK``."""
    how = [
        "Run on every node: NODE_RANK=<n> NODE_0=<host> ... bash deploy-vllm.sh",
        "Each instance serves its own port; a disaggregated deployment is fronted by the",
        "toy proxy from vLLM's repository (tests/v1/kv_connector/nixl_integration), a",
        "colocated one by any HTTP load balancer over the instances' ports.",
    ]
    per_node: dict[int, list[str]] = {}
    for inst in dep.instances:
        head = inst.nodes[0]
        multi_dp = inst.layout.cross_node and inst.dp > 1  # DP ranks over several nodes
        nodes = inst.nodes if multi_dp else (head,)
        for rank, n in enumerate(nodes):
            env = [f"CUDA_VISIBLE_DEVICES={inst.gpus_on(rank)}"]
            args = ["vllm", "serve", '"$MODEL"']
            if rank > 0:  # engines only: the head node's API server fronts them
                args.append("--headless")
            else:
                args += ["--port", str(VLLM_HTTP_PORT + inst.first_gpu)]
            args += _vllm_engine_args(dep, inst)
            if multi_dp:  # each node its own ranks (vLLM takes a local size per node)
                args += ["--data-parallel-size-local", str(inst.ranks_on(rank))]
                if rank > 0:
                    args += ["--data-parallel-start-rank", str(inst.first_rank_on(rank))]
                args += [
                    "--data-parallel-address",
                    f'"$NODE_{head}"',
                    "--data-parallel-rpc-port",
                    str(VLLM_DP_RPC_PORT + inst.first_gpu),
                ]
            if dep.kind == "disaggregate":
                env += [
                    f'VLLM_NIXL_SIDE_CHANNEL_HOST="$NODE_{n}"',
                    f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_PORT + inst.first_gpu}",
                ]
                args += ["--kv-transfer-config", _kv_transfer(inst.role)]
            note = f"# {inst.role} instance {inst.index}: node {n}, GPUs {inst.gpus_on(rank)}"
            if inst.dp > 1:
                note += f" (tp {inst.tp} x dp {inst.dp}, ep {inst.ep})"
            if multi_dp:
                first = inst.first_rank_on(rank)
                note += (
                    f", data-parallel ranks {first}..{first + inst.ranks_on(rank) - 1} of {inst.dp}"
                )
            elif inst.layout.cross_node:
                note += (
                    f" on each of nodes {', '.join(map(str, inst.nodes))} (tp {inst.tp} across "
                    f"nodes: start a Ray cluster over them first, ray start --head on node {head})"
                )
            per_node.setdefault(n, []).append(f"{note}\n{' '.join(env)} {_q(args)} &")
    if dep.kind == "disaggregate":
        pre, dec = dep.of("prefill"), dep.of("decode")
        proxy = [
            "python",
            "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py",
            "--port",
            str(PROXY_PORT),
            "--prefiller-hosts",
            *[f'"$NODE_{i.nodes[0]}"' for i in pre],
            "--prefiller-ports",
            *[str(VLLM_HTTP_PORT + i.first_gpu) for i in pre],
            "--decoder-hosts",
            *[f'"$NODE_{i.nodes[0]}"' for i in dec],
            "--decoder-ports",
            *[str(VLLM_HTTP_PORT + i.first_gpu) for i in dec],
        ]
        per_node.setdefault(0, []).append(
            "# the proxy (from a vLLM checkout) routes each request to a prefill then a decode"
            f" instance\n{_q(proxy)} &"
        )
    return _script(dep, "vLLM", how, per_node)


def _dtype_args_sglang(dep: Deployment) -> list[str]:
    out = _weight_args(dep)
    if dep.kv_dtype == "fp8":
        out += ["--kv-cache-dtype", "fp8_e4m3"]
    return out


def sglang_script(dep: Deployment) -> str:
    """``sglang.launch_server`` per instance (``--disaggregation-mode`` for prefill and
    decode instances) and ``sglang_router`` in front, dispatched on ``NODE_RANK``."""
    how = [
        "Run on every node: NODE_RANK=<n> NODE_0=<host> ... bash deploy-sglang.sh",
        "The router (sglang_router) on node 0 is the endpoint.",
    ]
    per_node: dict[int, list[str]] = {}
    urls: dict[str, list[tuple[str, int, int]]] = {}
    for inst in dep.instances:
        pool = dep.pools[inst.role]
        port = SGLANG_HTTP_PORT + inst.first_gpu
        # SGLang's TP size counts every GPU of the instance (attention TP = tp / dp with
        # DP attention); its running-request and chunk limits are the instance's (split
        # over the DP ranks by SGLang), a prefill batch's tokens are per rank
        args = [
            "python", "-m", "sglang.launch_server", "--model-path", '"$MODEL"',
            "--host", "0.0.0.0", "--port", str(port), "--tp-size", str(inst.num_gpus),
            "--base-gpu-id", str(inst.first_gpu),
            "--mem-fraction-static", f"{pool.gpu_mem_util:g}",
            "--max-running-requests", str(pool.max_batch_seqs),
            *_dtype_args_sglang(dep),
        ]  # fmt: skip
        if inst.dp > 1:
            args += ["--dp-size", str(inst.dp), "--enable-dp-attention"]
        if inst.ep > 1:
            args += ["--ep-size", str(inst.ep)]
        if inst.role == "decode":
            pass
        elif inst.role == "colocated" and dep.kind == "colocate_chunked":
            args += ["--chunked-prefill-size", str(pool.max_batch_tokens)]
        else:  # whole prompts: no chunking, a prefill batch holds the longest prompt
            args += ["--chunked-prefill-size", "-1", "--max-prefill-tokens",
                     str(-(-pool.max_batch_tokens // inst.dp))]  # fmt: skip
        bootstrap = SGLANG_BOOTSTRAP_PORT + inst.first_gpu
        if dep.kind == "disaggregate":
            args += ["--disaggregation-mode", inst.role,
                     "--disaggregation-transfer-backend", "mooncake"]  # fmt: skip
            if inst.role == "prefill":
                args += ["--disaggregation-bootstrap-port", str(bootstrap)]
        head = inst.nodes[0]
        urls.setdefault(inst.role, []).append((f"http://$NODE_{head}:{port}", bootstrap, head))
        for rank, n in enumerate(inst.nodes):
            extra: list[str] = []
            if inst.layout.cross_node:
                extra = ["--dist-init-addr", f'"$NODE_{head}:{SGLANG_DIST_PORT + inst.first_gpu}"',
                         "--nnodes", str(len(inst.nodes)), "--node-rank", str(rank)]  # fmt: skip
            note = f"# {inst.role} instance {inst.index}: node {n}, GPUs {inst.gpus}"
            per_node.setdefault(n, []).append(f"{note}\n{_q([*args, *extra])} &")
    router = ["python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0",
              "--port", str(PROXY_PORT)]  # fmt: skip
    if dep.kind == "disaggregate":
        router.append("--pd-disaggregation")
        for url, bootstrap, _ in urls["prefill"]:
            router += ["--prefill", f'"{url}"', str(bootstrap)]
        for url, _, _ in urls["decode"]:
            router += ["--decode", f'"{url}"']
    else:
        router += ["--worker-urls", *[f'"{u}"' for u, _, _ in urls["colocated"]]]
    per_node.setdefault(0, []).append(f"# the router: the deployment's endpoint\n{_q(router)} &")
    return _script(dep, "SGLang", how, per_node)


def dynamo_yaml(dep: Deployment) -> str:
    """A ``DynamoGraphDeployment`` with the vLLM backend: a frontend and one service per
    pool (``replicas`` = workers; ``multinode.nodeCount`` when a worker spans nodes: the
    operator adds Ray or the per-node data-parallel flags)."""
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {
                "mainContainer": {
                    "image": DYNAMO_IMAGE,
                    "command": ["python3", "-m", "dynamo.frontend"],
                    "args": ["--http-port", str(PROXY_PORT)],
                }
            },
        }
    }
    names = {
        "prefill": "VllmPrefillWorker",
        "decode": "VllmDecodeWorker",
        "colocated": "VllmWorker",
    }
    for role in dep.pools:
        insts = dep.of(role)
        inst = insts[0]
        args = ["--model", dep.hf_model if dep.weights.checkpoint is None else "${MODEL}"]
        if dep.kind == "disaggregate":
            args += ["--disaggregation-mode", role, "--kv-transfer-config", _kv_transfer(role)]
        engine = _vllm_engine_args(dep, inst)
        if "--distributed-executor-backend" in engine:  # the operator adds Ray (multinode)
            engine = engine[: engine.index("--distributed-executor-backend")]
        args += engine
        svc: dict[str, Any] = {
            "envFromSecret": "hf-token-secret",
            "componentType": "worker",
        }
        if dep.kind == "disaggregate":
            svc["subComponentType"] = role
        svc["replicas"] = len(insts)
        if inst.layout.cross_node:
            svc["multinode"] = {"nodeCount": inst.layout.num_nodes}
        svc["resources"] = {"limits": {"gpu": str(inst.layout.gpus_in_node)}}
        svc["extraPodSpec"] = {
            "mainContainer": {
                "image": DYNAMO_IMAGE,
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": args,
            }
        }
        services[names[role]] = svc
    doc = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": _k8s_name(f"disaggsim-{dep.model_id}-{dep.kind}")},
        "spec": {"services": services},
    }
    how = [
        "Apply with kubectl apply -f deploy-dynamo.yaml (Dynamo's operator installed);",
        "set the runtime image tag for ${VERSION} and the hf-token-secret first.",
    ]
    if dep.weights.checkpoint is not None:
        how += [*_checkpoint_note(dep), "Replace ${MODEL} in the workers' --model with it."]
    head = "\n".join(_header(dep, "Dynamo", how))
    return head + "\n" + yaml.safe_dump(doc, sort_keys=False, width=120)


def _k8s_name(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63]


def launch_configs(res: SearchResult, advice: Advice) -> dict[str, str]:
    """File name → text of the launch configurations (:data:`DEPLOY_FILES`); only
    ``deploy-sglang.sh`` for a layout vLLM cannot express (:func:`unsupported`)."""
    dep = deployment_of(res, advice)
    files = {}
    if uneven_nodes(dep) is None:
        files["deploy-sglang.sh"] = sglang_script(dep)
    assert advice.recommended is not None
    if unsupported(advice.recommended.candidate) is None:
        files["deploy-vllm.sh"] = vllm_script(dep)
        if uneven_nodes(dep) is None:
            files["deploy-dynamo.yaml"] = dynamo_yaml(dep)
    return {name: files[name] for name in DEPLOY_FILES if name in files}


def uneven_nodes(dep: Deployment) -> str | None:
    """Why SGLang and Dynamo cannot launch ``dep``'s placement, or None: a worker whose
    nodes hold different numbers of its GPUs (data-parallel ranks over nodes that do not
    divide them). SGLang's ``--nnodes`` splits ``--tp-size`` evenly over the nodes and
    Dynamo's ``multinode`` gives every node ``resources.limits.gpu``; vLLM takes
    ``--data-parallel-size-local`` per node."""
    for inst in dep.instances:
        if inst.uneven:
            per = " + ".join(str(r * inst.tp) for r in inst.node_ranks)
            return (
                f"a {inst.role} worker of tp {inst.tp} x dp {inst.dp} sits on {per} GPUs of "
                f"{dep.gpus_per_node}-GPU nodes: SGLang (--nnodes) and Dynamo (multinode) "
                "put as many GPUs on every node, so only deploy-vllm.sh is written"
            )
    return None
