"""Hugging Face transformers: attn_implementation="dcp".

    import dcp.hf
    dcp.hf.register()
    model = LlamaForCausalLM(config)               # config._attn_implementation = "dcp"
    out = model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions(dev)[None],
                labels=..., dcp_plan=plan)         # or: with dcp.hf.use_plan(plan): ...

The model sees one sequence of this rank's tokens (batch size 1); masks come from the plan, so
no attention mask is built. Position ids must be the plan's positions (RoPE per document).
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Optional

import torch

from . import torch as dcp_torch

_local = threading.local()


@contextlib.contextmanager
def use_plan(plan: Any):
    """Within the block, attention with attn_implementation="dcp" runs on `plan`."""
    previous = getattr(_local, "plan", None)
    _local.plan = plan
    try:
        yield plan
    finally:
        _local.plan = previous


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
               **kwargs: Any):
    plan = kwargs.get("dcp_plan") or getattr(_local, "plan", None)
    if plan is None:
        raise ValueError("attn_implementation='dcp' needs a plan: pass dcp_plan=plan to the model, or run it inside "
                         "dcp.hf.use_plan(plan)")
    if dropout:
        raise ValueError("attn_implementation='dcp': attention dropout is not supported (set attention_dropout=0)")
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        raise ValueError(f"attn_implementation='dcp': softmax scale {scaling} is not 1/sqrt(head_dim)")
    if query.shape[0] != 1:
        raise ValueError(f"attn_implementation='dcp': batch size {query.shape[0]}; pack a step into one sequence of "
                         "this rank's tokens (batch size 1)")
    # [1, heads, tokens, dim] -> [tokens, heads, dim]: a strided view, no copy.
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    o = dcp_torch.attention(q, k, v, plan, getattr(module, "layer_idx", 0) or 0)
    return o.unsqueeze(0), None  # [1, tokens, heads, dim], no weights


def _no_mask(*args: Any, **kwargs: Any):
    return None


def register(name: str = "dcp") -> None:
    """Registers `name` as an attention implementation (and as needing no mask) in transformers."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, _attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # older transformers build no mask per implementation
        return
    AttentionMaskInterface.register(name, _no_mask)
