"""Planning ahead: batches go in a step or more before they train, plans come out when needed.

Every rank plans the same batches with the same options, so every rank holds the same plan (the
plan's hash is compared across the group before the plan is used; a mismatch is an error naming
both hashes, never a hang). Planning runs on C++ threads with the GIL released, so the training
loop only waits when a plan is not ready yet; `Planner.stats(step)` says how long it waited.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from . import _dcp
from . import exchange as _exchange


def _options(options: Any) -> _dcp.PlanOptions:
    if isinstance(options, _dcp.PlanOptions):
        return options
    o = _dcp.PlanOptions()
    known = {"method", "block_size", "q_heads_per_group", "stages", "eps_compute", "eps_memory", "seed", "search",
             "search_block_sizes", "search_eps_compute", "search_reseed_best", "search_tighten_best", "search_threads",
             "search_static_layouts", "outputs_in_place", "placement_threads"}
    for key, value in dict(options or {}).items():
        if key not in known:
            raise ValueError(f"plan option '{key}': expected one of {sorted(known)}")
        setattr(o, key, value)
    o.validate()
    return o


def auto_preset() -> str:
    """The preset measured on this process's GPU (its current CUDA device under torch, else device
    0): 'h100-sxm' on an H100, 'h200-nvl' on an H200 and wherever no GPU or no measured preset is
    found. The planner's memory bound and the simulator's calibration (search) then fit the card."""
    device = 0
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.current_device()
    except ImportError:
        pass
    return _dcp.cluster_preset_for_gpu(_dcp.cuda_device_name(device)) or "h200-nvl"


def _cluster(cluster: Any, world_size: int, devices_per_node: Optional[int], group: Any = None) -> _dcp.Cluster:
    """The cluster model of a group of world_size ranks. A preset's node size: devices_per_node
    where given, else the group's own layout (dcp.launch.node_layout: which of its ranks share a
    machine), else one node."""
    if isinstance(cluster, _dcp.Cluster):
        c = cluster
    elif isinstance(cluster, str) and cluster.endswith(".json"):
        c = _dcp.load_cluster(cluster)
    else:
        preset = auto_preset() if cluster in (None, "", "auto") else cluster
        if devices_per_node:
            per_node = devices_per_node
        elif group is not None and world_size > 1:
            from .launch import node_layout

            per_node = node_layout(group)[1]
        else:
            per_node = world_size
        per_node = max(1, min(per_node, world_size))
        if world_size % per_node != 0:
            raise ValueError(f"cluster: {world_size} ranks do not fill nodes of {per_node} devices")
        c = _dcp.cluster(preset, world_size // per_node, per_node)
    if c.num_devices != world_size:
        raise ValueError(f"cluster {c!r} has {c.num_devices} devices, the group {world_size} ranks")
    return c


def make_batch(lengths: Sequence[int], masks: Any, shape: Tuple[int, int, int], dtype: str = "bf16",
               validate: bool = True) -> _dcp.Batch:
    """A batch (checked unless validate=False): `masks` is one spec per sequence (dcp.masks), or
    one spec for all."""
    lengths = [int(n) for n in lengths]
    specs = _exchange.per_document(masks, len(lengths), "make_batch")
    q_heads, kv_heads, head_dim = shape
    return _dcp.make_batch(lengths, specs, int(q_heads), int(kv_heads), int(head_dim), dtype, validate)


class LayerKinds(dict):
    """The masks of a step whose layers attend differently, by layer kind: {name: masks}, each
    value what `Planner.submit` takes as masks (one spec for every document, or one per document),
    e.g. LayerKinds({"global": "causal", "local": dcp.masks.lambda_mask(64, 4096)}). Every kind is
    planned on one token placement: each rank holds the same tokens, in the same order, for every
    kind, and `plan.kind(name)` is the plan that kind's layers run (dcp.torch.attention).
    `layers` ({name: how many layers}, default one each) weighs the kinds in the planner's choices
    (whose token homes every kind shares, and with option `search` the block size): the plans
    predicted fastest over all layers are kept."""

    def __init__(self, kinds: Any, *, layers: Optional[Dict[str, float]] = None):
        super().__init__(kinds)
        if not self:
            raise ValueError("LayerKinds: no layer kinds")
        for name in self:
            if not isinstance(name, str):
                raise TypeError(f"LayerKinds: kind names are strings, got {name!r}")
        self.layers = None
        if layers is not None:
            if set(layers) != set(self):
                raise ValueError(f"LayerKinds: layers names kinds {sorted(layers)}, the kinds are {sorted(self)}")
            for name, n in layers.items():
                if not n > 0:
                    raise ValueError(f"LayerKinds: kind {name!r} has {n} layers (must be > 0)")
            self.layers = [float(layers[name]) for name in self]


class StepPlan:
    """One step's plan as this rank uses it: which tokens it holds and how to run its attention.

    Tokens: `rows(device)` are the rows of the packed global batch this rank holds, in the order
    attention expects them (dispatch order); `dispatch(x)` gathers them from any per-token tensor,
    `positions(device)` are their positions inside their documents (RoPE ids). Attention:
    dcp.torch.attention(q, k, v, plan, layer). `release()` frees its scratch early; otherwise it
    goes with the object.

    With per-rank data (Planner(per_rank_data=True)) each rank loaded its own documents:
    `dispatch` takes this rank's loaded tokens and `undispatch` gives them back, each one
    all-to-all over the group; `loaded_tokens[r]` is how many rank r loaded.
    """

    def __init__(self, plan: _dcp.Plan, step: int, rank: int, group: Any, planner: "Planner",
                 kinds: Optional[Dict[str, _dcp.Plan]] = None, masks: Any = None,
                 loaded_tokens: Optional[Sequence[int]] = None):
        self.plan = plan
        # The masks it was planned for, as submitted (one spec, or one per document; a kind's own
        # for a step of LayerKinds; None for a dcp.Batch): what dcp.hf checks a layer against.
        self.masks = masks.get(next(iter(masks))) if isinstance(masks, LayerKinds) else masks
        self.step = step
        self.rank = rank
        self.group = group
        self.world_size = plan.world_size
        self.group_size = planner.world_size  # the ranks that run it (checked against world_size)
        self.num_tokens = plan.num_tokens(rank)
        self.loaded_tokens = None if loaded_tokens is None else [int(c) for c in loaded_tokens]
        self._exchange: Optional[_exchange.TokenExchange] = None
        self._planner = planner
        self._cache: Dict[Any, Any] = {}
        self._released = False
        self.runtime_state: Dict[Any, Any] = {}  # dcp.torch keeps its per-device runtime here
        # Layer kinds (LayerKinds): this object is the first kind's plan and holds the others'.
        self._kinds: Dict[str, Optional["StepPlan"]] = {}
        for i, (name, p) in enumerate((kinds or {}).items()):
            kind_masks = masks.get(name) if isinstance(masks, LayerKinds) else None
            self._kinds[name] = None if i == 0 else StepPlan(p, step, rank, group, planner, masks=kind_masks,
                                                             loaded_tokens=loaded_tokens)

    # ---- layer kinds -------------------------------------------------------------------------
    @property
    def kinds(self) -> Tuple[str, ...]:
        """The step's layer kinds (LayerKinds), in the order given; () for a step of one mask."""
        return tuple(self._kinds)

    def kind(self, name: str) -> "StepPlan":
        """The plan of layer kind `name`: the same tokens on this rank as every other kind's."""
        if name not in self._kinds:
            raise KeyError(f"step {self.step}: no layer kind {name!r} (kinds: {list(self._kinds) or 'none'})")
        sub = self._kinds[name]
        return self if sub is None else sub

    # ---- tokens ----------------------------------------------------------------------------
    def _tensor(self, what: str, device: Any):
        import torch

        key = (what, str(device))
        if key not in self._cache:
            arr = {"rows": self.plan.local_rows, "positions": self.plan.local_positions,
                   "sequences": self.plan.local_sequences}[what](self.rank)
            self._cache[key] = torch.from_numpy(arr).to(device=device, dtype=torch.int64, non_blocking=True)
        return self._cache[key]

    def rows(self, device: Any = "cpu"):
        """Rows of the global batch this rank holds, in dispatch order (int64 tensor)."""
        return self._tensor("rows", device)

    def positions(self, device: Any = "cpu"):
        """Position of each local token inside its document (int64 tensor): RoPE position ids."""
        return self._tensor("positions", device)

    def sequences(self, device: Any = "cpu"):
        """Document index of each local token (int64 tensor)."""
        return self._tensor("sequences", device)

    def _token_exchange(self) -> _exchange.TokenExchange:
        if self._exchange is None:
            self._exchange = _exchange.TokenExchange(self.loaded_tokens, self.plan.local_rows, self.rank,
                                                     self.world_size)
        return self._exchange

    def dispatch(self, x, dim: int = 0):
        """This rank's tokens of a per-token tensor of the whole packed batch (`dim` indexes tokens).
        With per-rank data, `x` holds the tokens this rank loaded, and every rank of the group calls
        it (an all-to-all; differentiable: the gradient goes back to the loading ranks)."""
        if self.loaded_tokens is not None:
            if x.shape[dim] != self.loaded_tokens[self.rank]:
                raise ValueError(f"dispatch: tensor has {x.shape[dim]} tokens along dim {dim}; with per-rank data "
                                 f"it holds the {self.loaded_tokens[self.rank]} tokens rank {self.rank} loaded")
            return _exchange.exchange(x, self._token_exchange(), self.group, True, dim)
        if x.shape[dim] != self.plan.total_tokens:
            raise ValueError(f"dispatch: tensor has {x.shape[dim]} tokens along dim {dim}, the step's batch "
                             f"{self.plan.total_tokens}")
        return x.index_select(dim, self.rows(x.device))

    def undispatch(self, x, dim: int = 0):
        """The whole packed batch from every rank's local tokens (all-gather over the group); with
        one rank, the inverse of dispatch. With per-rank data, the inverse of dispatch: the tokens
        this rank loaded, in loading order (an all-to-all; differentiable)."""
        import torch

        if x.shape[dim] != self.num_tokens:
            raise ValueError(f"undispatch: tensor has {x.shape[dim]} tokens, this rank holds {self.num_tokens}")
        if self.loaded_tokens is not None:
            return _exchange.exchange(x, self._token_exchange(), self.group, False, dim)
        x = x.movedim(dim, 0)
        out = x.new_empty((self.plan.total_tokens,) + tuple(x.shape[1:]))
        if self.world_size == 1:
            out.index_copy_(0, self.rows(x.device), x)
            return out.movedim(0, dim)
        import torch.distributed as dist

        most = max(self.plan.num_tokens(r) for r in range(self.world_size))
        padded = x.new_zeros((most,) + tuple(x.shape[1:]))
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        for r, part in enumerate(parts):
            rows = torch.from_numpy(self.plan.local_rows(r)).to(x.device)
            out.index_copy_(0, rows, part[: rows.shape[0]])
        return out.movedim(0, dim)

    def num_targets(self, labels, ignore_index: int = -100) -> int:
        """Loss targets of the whole step (labels of the global batch not equal to ignore_index):
        the denominator that makes a sum of per-rank losses the global mean. With per-rank data,
        `labels` are this rank's loaded ones (or its dispatched ones), summed over the group."""
        count = int((labels != ignore_index).sum().item())
        if self.loaded_tokens is None or self.world_size == 1:
            return count
        import torch
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" else "cpu"
        total = torch.tensor([count], dtype=torch.int64, device=device)
        dist.all_reduce(total, group=self.group)
        return int(total.item())

    @property
    def handle(self):
        """The plan as the attention operator takes it (a one-element tensor; dcp.torch)."""
        from .torch import handle_of

        return handle_of(self)

    # ---- life ----------------------------------------------------------------------------------
    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Frees what running this plan holds (scratch on the device). Using it afterwards is an error."""
        self._released = True
        self.runtime_state.clear()
        self._cache.clear()
        for sub in self._kinds.values():
            if sub is not None:
                sub.release()

    def check_usable(self) -> None:
        if self._released:
            raise ValueError(f"plan of step {self.step} was released")

    def __repr__(self) -> str:
        return (f"StepPlan(step={self.step}, rank={self.rank}/{self.world_size}, tokens={self.num_tokens}/"
                f"{self.plan.total_tokens}, method={self.plan.method}, hash={self.plan.hash:#x})")


class Planner:
    """Plans steps ahead on C++ threads; every rank of `group` gets the same plans.

    group:    a torch.distributed process group (None: the default group if initialised, else a
              single process).
    cluster:  'auto' (the preset measured on this GPU: auto_preset()), a cluster preset name
              ('h200-nvl', 'h100-sxm', 'a100-p4d'), a cluster JSON file or a dcp.Cluster; with a
              preset, devices per node come from the group's layout unless given.
    options:  dict or dcp.PlanOptions: method ('dcp' or a static layout: ring, zigzag, ulysses,
              a2a_p2p, packing), block_size, stages, eps_compute, eps_memory, search,
              placement_threads (threads inside one placement, default 1: `threads` below already
              plans several steps at once), ...
    shape:    (q_heads, kv_heads, head_dim) of the model's attention; dtype its element type.
    threads:  planning threads; lookahead: how many steps `iterate` keeps submitted ahead.
    verify:   compare the plan hash across the group: 'every' plan (default), 'first', 'never'.
    broadcast: plan on rank 0 only and send the plan bytes to the others.
    per_rank_data: each rank submits only the documents its own data loader read; the step's batch
              is every rank's documents in rank order (submit then all-gathers their lengths and
              masks over the group), and StepPlan.dispatch moves the loaded tokens to the ranks
              that hold them.
    reuse_batches: a step whose batch equals one of the last `reuse_batches` distinct batches
              takes its plan without planning again (planning is deterministic: it is the plan it
              would get); 0 plans every step. Fixed-length data then plans once.
    """

    def __init__(self, group: Any = None, cluster: Any = "auto", options: Any = None, *,
                 shape: Tuple[int, int, int], dtype: str = "bf16", threads: int = 4, lookahead: int = 2,
                 verify: str = "every", broadcast: bool = False, devices_per_node: Optional[int] = None,
                 timeout_s: float = 600.0, per_rank_data: bool = False, reuse_batches: int = 2):
        self.group, self.rank, self.world_size = _group_info(group)
        self.shape = tuple(int(x) for x in shape)
        self.dtype = dtype
        self.options = _options(options)
        self.cluster = _cluster(cluster, self.world_size, devices_per_node, self.group)
        if verify not in ("every", "first", "never"):
            raise ValueError(f"verify='{verify}': expected 'every', 'first' or 'never'")
        if lookahead < 0:
            raise ValueError(f"lookahead={lookahead}: must be >= 0")
        self.verify = verify
        self.broadcast = bool(broadcast) and self.world_size > 1
        self.lookahead = int(lookahead)
        self.timeout_s = float(timeout_s)
        self.per_rank_data = bool(per_rank_data)
        self._plans_here = not self.broadcast or self.rank == 0
        self._queue = _dcp.PlanQueue(self.cluster, self.options, int(threads), int(reuse_batches)) \
            if self._plans_here else None
        self._verified = False
        self._closed = False
        self._stats: Dict[int, Dict[str, float]] = {}
        self._submitted: set = set()
        self._kind_names: Dict[int, List[str]] = {}  # steps submitted with LayerKinds
        self._masks: Dict[int, Any] = {}  # each submitted step's masks, for StepPlan.masks
        self._loaded: Dict[int, List[int]] = {}  # per-rank data: the tokens each rank loaded

    def submit(self, step: int, lengths: Any, masks: Any = None) -> None:
        """Queues the batch of `step` (its documents' lengths, one mask each, or a dcp.Batch);
        returns at once. `masks` may be a LayerKinds (a mask per layer kind): get(step) then holds
        one plan per kind on one token placement. The batch is checked on the planning thread:
        what is wrong with it is raised by get(step). With per_rank_data, this rank's documents
        only, and a collective: every rank submits the same steps in the same order."""
        step = int(step)
        if self._closed:
            raise ValueError("the planner was closed")
        if step in self._submitted:
            raise ValueError(f"step {step} was already submitted")
        if self.per_rank_data:
            lengths, masks, self._loaded[step] = _exchange.gather_documents(
                self.group, self.rank, self.world_size, step, lengths, masks)
        if isinstance(masks, LayerKinds):
            if isinstance(lengths, _dcp.Batch):
                raise TypeError(f"step {step}: layer kinds take the documents' lengths, not a dcp.Batch")
            kinds = [make_batch(lengths, m, self.shape, self.dtype, validate=False) for m in masks.values()]
            if self._queue is not None:
                self._queue.submit_kinds(step, kinds, masks.layers or [])
            self._kind_names[step] = list(masks)
            self._masks[step] = masks
        else:
            if isinstance(lengths, _dcp.Batch):
                batch = lengths
                if batch.shape[:3] != self.shape:
                    raise ValueError(f"step {step}: the batch's heads {batch.shape[:3]} are not the planner's {self.shape}")
            else:
                batch = make_batch(lengths, masks, self.shape, self.dtype, validate=False)
            if self._queue is not None:
                self._queue.submit(step, batch)
            self._masks[step] = None if isinstance(lengths, _dcp.Batch) else masks
        self._submitted.add(step)

    def get(self, step: int) -> StepPlan:
        """The plan of `step`, waiting only if it is not ready. A planning error is raised here as
        a dcp.Error whose message starts with 'step N:'."""
        step = int(step)
        if step not in self._submitted:
            raise ValueError(f"step {step} was never submitted (or was already taken)")
        self._submitted.discard(step)
        names = self._kind_names.pop(step, None)
        masks = self._masks.pop(step, None)
        loaded = self._loaded.pop(step, None)
        t0 = time.perf_counter()
        plans = self._queue.get_kinds(step, self.timeout_s) if self._queue is not None else None
        stats = dict(self._queue.stats(step)) if self._queue is not None else {"planning_ms": 0.0, "queued_ms": 0.0, "reused": False}
        if self.broadcast:
            plans = self._broadcast(plans)
        stats["waited_ms"] = (time.perf_counter() - t0) * 1e3
        if self.verify == "every" or (self.verify == "first" and not self._verified):
            self._check_same(plans, step)
            self._verified = True
        self._stats[step] = stats
        while len(self._stats) > 4096:
            self._stats.pop(next(iter(self._stats)))
        kinds = dict(zip(names, plans)) if names is not None else None
        return StepPlan(plans[0], step, self.rank, self.group, self, kinds, masks, loaded)

    def close(self) -> None:
        """Stops the planning threads (a step being planned finishes first) and drops what is
        queued. The planner cannot be used afterwards."""
        self._queue = None
        self._closed = True
        self._submitted.clear()
        self._kind_names.clear()
        self._masks.clear()
        self._loaded.clear()

    def __enter__(self) -> "Planner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self, step: int) -> Dict[str, float]:
        """planning_ms (on a worker), queued_ms, waited_ms (what get() cost the training loop),
        reused (the plan of an earlier step with an equal batch)."""
        return dict(self._stats[int(step)])

    def iterate(self, batches: Iterable[Tuple[Sequence[int], Any]], first_step: int = 0) -> Iterator[Tuple[int, Any, StepPlan]]:
        """Runs over (lengths, masks[, payload]) items, keeping `lookahead` steps submitted ahead;
        yields (step, item, plan)."""
        it = iter(batches)
        window: List[Tuple[int, Any]] = []
        step = first_step
        done = False
        while True:
            while not done and len(window) <= self.lookahead:
                try:
                    item = next(it)
                except StopIteration:
                    done = True
                    break
                self.submit(step, item[0], item[1])
                window.append((step, item))
                step += 1
            if not window:
                return
            s, item = window.pop(0)
            yield s, item, self.get(s)

    # ---- agreement across ranks ----------------------------------------------------------------
    def _broadcast(self, plans):
        import torch.distributed as dist

        obj = [[p.to_bytes() for p in plans] if self.rank == 0 else None]
        dist.broadcast_object_list(obj, src=_global_rank(self.group, 0), group=self.group)
        return plans if self.rank == 0 else [_dcp.plan_from_bytes(b) for b in obj[0]]

    def _check_same(self, plans, step: int) -> None:
        if self.world_size == 1:
            return
        import torch.distributed as dist

        hashes = [None] * self.world_size
        dist.all_gather_object(hashes, tuple(p.hash for p in plans), group=self.group)
        if any(h != hashes[0] for h in hashes):
            raise _dcp.Error(f"InvalidPlan: step {step}: ranks planned different plans (hashes "
                             + ", ".join(f"rank {r}: " + "/".join(f"{x:#x}" for x in h) for r, h in enumerate(hashes))
                             + "): every rank must submit the same lengths, masks and options")


def _group_info(group: Any):
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: one process
        if group is not None:
            raise ValueError("a process group needs torch.distributed")
        return None, 0, 1
    if group is None and dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
    if group is None:
        return None, 0, 1
    return group, dist.get_rank(group), dist.get_world_size(group)


def _global_rank(group: Any, rank: int) -> int:
    import torch.distributed as dist

    return dist.get_global_rank(group, rank) if group is not None and group != dist.group.WORLD else rank
