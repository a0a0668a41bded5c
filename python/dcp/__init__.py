"""dcp: dynamic context parallelism for long-context training.

Each step's documents (lengths and one attention mask each) are cut into blocks of tokens and
blocks of attention work, placed on the ranks so that few bytes move while compute and memory
stay balanced, and run as exact attention, forward and backward, by fused kernels.

    planner = dcp.Planner(group, "h200-nvl", {"block_size": 2048}, shape=(32, 8, 128))
    planner.submit(step, lengths, masks)          # a step or more ahead; returns at once
    plan = planner.get(step)                      # waits only if not planned yet
    ids = plan.dispatch(global_ids)               # this rank's tokens, in attention order
    o = dcp.torch.attention(q, k, v, plan, layer) # autograd, torch.compile, checkpointing

Layers with different masks (sliding-window and global layers): submit dcp.LayerKinds({"global":
"causal", "local": dcp.masks.lambda_mask(64, 4096)}) as the masks; every kind is planned on one
token placement, and plan.kind("local") is what the local layers run.

Modules: dcp.masks (mask specs), dcp.torch (the operator), dcp.hf (transformers), dcp.launch
(ranks from torchrun, srun or mpirun). The C++ core is dcp._dcp; docs/python.md is the reference.
"""
try:  # PyTorch first: the module then shares the CUDA and NCCL libraries PyTorch loaded
    import torch as _torch  # noqa: F401
except ImportError:  # dcp works without PyTorch (planning, the C++ core)
    pass

from . import masks
from ._dcp import Batch, Cluster, Error, Plan, PlanOptions
from ._dcp import cluster, load_batch, load_cluster, placement_methods, plan_from_bytes, profile_batches
from ._dcp import cuda_available, mpi_available, nccl_available
from .planner import LayerKinds, Planner, StepPlan, make_batch

__version__ = "0.1.0"


def plan(lengths, masks, shape, cluster="h200-nvl", options=None, world_size=None, dtype: str = "bf16"):
    """One plan, now, without a planner (tools, notebooks, tests). `cluster`: a dcp.Cluster or a
    cluster JSON file (its devices), or a preset with `world_size` devices of one node (default 1).
    `plan.simulate(cluster)` predicts its time; options={"method": "zigzag"} plans a static layout
    to compare with."""
    from .planner import _cluster, _options
    from ._dcp import plan_step

    if isinstance(cluster, str) and cluster.endswith(".json"):
        cluster = load_cluster(cluster)  # read once: its devices, then the cluster itself
    if world_size is None:
        world_size = cluster.num_devices if isinstance(cluster, Cluster) else 1
    return plan_step(make_batch(lengths, masks, shape, dtype), _cluster(cluster, world_size, None), _options(options))


__all__ = ["Batch", "Cluster", "Error", "LayerKinds", "load_batch", "profile_batches", "Plan", "PlanOptions", "Planner", "StepPlan", "cluster", "load_cluster",
           "make_batch", "masks", "placement_methods", "plan", "plan_from_bytes", "cuda_available", "mpi_available",
           "nccl_available"]
