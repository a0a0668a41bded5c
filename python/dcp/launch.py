"""Ranks from any launcher: torchrun, srun (Slurm), mpirun (Open MPI, MPICH, Intel MPI), or one
process; and the node layout of a process group.

    launch = dcp.launch.init_process_group()     # reads the launcher's environment
    planner = dcp.Planner(None, "h200-nvl", ...)  # nodes and devices per node found from the group

Each launcher describes a process in its own variables. torchrun sets the names
torch.distributed reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT); srun and mpirun set others. `detect` reads whichever is present, and
`init_process_group` fills torch's names from it, picks this rank's GPU and starts the group.

The planner's cluster model needs to know which ranks share a node: inside a node transfers take
NVLink, between nodes the network, and placement weighs the two differently. A launcher's local
world size says how many processes share this node, but not how many of a given group do: a cp
group inside a tp x cp mesh holds a few ranks of each node. `node_layout` therefore asks the group
itself: every rank names its host and the names are gathered.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

__all__ = ["Launch", "detect", "init_process_group", "node_layout", "node_key", "first_host"]

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Launch:
    """Where this process sits. `launcher` names the environment it was read from: 'torchrun',
    'openmpi', 'mpich', 'slurm' or 'single'. master_addr / master_port are None where the launcher
    does not say (init_process_group then decides, see there). `device` is set by
    init_process_group."""
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    device: Any = None


def _int(env: Mapping[str, str], name: str) -> int:
    if name not in env:
        raise ValueError(f"dcp.launch: {name} is not set (the launcher's other variables are)")
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"dcp.launch: {name}={value!r} is not an integer") from None


def _tasks_on_first_node(spec: str) -> int:
    """Slurm's tasks-per-node list ('4(x2),3' = 4 on each of two nodes, then 3): the first count."""
    m = re.match(r"\s*(\d+)", spec)
    if not m:
        raise ValueError(f"dcp.launch: SLURM_STEP_TASKS_PER_NODE={spec!r} is not a Slurm task count list")
    return int(m.group(1))


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: 'gpu[003-005,9],cpu1' -> 'gpu003',
    'rack[1-2]-n[07-08]' -> 'rack1-n07'. Zero padding is kept, as Slurm writes host names so."""
    head = ""
    depth = 0
    for ch in nodelist.strip():  # the first comma outside brackets ends the first entry
        if ch == "," and depth == 0:
            break
        depth += ch == "["
        depth -= ch == "]"
        head += ch
    if not head or depth != 0:
        raise ValueError(f"dcp.launch: cannot read the Slurm host list {nodelist!r}")
    # Each bracket group contributes the start of its first range.
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], head)
    if not host or "[" in host or "]" in host:
        raise ValueError(f"dcp.launch: cannot read the Slurm host list {nodelist!r}")
    return host


def detect(env: Optional[Mapping[str, str]] = None) -> Launch:
    """This process's place, read from the environment of its launcher.

    Order: torchrun's variables (also when torchrun runs inside a Slurm step), then Open MPI's and
    MPICH's (an mpirun inside a Slurm allocation inherits the allocation's SLURM_* variables,
    which then describe the allocation, not this process), then srun's, else one process."""
    env = os.environ if env is None else env
    addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else None
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        launch = Launch("torchrun", _int(env, "RANK"), world,
                        _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                        _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world, addr, port)
    elif "OMPI_COMM_WORLD_RANK" in env:
        launch = Launch("openmpi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                        _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"), addr, port)
    elif "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH's Hydra, Intel MPI
        world = _int(env, "PMI_SIZE")
        launch = Launch("mpich", _int(env, "PMI_RANK"), world,
                        _int(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env else 0,
                        _int(env, "MPI_LOCALNRANKS") if "MPI_LOCALNRANKS" in env else world, addr, port)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if addr is None and nodes:
            addr = first_host(nodes)
        if port is None and env.get("SLURM_JOB_ID"):
            # One job's steps share a port; jobs sharing a node get different ones.
            port = DEFAULT_PORT + _int(env, "SLURM_JOB_ID") % 10000
        world = _int(env, "SLURM_NTASKS")
        launch = Launch("slurm", _int(env, "SLURM_PROCID"), world,
                        _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                        _tasks_on_first_node(tasks) if tasks else world, addr, port)
    else:
        launch = Launch("single", 0, 1, 0, 1, addr, port)
    if launch.world_size < 1 or not 0 <= launch.rank < launch.world_size:
        raise ValueError(f"dcp.launch: {launch.launcher} says rank {launch.rank} of {launch.world_size} processes")
    if launch.local_world_size < 1 or not 0 <= launch.local_rank < launch.local_world_size:
        raise ValueError(f"dcp.launch: {launch.launcher} says local rank {launch.local_rank} of "
                         f"{launch.local_world_size} processes on the node")
    return launch


def _master_over_mpi(launch: Launch) -> str:
    """Rank 0's host name, broadcast over MPI (mpi4py), for an mpirun across nodes."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(f"dcp.launch: {launch.world_size} processes from mpirun over several nodes and no "
                           "MASTER_ADDR: set MASTER_ADDR to rank 0's host (e.g. mpirun -x MASTER_ADDR=...), "
                           "or install mpi4py to have it found") from None
    return MPI.COMM_WORLD.bcast(socket.gethostname() if launch.rank == 0 else None, root=0)


def _pick_device(kind: str, launch: Launch):
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("dcp.launch: device 'cuda' asked for, but torch sees no GPU")
    count = torch.cuda.device_count()
    # A launcher that binds each task to its GPUs (srun --gpus-per-task) leaves one visible.
    index = 0 if count == 1 else launch.local_rank
    if index >= count:
        raise RuntimeError(f"dcp.launch: rank {launch.rank} is local rank {launch.local_rank} of its node, "
                           f"but only {count} GPUs are visible to it")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_process_group(backend: Optional[str] = None, *, device: Optional[str] = None,
                       timeout_s: float = 600.0, env: Optional[Mapping[str, str]] = None) -> Launch:
    """Starts torch.distributed from any launcher's environment and returns this process's Launch
    (with `device`: its GPU, set as current, or the CPU).

    device: 'cuda', 'cpu' or None (cuda when torch sees a GPU). backend: None picks nccl on GPUs,
    gloo on CPUs. torch's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) are set where the launcher left them out, so later code that reads them (and the
    planner's default devices per node) sees the same values. The rendezvous host is MASTER_ADDR
    where set; under srun the step's first host; under mpirun on one node this host, across nodes
    rank 0's host found over mpi4py. The port: MASTER_PORT, under srun 29500 + job id mod 10000,
    else 29500. One process (no launcher) starts no group. A group already started is kept."""
    import datetime

    import torch
    import torch.distributed as dist

    launch = detect(env)
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"dcp.launch: device={device!r}: expected 'cuda', 'cpu' or None")
    picked = _pick_device(kind, launch)
    addr, port = launch.master_addr, launch.master_port
    if addr is None and launch.world_size > 1:
        one_node = launch.local_world_size == launch.world_size
        addr = "127.0.0.1" if one_node or launch.launcher == "single" else _master_over_mpi(launch)
    launch = Launch(launch.launcher, launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
                    addr, port or DEFAULT_PORT, picked)
    if env is None:
        for name, value in (("RANK", launch.rank), ("WORLD_SIZE", launch.world_size),
                            ("LOCAL_RANK", launch.local_rank), ("LOCAL_WORLD_SIZE", launch.local_world_size),
                            ("MASTER_ADDR", launch.master_addr), ("MASTER_PORT", launch.master_port)):
            if value is not None:
                os.environ.setdefault(name, str(value))
    if launch.world_size > 1 and not dist.is_initialized():
        name = backend or ("nccl" if picked.type == "cuda" else "gloo")
        kwargs = {"device_id": picked} if name == "nccl" else {}
        # torchrun's own store (its agent serves it) is reached through env://.
        method = "env://" if launch.launcher == "torchrun" and env is None else \
            f"tcp://{launch.master_addr}:{launch.master_port}"
        dist.init_process_group(name, init_method=method, rank=launch.rank, world_size=launch.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return launch


# ---- which ranks of a group share a node ---------------------------------------------------------
def node_key() -> str:
    """Names this process's machine: the kernel's boot id where readable (containers on one host
    share it, whatever their host names), else the host name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        if boot:
            return boot
    except OSError:
        pass
    return socket.gethostname()


def layout_of(keys: Sequence[str]) -> Tuple[int, int]:
    """(nodes, devices per node) of ranks whose machines are `keys` (rank order). The cluster
    model numbers devices node by node, so each node's ranks must be consecutive and every node
    must hold as many (else dcp.Error naming each rank's node)."""
    from ._dcp import node_layout_of

    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return tuple(node_layout_of([index[k] for k in keys]))


def node_layout(group: Any = None) -> Tuple[int, int]:
    """(nodes, devices per node) of a process group (None: the default group), found by gathering
    every rank's node_key(). A collective: every rank of the group calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1, 1
    world = dist.get_world_size(group)
    if world == 1:
        return 1, 1
    keys: List[Any] = [None] * world
    dist.all_gather_object(keys, node_key(), group=group)
    return layout_of(keys)
