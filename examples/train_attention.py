"""Attention for examples/train.py: one backend per mode, all with the same per-step interface.

A backend turns a global Step (train_data) into this rank's part of it (`Local`): token ids,
labels and RoPE positions of the tokens this rank holds, in the order its attention expects, the
step's global target count (the loss denominator), and `attend(q, k, v, layer)` for the model.

  DcpBackend    dcp.torch.attention on the step's plan. The plan's method is 'dcp' or one of the
                static layouts (ring, zigzag, ulysses, a2a_p2p, packing): the same executor and
                kernels run all of them, only the placement differs. Plans are made ahead on the
                planner's threads.
  FlexBackend   one process holds the whole step: FlexAttention with a document mask of the
                step's kind (the single-GPU reference).
  TorchCPBackend PyTorch's native context parallelism with FlexAttention: the step is cut into
                equal contiguous shards after a processing-time round-robin reordering of 128-token
                blocks (_PTRRLoadBalancer), keys and values are all-gathered before each
                attention, the block mask is rewritten for the local queries.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

import dcp
import dcp.torch as dcp_torch

from train_data import IGNORE_INDEX, Step, layer_pattern, rank_share, token_tables


@dataclass
class Local:
    """This rank's part of one step."""
    ids: torch.Tensor        # [T] int64
    labels: torch.Tensor     # [T] int64, IGNORE_INDEX where no target
    positions: torch.Tensor  # [T] int64, positions inside documents
    num_targets: int         # targets of the whole step, over every rank
    attend: Callable         # (q, k, v, layer) -> o
    stats: Dict[str, float] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None


def _global_tensors(step: Step, device: torch.device):
    ids = torch.from_numpy(step.tokens.astype(np.int64)).to(device, non_blocking=True)
    labels_np = step.labels()
    labels = torch.from_numpy(labels_np).to(device, non_blocking=True)
    positions = torch.from_numpy(step.positions()).to(device, non_blocking=True)
    return ids, labels, positions, int((labels_np != IGNORE_INDEX).sum())


class _NodeRecorder:
    """Remembers the autograd node names of attention outputs, so that the profiler's
    'evaluate_function: <node>' events (the attention backward) can be found by name."""

    def __init__(self):
        self.names: set = set()

    def note(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if t.grad_fn is not None:
                self.names.add(t.grad_fn.name())


class _OneAhead:
    """An iterator that can take its next item early (peek) and hands it out in turn: what a
    backend's prepare_next builds during one step is the next step's."""

    def __init__(self, it):
        self._it = iter(it)
        self._held = []

    def __iter__(self):
        return self

    def __next__(self):
        return self._held.pop() if self._held else next(self._it)

    def peek(self):
        """The next item (None at the end), taken now if it was not yet."""
        if not self._held:
            try:
                self._held.append(next(self._it))
            except StopIteration:
                return None
        return self._held[0]


# ---- dcp and the static layouts ----------------------------------------------------------------
class DcpBackend:
    def __init__(self, method: str, shape: Tuple[int, int, int], dtype: str, device: torch.device,
                 block_size: int, stages: int, threads: int, lookahead: int, cluster: str = "h200-nvl",
                 outputs_in_place: Optional[bool] = None, search_blocks: Optional[List[int]] = None,
                 layer_kinds: Optional[List[str]] = None, per_rank_data: bool = False):
        self.method = method
        # Layers of several mask kinds (the model's kind of every layer, train_data.layer_pattern):
        # each step is planned as dcp.LayerKinds weighed by the layers of each kind, one plan per
        # kind on one token placement; layer i runs the plan of layer_kinds[i].
        self.layer_kinds = layer_kinds if layer_kinds and len(set(layer_kinds)) > 1 else None
        self.kind_layers = {k: layer_kinds.count(k) for k in dict.fromkeys(layer_kinds)} if self.layer_kinds else None
        self.device = device
        self.nodes = _NodeRecorder()
        options = {"method": method, "block_size": block_size, "stages": stages}
        if outputs_in_place is not None:
            options["outputs_in_place"] = outputs_in_place
        if search_blocks and method == "dcp":  # the static layouts keep block_size
            options.update(search=True, search_block_sizes=search_blocks)
        # Per-rank data: each rank reads only its share of a step's documents (those starting in its
        # 1/world of the tokens), as a data loader of its own would, and the planner gathers the
        # shares; packed in rank order they are the step's batch, so the plans are the same.
        self.per_rank_data = per_rank_data
        self.planner = dcp.Planner(None, cluster, options, shape=shape, dtype=dtype, threads=threads,
                                   lookahead=lookahead, per_rank_data=per_rank_data)

    def _share(self, step: Step) -> Tuple[int, int]:
        """The documents [first, last) this rank reads with per-rank data."""
        return rank_share(step, self.planner.rank, self.planner.world_size)

    def iterate(self, steps: Iterator[Step]) -> Iterator[Local]:
        def share(s: Step):
            first, last = self._share(s) if self.per_rank_data else (0, len(s.lengths))
            if self.layer_kinds:
                masks = dcp.LayerKinds({k: m[first:last] for k, m in s.kind_masks.items()}, layers=self.kind_layers)
            else:
                masks = s.masks[first:last]
            return s.lengths[first:last], masks, s

        items = (share(s) for s in steps)
        plans = self.planner.iterate(items)
        self._ahead = _OneAhead(plans)
        try:
            for _, item, plan in self._ahead:
                yield self._local(item[2], plan)
        finally:
            plans.close()  # drops the planner's lookahead steps

    def prepare_next(self) -> None:
        """Takes the next step's plan now and builds its runner (dcp.torch.prepare) while the GPU
        runs this step: call it once this step's work is queued."""
        nxt = self._ahead.peek()
        if nxt is not None:
            plan = nxt[2]
            for kind in plan.kinds or (None,):
                dcp_torch.prepare(plan.kind(kind) if kind else plan, self.device)

    def _local(self, step: Step, plan) -> Local:
        ids, labels, positions, num_targets = _global_tensors(step, self.device)
        if self.per_rank_data:  # this rank's documents only; the step's target count summed over ranks
            first, last = self._share(step)
            begin, end = sum(step.lengths[:first]), sum(step.lengths[:last])
            ids, labels = ids[begin:end], labels[begin:end]
            num_targets = plan.num_targets(labels, IGNORE_INDEX)
        nodes = self.nodes

        kinds = self.layer_kinds
        plans = [plan.kind(k) for k in kinds] if kinds else [plan]

        def attend(q, k, v, layer):
            o = dcp_torch.attention(q, k, v, plans[layer % len(plans)], layer)
            nodes.note(o)
            return o

        stats = dict(self.planner.stats(plan.step))
        stats["local_tokens"] = plan.num_tokens
        stats["block_size"] = plan.plan.block_size
        # 1 when the planner's search chose a static layout's plan for this step (its candidates
        # include them on several ranks), or the mode is a static layout.
        stats["static_layout"] = 0.0 if plan.plan.method == "dcp" else 1.0
        return Local(plan.dispatch(ids), plan.dispatch(labels), plan.positions(self.device), num_targets, attend,
                     stats=stats, release=plan.release)


# ---- FlexAttention -------------------------------------------------------------------------------
def mask_mod_for(kind: str, tables: Dict[str, torch.Tensor], sink: int, window: int):
    """The FlexAttention mask_mod of a packed step (indices are global token indices); the rule
    per kind is the one documented in train_data.token_tables. Each kind gets its own, simplest
    function: FlexAttention evaluates it on every partially masked block."""
    doc = tables["doc"]
    if kind == "causal":
        def causal(b, h, q, k):
            return (doc[q] == doc[k]) & (k <= q)
        return causal
    if kind == "lambda":
        start = tables["start"]

        def lambda_(b, h, q, k):
            return (doc[q] == doc[k]) & (k <= q) & ((k - start[q] < sink) | (q - k < window))
        return lambda_
    if kind == "shared_question":
        question_end, segment = tables["question_end"], tables["segment"]

        def shared_question(b, h, q, k):
            return (doc[q] == doc[k]) & (k <= q) & ((k < question_end[q]) | (k >= segment[q]))
        return shared_question
    if kind == "chunked":
        chunk_start = tables["chunk_start"]

        def chunked(b, h, q, k):
            return (doc[q] == doc[k]) & (k <= q) & (k >= chunk_start[q])
        return chunked
    raise ValueError(f"mask '{kind}': FlexAttention masks exist for causal, lambda, shared_question and chunked")


class FlexBackend:
    """The whole step on one process. On CUDA both create_block_mask and flex_attention are
    compiled (the eager block-mask builder materialises the dense mask: out of memory near 100K
    tokens; eager flex_attention materialises the scores). FlexAttention has no backward on
    CPUs, so there the same mask_mod is evaluated into a dense mask for PyTorch's SDPA: the
    tests still check the mask functions and everything around the kernel. fp32: attention runs on
    q, k, v cast to fp32 and its output is cast back to their type, so that the model around it
    is the same as with bf16 attention and only attention's rounding differs."""

    def __init__(self, kind: str, sink: int, window: int, device: torch.device, compile: Optional[bool] = None,
                 fp32: bool = False):
        from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

        self.kind, self.sink, self.window, self.device, self.fp32 = kind, sink, window, device, fp32
        self.layer_kinds = layer_pattern(kind)  # layer i: layer_kinds[i % len]; one block mask per kind
        self.nodes = _NodeRecorder()
        self.dense = device.type == "cpu"
        self.create_mask = create_mask
        compile = device.type == "cuda" if compile is None else compile
        self.create_block_mask = torch.compile(create_block_mask, dynamic=False) if compile else create_block_mask
        self.flex_attention = torch.compile(flex_attention, dynamic=False) if compile else flex_attention

    def block_mask(self, step: Step, block: bool = False, kind: Optional[str] = None):
        kind = kind or self.layer_kinds[0]
        tables = {k: torch.from_numpy(v).to(self.device, non_blocking=True)
                  for k, v in token_tables(step, step.kind_masks.get(kind)).items()}
        n = step.tokens.shape[0]
        mask_mod = mask_mod_for(kind, tables, self.sink, self.window)
        if self.dense and not block:
            return self.create_mask(mask_mod, 1, 1, n, n, device=self.device)
        return self.create_block_mask(mask_mod, 1, None, n, n, device=self.device)

    def flex(self, q, k, v, block_mask):
        """q [T, Hq, D], k and v [Tk, Hkv, D] -> [T, Hq, D], grouped-query heads."""
        gqa = q.shape[1] != k.shape[1]
        dtype = q.dtype
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
        if self.fp32:
            q, k, v = (t.float() for t in (q, k, v))
        with torch.autocast(self.device.type, enabled=False):
            if self.dense:
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=block_mask, enable_gqa=gqa)
            else:
                o = self.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        self.nodes.note(o)
        return o.to(dtype)[0].transpose(0, 1)

    def iterate(self, steps: Iterator[Step]) -> Iterator[Local]:
        self._ahead = _OneAhead(self._local(s) for s in steps)
        yield from self._ahead

    def prepare_next(self) -> None:
        """Builds the next step's block mask and tensors now, while the GPU runs this step (as
        DcpBackend.prepare_next does for its plans): the two modes hide the same host work."""
        self._ahead.peek()

    def _local(self, step: Step) -> Local:
        t0 = time.perf_counter()
        by_kind = {kind: self.block_mask(step, kind=kind) for kind in dict.fromkeys(self.layer_kinds)}
        masks = [by_kind[kind] for kind in self.layer_kinds]
        ids, labels, positions, num_targets = _global_tensors(step, self.device)
        stats = {"mask_host_ms": (time.perf_counter() - t0) * 1e3, "local_tokens": int(ids.shape[0])}
        return Local(ids, labels, positions, num_targets,
                     lambda q, k, v, layer: self.flex(q, k, v, masks[layer % len(masks)]), stats=stats)


# ---- PyTorch native context parallelism -------------------------------------------------------------
NATIVE_CP_LIMITS = (
    "PyTorch native context parallelism (torch.distributed.tensor.experimental): "
    "its public API, context_parallel(), shards buffers and swaps scaled_dot_product_attention for ring "
    "attention, which only knows full or is_causal attention over ONE sequence: no document (varlen) mask, "
    "so a packed step of many documents cannot be expressed with it (nor lambda or shared-question masks). "
    "Its experimental FlexAttention path (_ContextParallel with AttentionType.FLEX, _context_parallel_shard, "
    "_PTRRLoadBalancer) expresses every mask here, at a price: keys and values of the whole step are "
    "all-gathered before each attention (no overlap with compute, O(step) memory per rank), and the step "
    "must be divisible by world size x 128 tokens.")


def native_cp_missing() -> Optional[str]:
    """What this torch lacks for the FlexAttention path of native CP (None: nothing)."""
    try:
        from torch.distributed.tensor.experimental._attention import (  # noqa: F401
            _context_parallel_shard, _ContextParallel, _PTRRLoadBalancer)
    except ImportError as e:
        return f"torch {torch.__version__} has no FlexAttention context parallelism ({e})"
    return None


_MESHES: Dict[Tuple[str, int], object] = {}


class TorchCPBackend(FlexBackend):
    def __init__(self, kind: str, sink: int, window: int, device: torch.device, world_size: int):
        missing = native_cp_missing()
        if missing:
            raise NotImplementedError(missing)
        if len(set(layer_pattern(kind))) > 1:
            raise NotImplementedError(f"mask '{kind}': native CP here shards each step by one block mask, so every "
                                      "layer must attend with the same mask")
        super().__init__(kind, sink, window, device)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental._attention import (
            _context_parallel_shard, _ContextParallel, _PTRRLoadBalancer)
        from torch.distributed.tensor.parallel import parallelize_module

        self.world_size = world_size
        key = (device.type, world_size)
        if key not in _MESHES:  # one mesh (and its process group) for every run of the process
            _MESHES[key] = init_device_mesh(device.type, (world_size,), mesh_dim_names=("cp",))
        self.mesh = _MESHES[key]
        self._shard = _context_parallel_shard
        self._balancer = _PTRRLoadBalancer
        backend = self

        class FlexCall(torch.nn.Module):
            """flex_attention as a module, which _ContextParallel hooks: its pre-hook all-gathers
            key and value along the sequence dimension."""

            def forward(self, query, key, value, block_mask=None):
                gqa = query.shape[1] != key.shape[1]
                if backend.dense:  # CPUs: the rewritten mask_mod, dense, for SDPA (see FlexBackend)
                    mask = backend.create_mask(block_mask.mask_mod, 1, 1, query.shape[2], key.shape[2],
                                               device=query.device)
                    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                                            enable_gqa=gqa)
                return backend.flex_attention(query, key, value, block_mask=block_mask, enable_gqa=gqa)

        self.call = parallelize_module(FlexCall(), self.mesh,
                                       _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX))

    def cp_flex(self, q, k, v, block_mask):
        with torch.autocast(self.device.type, enabled=False):
            o = self.call(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                          block_mask=block_mask)
        self.nodes.note(o)
        return o.to(q.dtype)[0].transpose(0, 1)

    def _local(self, step: Step) -> Local:
        """The step's block mask and tensors, sharded (FlexBackend.iterate hands them out, and
        prepare_next builds the next step's under the current one)."""
        n = step.tokens.shape[0]
        if n % (self.world_size * 128) != 0:
            raise NotImplementedError(f"native CP: {n} tokens per step are not divisible by world size x 128 = "
                                      f"{self.world_size * 128}")
        t0 = time.perf_counter()
        global_mask = self.block_mask(step, block=True)
        ids, labels, positions, num_targets = _global_tensors(step, self.device)
        ids, labels, positions, block_mask = self._shard(
            self.mesh, [ids[None], labels[None], positions[None], global_mask], [1, 1, 1, 2],
            load_balancer=self._balancer(global_mask, self.world_size))
        stats = {"mask_host_ms": (time.perf_counter() - t0) * 1e3, "local_tokens": int(ids.shape[1])}
        return Local(ids[0], labels[0], positions[0], num_targets,
                     lambda q, k, v, layer, bm=block_mask: self.cp_flex(q, k, v, bm), stats=stats)
