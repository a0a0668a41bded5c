"""dcp.torch: attention of a DCP plan as a PyTorch operator, with autograd and torch.compile.

    o = dcp.torch.attention(q, k, v, plan, layer)

q [tokens, q_heads, head_dim], k and v [tokens, kv_heads, head_dim]: this rank's tokens of the
step in the plan's dispatch order (plan.dispatch), any row and head strides (views of a fused QKV
projection work), last dimension contiguous. bf16 on GPUs; fp32 or bf16 on CPUs. Returns o like
q. One plan serves every layer of its step, in any order autograd and activation checkpointing
run them. The operator is torch.ops.dcp.attention_forward / attention_backward with fake
(meta) implementations, so torch.compile traces through it; under compile, pass `plan.handle`
(a tensor) instead of the plan object so steps with new plans reuse the compiled graph.

Compute runs on the current CUDA stream with scratch from PyTorch's caching allocator; transfers
run on NCCL through a communicator of dcp's own (its unique id broadcast over the plan's process
group), separate from the one DDP or FSDP use. CPU ranks move data through torch.distributed
(gloo) or MPI (dcp.torch.configure(cpu_comm='mpi') under mpirun).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import itertools
import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import torch

from . import _dcp
from .planner import StepPlan

__all__ = ["attention", "configure", "prepare", "shutdown", "Attention", "handle_of"]

_config = {
    "timeout_s": 120.0,
    "cpu_comm": "gloo",  # or "mpi"
    # Kernel routes (auto | mma | wgmma | wgmma-basic), for comparisons; the package reads the
    # same variables as the dcp command.
    "forward_kernel": os.environ.get("DCP_ATTN_FORWARD", "auto") or "auto",
    "backward_kernel": os.environ.get("DCP_ATTN_BACKWARD", "auto") or "auto",
    "dq_reduction": os.environ.get("DCP_ATTN_BACKWARD_DQ", "bulk") or "bulk",
    # Bitwise reproducible gradients (CUDA: the deterministic wgmma backward; the CPU kernels
    # always are).
    # (True / False, or the variable's spelling: checked where a runtime is made).
    "deterministic": os.environ.get("DCP_ATTN_DETERMINISTIC", ""),
    # Its one-pass method on one GPU (dQ summed as integer counts of per-row units; on by
    # default; False: two passes there too, as on several GPUs).
    "deterministic_one_pass": os.environ.get("DCP_ATTN_DETERMINISTIC_ONE_PASS", ""),
    # That method over the default backward's work, both kernels, dK / dV added in turns (off by
    # default until it has run on a GPU).
    "deterministic_ordered": os.environ.get("DCP_ATTN_DETERMINISTIC_ORDERED", ""),
    "nccl_blocking_wait": True,
}


def _switch(value: Any) -> str:
    """An on/off option as the C++ side spells it (it refuses anything else, naming the option)."""
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def configure(**options: Any) -> None:
    """Process-wide settings: timeout_s (any transfer), cpu_comm ('gloo' or 'mpi'),
    forward_kernel / backward_kernel ('auto', 'mma', 'wgmma', 'wgmma-basic'), dq_reduction
    ('bulk', 'atomic'), deterministic (True: dQ, dK, dV bitwise identical run to run; CUDA needs
    a Hopper GPU), deterministic_one_pass (default True: on one GPU, the deterministic backward
    takes one pass, dQ summed as integer counts of per-row units, 12-17 bits of precision on rows
    with outlier features; False: two passes, as on several GPUs, dQ recomputed in a pass of its
    own), deterministic_ordered (True: the one-pass method over the default backward's work and
    kernels, each item's dK / dV added in its turn; off by default: no faster than one pass),
    nccl_blocking_wait (False lets the host run ahead of NCCL transfers).
    Takes effect for runtimes made afterwards."""
    for key, value in options.items():
        if key not in _config:
            raise ValueError(f"configure: unknown option '{key}' (expected one of {sorted(_config)})")
        _config[key] = value
    if _config["cpu_comm"] not in ("gloo", "mpi"):
        raise ValueError(f"configure: cpu_comm must be 'gloo' or 'mpi', got {_config['cpu_comm']!r}")
    _RUNTIMES.clear()


# ---- plans by handle ------------------------------------------------------------------------
# The operator takes a plan as a one-element int64 tensor (a handle), so compiled graphs take
# new plans as inputs instead of recompiling for each.
_plans: Dict[int, "weakref.ref[StepPlan]"] = {}
_ids = itertools.count(1)


def handle_of(plan: StepPlan) -> torch.Tensor:
    """The plan's handle: what the operator takes in its place."""
    if not isinstance(plan, StepPlan):
        raise TypeError(f"expected a dcp StepPlan (Planner.get), got {type(plan).__name__}")
    plan.check_usable()
    h = plan.runtime_state.get("handle")
    if h is None:
        i = next(_ids)
        _plans[i] = weakref.ref(plan)
        weakref.finalize(plan, _plans.pop, i, None)
        h = torch.tensor([i], dtype=torch.int64)
        h._dcp_plan = weakref.ref(plan)  # the operator finds the plan without reading the tensor
        plan.runtime_state["handle"] = h
    return h


def _plan_of(handle: torch.Tensor) -> StepPlan:
    ref = getattr(handle, "_dcp_plan", None)  # plan.handle itself; a copy (e.g. from a graph) is read
    if ref is None:
        if handle.numel() != 1 or handle.dtype != torch.int64:
            raise ValueError("dcp attention: the plan handle must be plan.handle (one int64)")
        ref = _plans.get(int(handle.item()))
    plan = ref() if ref is not None else None
    if plan is None:
        raise ValueError("dcp attention: the plan of this handle was released (keep the StepPlan until the "
                         "step's backward is done)")
    plan.check_usable()
    return plan


# ---- runtimes: one comm and backend per (group, device) -------------------------------------
class _TorchAllocator:
    """Scratch from PyTorch's caching allocator on the current stream (stream-ordered reuse)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.blocks: Dict[int, torch.Tensor] = {}

    def allocate(self, nbytes: int) -> int:
        t = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        self.blocks[t.data_ptr()] = t
        return t.data_ptr()

    def free(self, ptr: int) -> None:
        self.blocks.pop(int(ptr), None)


class _GlooComm:
    """dcp's rounds over torch.distributed point-to-point (gloo), for CPU ranks: the k-th send
    from a to b in round r meets the k-th receive on b from a in round r (tag r, in order)."""

    def __init__(self, group: Any):
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.pending: Dict[int, list] = {}

    def start(self, round_id: int, ops: list) -> None:
        works = []
        for peer, send, ptr, nbytes in ops:
            if nbytes == 0:
                continue
            buf = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
            peer_rank = self.ranks[peer]
            if send:
                works.append((self.dist.isend(buf, peer_rank, group=self.group, tag=round_id), buf))
            else:
                works.append((self.dist.irecv(buf, peer_rank, group=self.group, tag=round_id), buf))
        self.pending[round_id] = works

    def wait(self, round_id: int, timeout_s: float) -> None:
        works = self.pending.pop(round_id, None)
        if works is None:
            raise RuntimeError(f"round {round_id} was not started")
        for work, _ in works:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))

    def barrier(self, timeout_s: float) -> None:
        self.dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=timeout_s))

    def abort(self, reason: str) -> None:
        self.pending.clear()


class _Runtime:
    def __init__(self, group: Any, rank: int, world: int, device: torch.device):
        self.device = device
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.backend = _dcp.cuda_backend(index, _raw_stream(device),
                                             _TorchAllocator(device), _config["forward_kernel"],
                                             _config["backward_kernel"], _config["dq_reduction"],
                                             _switch(_config["deterministic"]),
                                             _switch(_config["deterministic_one_pass"]),
                                             _switch(_config["deterministic_ordered"]))
            self.comm = _dcp.self_comm(False) if world == 1 else self._nccl(group, rank, world, index)
        elif device.type == "cpu":
            self.backend = _dcp.cpu_backend()
            if world == 1:
                self.comm = _dcp.self_comm(True)
            elif _config["cpu_comm"] == "mpi":
                self.comm = _dcp.mpi_comm_world()
                if self.comm.world_size != world:
                    raise ValueError(f"cpu_comm='mpi': MPI has {self.comm.world_size} ranks, the plan's group {world}")
            else:
                self.comm = _dcp.python_comm(_GlooComm(self._cpu_group(group)), rank, world, True)
        else:
            raise ValueError(f"dcp attention: tensors on {device}: only cpu and cuda are supported")

    @staticmethod
    def _nccl(group: Any, rank: int, world: int, index: int):
        import torch.distributed as dist

        # NVLink multicast stays off unless the environment says otherwise (shared GPU hosts).
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        uid = [_dcp.nccl_unique_id() if rank == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None and group != dist.group.WORLD else 0
        dist.broadcast_object_list(uid, src=src, group=group)
        return _dcp.nccl_comm(uid[0], rank, world, index, bool(_config["nccl_blocking_wait"]))

    @staticmethod
    def _cpu_group(group: Any):
        import torch.distributed as dist

        backend = dist.get_backend(group)
        if str(backend) == "gloo":
            return group
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        return dist.new_group(ranks=ranks, backend="gloo")


_RUNTIMES: Dict[Tuple[Any, str], _Runtime] = {}
_runtime_lock = threading.Lock()


def shutdown() -> None:
    """Drops dcp's communicators and backends (call before torch.distributed.destroy_process_group;
    plans still alive keep theirs until they are released). Later calls make new ones."""
    with _runtime_lock:
        _RUNTIMES.clear()


atexit.register(shutdown)  # comms and backends go before the interpreter does


def _runtime(plan: StepPlan, device: torch.device) -> _Runtime:
    key = (id(plan.group) if plan.group is not None else None, str(device))
    with _runtime_lock:
        rt = _RUNTIMES.get(key)
        if rt is None:
            rt = _RUNTIMES[key] = _Runtime(plan.group, plan.rank, plan.group_size, device)
    return rt


_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what compiled code calls


def _raw_stream(device: torch.device) -> int:
    """The current CUDA stream of `device` as an integer handle (0: the legacy default stream)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _get_raw_stream is not None:
        return _get_raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _attention_of(plan: StepPlan, device: torch.device):
    """The plan's runner on `device` (made on first use: scratch, and the plan's work lists
    uploaded in one copy); on a GPU, bound to the current stream."""
    entry = plan.runtime_state.get(device)
    if entry is None:
        cuda = device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            # Making a runner uploads the plan's work lists and waits for the copy: no work a
            # graph capture may contain (and its first NCCL set-up could not be captured either).
            raise RuntimeError(f"dcp attention: step {plan.step}'s plan has no runner on {device} yet, and the "
                               "stream is capturing a CUDA graph; call dcp.torch.prepare(plan) (or run the "
                               "step once) before the capture")
        rt = _runtime(plan, device)
        if cuda:
            rt.backend.set_stream(_raw_stream(device))
        attn = _dcp.Attention(plan.plan, rt.backend, rt.comm, float(_config["timeout_s"]))
        entry = plan.runtime_state[device] = (attn, rt.backend if cuda else None)
        plan.runtime_state[("backend", str(device))] = rt.backend
        return attn
    attn, backend = entry
    if backend is not None:
        backend.set_stream(_raw_stream(device))
    return attn


def prepare(plan: StepPlan, device: Any = None) -> None:
    """Builds the plan's runner on `device` now (default: the current CUDA device, else the CPU):
    its scratch, and its tile and work lists made on the host and uploaded, which otherwise
    happens in the step's first attention call while the GPU waits. Call it for the next step's
    plan once the current step's work is queued (after loss.backward()), so that this host work
    runs under the GPU's. Holds the plan's scratch from then on (released with the plan)."""
    if not isinstance(plan, StepPlan):
        raise TypeError(f"dcp.torch.prepare: expected a StepPlan (Planner.get), got {type(plan).__name__}")
    plan.check_usable()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    _attention_of(plan, torch.device(device))


# ---- the operator ----------------------------------------------------------------------------
def _code(t: torch.Tensor) -> int:
    if t.dtype == torch.bfloat16:
        return 1
    if t.dtype == torch.float32:
        return 0
    raise TypeError(f"dcp attention: tensors must be bfloat16 or float32, got {t.dtype}")


def _view(t: torch.Tensor):
    n, s = t.shape, t.stride()
    return (t.data_ptr(), _code(t), n[0], n[1], n[2], s[0], s[1])


def _lse_view(t: torch.Tensor):
    n, s = t.shape, t.stride()
    return (t.data_ptr(), 0, n[0], n[1], 1, s[0], s[1])


def _check_tokens(plan: StepPlan, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.shape[0] != plan.num_tokens:
            raise ValueError(f"dcp attention: {t.shape[0]} tokens, but rank {plan.rank} holds {plan.num_tokens} "
                             f"tokens of step {plan.step} (dispatch the inputs with plan.dispatch)")


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  handle: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    plan = _plan_of(handle)
    _check_tokens(plan, q)  # k and v match q (attention() checks; the core checks again)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    _attention_of(plan, q.device).forward(_view(q), _view(k), _view(v), _view(o), _lse_view(lse))
    return o, lse


def _backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   d_o: torch.Tensor, handle: torch.Tensor,
                   d_lse: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = _plan_of(handle)
    _check_tokens(plan, q, d_o)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if d_lse is not None:
        d_lse = d_lse.float()
        if tuple(d_lse.shape) != tuple(lse.shape):
            raise ValueError(f"dcp attention: the gradient of lse is {tuple(d_lse.shape)}, lse {tuple(lse.shape)}")
    _attention_of(plan, q.device).backward(_view(q), _view(k), _view(v), _view(o), _lse_view(lse), _view(d_o),
                                           _view(dq), _view(dk), _view(dv),
                                           None if d_lse is None else _lse_view(d_lse))
    return dq, dk, dv


# The operator as torch.compile sees it: custom ops with fake kernels and autograd.
@torch.library.custom_op("dcp::attention_forward", mutates_args=())
def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       handle: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, handle)


@_attention_forward.register_fake
def _(q, k, v, handle):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("dcp::attention_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                        d_o: torch.Tensor, handle: torch.Tensor,
                        d_lse: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(q, k, v, o, lse, d_o, handle, d_lse)


@_attention_backward.register_fake
def _(q, k, v, o, lse, d_o, handle, d_lse=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, handle = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, handle)
    ctx.set_materialize_grads(False)  # an unused lse (or o) passes None, not a tensor of zeros


def _gradients_in(o, d_o):
    """The upstream gradient of o as the kernels take it: zeros when only lse was used."""
    if d_o is None:
        return torch.zeros_like(o)
    return d_o if d_o.stride(-1) == 1 else d_o.contiguous()


def _backward(ctx, d_o, d_lse):
    q, k, v, o, lse, handle = ctx.saved_tensors
    d_o = _gradients_in(o, d_o)
    dq, dk, dv = torch.ops.dcp.attention_backward(q, k, v, o, lse, d_o, handle, d_lse)
    return dq, dk, dv, None


torch.library.register_autograd("dcp::attention_forward", _backward, setup_context=_setup_context)


def _profiled(name: str):
    """A profiler range named as the custom op (which the dispatcher labels by itself), so
    torch.profiler traces of eager runs show dcp's calls too; nothing while no profiler runs."""
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", True):
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


class _EagerAttention(torch.autograd.Function):
    """The same implementation without the dispatcher's custom-op layer (which costs about 15 us
    of host time a call): what eager mode runs. Under torch.compile the custom ops are used."""

    @staticmethod
    def forward(ctx, q, k, v, handle):
        with _profiled("dcp::attention_forward"):
            o, lse = _forward_impl(q, k, v, handle)
        ctx.save_for_backward(q, k, v, o, lse, handle)
        ctx.set_materialize_grads(False)  # an unused lse (or o) passes None, not a tensor of zeros
        return o, lse

    @staticmethod
    def backward(ctx, d_o, d_lse):
        q, k, v, o, lse, handle = ctx.saved_tensors
        with _profiled("dcp::attention_backward"):
            dq, dk, dv = _backward_impl(q, k, v, o, lse, _gradients_in(o, d_o), handle, d_lse)
        return dq, dk, dv, None


def _as_input(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() != 3:
        raise ValueError(f"dcp attention: {name} must be [tokens, heads, head_dim], got {tuple(t.shape)}")
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any, layer: int = 0,
              return_lse: bool = False):
    """Exact attention of the step's plan over this rank's q, k, v (see the module's help).

    plan: the StepPlan (Planner.get) or its handle (plan.handle). layer: the model layer (any
    order; every layer of a step shares the plan). Returns o, or (o, lse) with return_lse (lse
    [tokens, q_heads] fp32, natural log of each row's softmax denominator, differentiable: a loss
    that reads it, as learned sink logits do, gets its gradient through Delta)."""
    handle = plan if isinstance(plan, torch.Tensor) else handle_of(plan)
    q, k, v = _as_input(q, "q"), _as_input(k, "k"), _as_input(v, "v")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"dcp attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    device = q.device
    if k.device != device or v.device != device:
        raise ValueError(f"dcp attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    qs, ks = q.shape, k.shape
    if qs[2] != ks[2] or ks != v.shape or qs[0] != ks[0]:
        raise ValueError(f"dcp attention: shapes q {tuple(qs)}, k {tuple(ks)}, v {tuple(v.shape)} do not "
                         "fit [T, Hq, D], [T, Hkv, D], [T, Hkv, D]")
    if qs[1] % ks[1] != 0:
        raise ValueError(f"dcp attention: {qs[1]} query heads are not a multiple of {ks[1]} kv heads")
    if device.type == "meta" or torch.compiler.is_compiling():
        o, lse = torch.ops.dcp.attention_forward(q, k, v, handle)
    else:
        o, lse = _EagerAttention.apply(q, k, v, handle)
    return (o, lse) if return_lse else o


class Attention(torch.nn.Module):
    """Attention over a DCP plan as a module: forward(q, k, v, plan) with q [T, Hq, D] and k, v
    [T, Hkv, D] of this rank's tokens. The module holds no parameters; `layer` names it."""

    def __init__(self, layer: int = 0):
        super().__init__()
        self.layer = layer

    def forward(self, q, k, v, plan):
        return attention(q, k, v, plan, self.layer)
