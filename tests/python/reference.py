"""Dense fp64 attention per document in plain PyTorch: what the tests hold dcp against.

Masks come from dcp.masks.allowed_ranges (Python, row by row), not from the C++ closed forms."""
from __future__ import annotations

import math
from typing import List, Sequence

import torch

import dcp


def dense_mask(spec, length: int) -> torch.Tensor:
    m = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for b, e in dcp.masks.allowed_ranges(spec, length, i):
            m[i, b:e] = True
    return m


def attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], specs: List):
    """o, lse of packed documents: q [N, Hq, D], k, v [N, Hkv, D], any dtype; computed in fp64,
    differentiable. Rows with no allowed key: o = 0, lse = -inf."""
    q, k, v = q.double(), k.double(), v.double()
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    outs, lses = [], []
    start = 0
    for length, spec in zip(lengths, specs):
        sl = slice(start, start + length)
        qs = q[sl].transpose(0, 1)                                          # [Hq, L, D]
        ks = k[sl].transpose(0, 1).repeat_interleave(hq // hkv, dim=0)      # [Hq, L, D]
        vs = v[sl].transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        s = qs @ ks.transpose(1, 2) / math.sqrt(d)
        mask = dense_mask(spec, length)
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                   # [Hq, L]
        p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
        p = p.masked_fill(~mask, 0.0)
        outs.append((p @ vs).transpose(0, 1))
        lses.append(lse.transpose(0, 1))
        start += length
    return torch.cat(outs), torch.cat(lses)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), finite):
        return float("inf")
    diff = (got[finite] - want[finite]).norm()
    scale = want[finite].norm()
    return float(diff / scale) if scale > 0 else float(diff)
