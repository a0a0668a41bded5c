"""Batches that arrive split over the ranks: every rank's data loader reads its own documents.

The step's batch is then every rank's documents packed in rank order (rank 0's first). Planning
needs the whole batch, so `gather_documents` all-gathers the lengths and masks (a few integers
per document). The tokens themselves stay where they were loaded until `TokenExchange` moves
them: each rank sends every token it loaded to the rank that holds it in the plan, in one
all-to-all. The exchange is a permutation of the batch's rows, so its gradient is the same
all-to-all run the other way, and moving results back to the ranks that loaded them is that
reverse too.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import masks as _masks


def per_document(masks: Any, count: int, where: str) -> List[Any]:
    """`masks` as one normalized spec per document (one spec given for all of them, or a list)."""
    if not isinstance(masks, (list, tuple)) or (isinstance(masks, tuple) and len(masks) == 3
                                                 and isinstance(masks[0], str)):
        masks = [masks] * count
    if len(masks) != count:
        raise ValueError(f"{where}: {len(masks)} masks for {count} documents")
    return [_masks.normalize(m) for m in masks]


def _local_part(lengths: Any, masks: Any) -> Tuple[List[int], Any, Any]:
    """This rank's documents as plain values: (lengths, masks per document or {kind: masks per
    document}, layers of each kind or None)."""
    from . import _dcp
    from .planner import LayerKinds  # the planner imports this module

    if isinstance(lengths, _dcp.Batch):
        raise TypeError("per-rank data takes this rank's documents' lengths and masks, not a dcp.Batch")
    lengths = [int(n) for n in lengths]
    if isinstance(masks, LayerKinds):
        kinds = {name: per_document(m, len(lengths), f"layer kind {name!r}") for name, m in masks.items()}
        return lengths, kinds, masks.layers
    return lengths, per_document(masks, len(lengths), "masks"), None


def gather_documents(group: Any, rank: int, world: int, step: int, lengths: Any, masks: Any):
    """Every rank's documents of `step`, in rank order: (lengths, masks, tokens each rank loaded).
    `masks` comes back as what each rank passed: specs per document, or a LayerKinds whose kinds
    every rank must name alike. Collective over `group`: every rank calls it for the same steps in
    the same order. What is wrong on one rank (a length that is not a number, masks that do not
    match the documents) is raised on every rank, naming that rank, so no rank is left waiting."""
    from .planner import LayerKinds

    try:
        part: Any = ("ok",) + _local_part(lengths, masks)
    except (TypeError, ValueError) as e:
        part = ("error", f"{type(e).__name__}: {e}")
    parts = [(step,) + part]
    if world > 1:
        import torch.distributed as dist

        parts = [None] * world
        dist.all_gather_object(parts, (step,) + part, group=group)
    steps = [p[0] for p in parts]
    if any(s != step for s in steps):
        raise ValueError(f"step {step}: per-rank documents: the ranks submitted different steps together ("
                         + ", ".join(f"rank {r}: step {s}" for r, s in enumerate(steps)) + ")")
    parts = [p[1:] for p in parts]
    bad = [f"rank {r}: {p[1]}" for r, p in enumerate(parts) if p[0] == "error"]
    if bad:
        raise ValueError(f"step {step}: per-rank documents: " + "; ".join(bad))
    kinds = {r: (sorted(p[2]) if isinstance(p[2], dict) else None, p[3]) for r, p in enumerate(parts)}
    if any(k != kinds[0] for k in kinds.values()):
        described = ", ".join(f"rank {r}: " + (f"kinds {k[0]}, layers {k[1]}" if k[0] is not None else "one mask")
                              for r, k in kinds.items())
        raise ValueError(f"step {step}: per-rank documents: ranks disagree on the layer kinds ({described})")
    all_lengths = [n for p in parts for n in p[1]]
    counts = [sum(p[1]) for p in parts]
    if isinstance(parts[0][2], dict):
        names = list(parts[0][2])  # the kinds in rank 0's order (the first one leads)
        layers = dict(zip(names, parts[0][3])) if parts[0][3] is not None else None
        merged: Any = LayerKinds({name: [m for p in parts for m in p[2][name]] for name in names}, layers=layers)
    else:
        merged = [m for p in parts for m in p[2]]
    return all_lengths, merged, counts


class TokenExchange:
    """Moves tokens between the ranks that loaded them and the ranks that hold them in a plan.

    `counts[r]` tokens were loaded by rank r: rows offsets[r] .. offsets[r] + counts[r] - 1 of the
    packed batch. `rows_of(d)` are the rows rank d holds, in the plan's (dispatch) order. On this
    rank:
    - send: the loaded tokens grouped by destination rank, each group in its destination's order
      (`send_index` into the loaded tokens, `send_counts` per destination);
    - receive: the held tokens grouped by the rank that loaded them (`recv_counts` per source);
      `recv_index` says where each received token goes in the held order.
    """

    def __init__(self, counts: Sequence[int], rows_of, rank: int, world: int):
        self.rank, self.world = rank, world
        self.counts = [int(c) for c in counts]
        offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.loaded = self.counts[rank]
        send_parts, self.send_counts = [], []
        for d in range(world):
            rows = np.asarray(rows_of(d), dtype=np.int64)
            mine = rows[(rows >= offsets[rank]) & (rows < offsets[rank + 1])]
            send_parts.append(mine - offsets[rank])
            self.send_counts.append(int(mine.shape[0]))
        self.send_index = np.concatenate(send_parts) if send_parts else np.zeros(0, np.int64)
        held = np.asarray(rows_of(rank), dtype=np.int64)
        self.held = int(held.shape[0])
        source = np.searchsorted(offsets, held, side="right") - 1
        self.recv_index = np.argsort(source, kind="stable").astype(np.int64)
        self.recv_counts = np.bincount(source, minlength=world).astype(np.int64).tolist()
        self._device_index: dict = {}

    def _indices(self, device: Any):
        import torch

        key = str(device)
        if key not in self._device_index:
            self._device_index[key] = (torch.from_numpy(self.send_index).to(device),
                                       torch.from_numpy(self.recv_index).to(device))
        return self._device_index[key]

    def _move(self, x, gather, in_counts, out_counts, scatter, out_rows: int, group: Any):
        """out[scatter] = all_to_all(x[gather]) along dim 0."""
        import torch
        import torch.distributed as dist

        send = x.index_select(0, gather).contiguous()
        recv = x.new_empty((sum(out_counts),) + tuple(x.shape[1:]))
        if self.world > 1:
            dist.all_to_all_single(recv, send, output_split_sizes=list(out_counts),
                                   input_split_sizes=list(in_counts), group=group)
        else:
            recv.copy_(send)
        out = x.new_empty((out_rows,) + tuple(x.shape[1:]))
        return out.index_copy_(0, scatter, recv) if out_rows else out

    def to_plan(self, x, group: Any):
        """Loaded tokens (dim 0) -> the tokens this rank holds in the plan, in dispatch order."""
        send_index, recv_index = self._indices(x.device)
        return self._move(x, send_index, self.send_counts, self.recv_counts, recv_index, self.held, group)

    def to_loader(self, x, group: Any):
        """Held tokens in dispatch order (dim 0) -> the tokens this rank loaded, in loading order."""
        send_index, recv_index = self._indices(x.device)
        return self._move(x, recv_index, self.recv_counts, self.send_counts, send_index, self.loaded, group)


def _autograd_exchange():
    import torch

    class Exchange(torch.autograd.Function):
        """TokenExchange as an autograd step: the gradient goes back the other way."""

        @staticmethod
        def forward(ctx, x, exchange: TokenExchange, group: Any, to_plan: bool):
            ctx.exchange, ctx.group, ctx.to_plan = exchange, group, to_plan
            return exchange.to_plan(x, group) if to_plan else exchange.to_loader(x, group)

        @staticmethod
        def backward(ctx, grad):
            ex = ctx.exchange
            grad = grad.contiguous()
            back = ex.to_loader(grad, ctx.group) if ctx.to_plan else ex.to_plan(grad, ctx.group)
            return back, None, None, None

    return Exchange


_EXCHANGE: Optional[type] = None


def exchange(x, exchange: TokenExchange, group: Any, to_plan: bool, dim: int = 0):
    """Moves `x` along `dim` (to the plan's ranks or back to the loaders), differentiably."""
    global _EXCHANGE
    if _EXCHANGE is None:
        _EXCHANGE = _autograd_exchange()
    moved = x.movedim(dim, 0)
    if not moved.is_contiguous():
        moved = moved.contiguous()
    return _EXCHANGE.apply(moved, exchange, group, to_plan).movedim(0, dim)
