"""Hugging Face transformers: attn_implementation="dcp".

    import dcp.hf
    dcp.hf.register()
    model = LlamaForCausalLM(config)               # config._attn_implementation = "dcp"
    out = model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions(dev)[None],
                labels=..., dcp_plan=plan)         # or: with dcp.hf.use_plan(plan): ...

The model sees one sequence of this rank's tokens (batch size 1); masks come from the plan, so
no attention mask is built. Position ids must be the plan's positions (RoPE per document).

Models whose layers attend differently (config.layer_types: "full_attention",
"sliding_attention" and "chunked_attention", as Qwen2, Mistral-style, Gemma and Llama 4 configs
name them): plan each step with `dcp.hf.layer_kinds(config)` as the masks; every layer then runs
the plan of its own type.
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
    if kwargs.get("softcap"):
        raise ValueError("attn_implementation='dcp': attention logit soft-capping is not supported (Gemma 2's "
                         "attn_logit_softcapping; set it to None)")
    head_dim = query.shape[-1]
    if query.shape[0] != 1:
        raise ValueError(f"attn_implementation='dcp': batch size {query.shape[0]}; pack a step into one sequence of "
                         "this rank's tokens (batch size 1)")
    layer_plan = _plan_of_layer(plan, module)
    _check_positions(kwargs.get("position_ids"), layer_plan)
    if kwargs.get("sliding_window"):
        _check_window(layer_plan, module, int(kwargs["sliding_window"]))
    if _layer_type(module) == "chunked_attention":
        _check_chunks(layer_plan, module, int(module.config.attention_chunk_size))
    if getattr(module, "is_causal", True) is False:
        _check_bidirectional(layer_plan, module)
    # [1, heads, tokens, dim] -> [tokens, heads, dim]: a strided view, no copy.
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if getattr(module, "attn_temperature_tuning", False) and not getattr(module, "use_rope", True):
        q = _retune_temperature(q, module, layer_plan)
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        # dcp scales scores by 1/sqrt(head_dim); softmax(s q.k) is that of (s sqrt(head_dim) q).k / sqrt(head_dim)
        # (Gemma's query_pre_attn_scalar), and autograd carries the factor into dq.
        q = q * (scaling * math.sqrt(head_dim))
    layer = getattr(module, "layer_idx", 0) or 0
    sinks = kwargs.get("s_aux")
    if sinks is None:
        o = dcp_torch.attention(q, k, v, layer_plan, layer)
    else:
        # Learned sink logits (GPT-OSS): a logit s_h per head beside every row's scores, with no
        # value. The softmax over [scores, s_h] scales the row's output by exp(lse) / (exp(lse) +
        # exp(s_h)) = sigmoid(lse - s_h); lse's gradient reaches q and k through the operator.
        o, lse = dcp_torch.attention(q, k, v, layer_plan, layer, return_lse=True)
        o = (o.float() * torch.sigmoid(lse - sinks.float()[None, :]).unsqueeze(-1)).to(o.dtype)
    return o.unsqueeze(0), None  # [1, tokens, heads, dim], no weights


_positions_checked = False


def _check_positions(position_ids: Optional[torch.Tensor], plan: Any) -> None:
    """The first layer call of the process checks that the model got the plan's positions: a model
    given none counts 0, 1, 2, ... over the rank's tokens, and RoPE would silently see the wrong
    positions. Once only (the comparison waits for the device), and never inside a CUDA graph
    capture; position ids of another shape (several rows, as multimodal RoPE) are not compared."""
    global _positions_checked
    if _positions_checked or position_ids is None or position_ids.numel() != plan.num_tokens:
        return
    if position_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    _positions_checked = True
    if not torch.equal(position_ids.reshape(-1), plan.positions(position_ids.device).to(position_ids.dtype)):
        raise ValueError("attn_implementation='dcp': the model's position_ids are not the plan's positions; pass "
                         "position_ids=plan.positions(device)[None] (each token's position in its document)")


def _temperature(positions: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    return torch.log1p(torch.floor((positions.float() + 1.0) / module.floor_scale)) * module.attn_scale + 1.0


def _retune_temperature(q: torch.Tensor, module: torch.nn.Module, plan: Any) -> torch.Tensor:
    """Llama 4's attention temperature tuning (its layers without RoPE) scales each query by a
    function of its position, which the model takes as the query's index in the sequence it was
    given: here this rank's packed tokens, not the position inside the query's document. The
    factor is replaced by that of the plan's positions (what each document alone would get)."""
    index = torch.arange(q.shape[0], device=q.device)
    fix = _temperature(plan.positions(q.device), module) / _temperature(index, module)
    return (q.float() * fix[:, None, None]).to(q.dtype)


def _layer_type(module: torch.nn.Module) -> Optional[str]:
    """module.layer_type, else config.layer_types[layer_idx] (None where neither says)."""
    kind = getattr(module, "layer_type", None)
    if kind is None:
        types = getattr(getattr(module, "config", None), "layer_types", None)
        idx = getattr(module, "layer_idx", None)
        kind = types[idx] if types is not None and idx is not None else None
    return kind


def _plan_of_layer(plan: Any, module: torch.nn.Module):
    """The plan this layer runs: with layer kinds (dcp.LayerKinds), the kind named by the layer's
    type (module.layer_type, else config.layer_types[layer_idx])."""
    kinds = getattr(plan, "kinds", ())
    if not kinds:
        return plan
    kind = _layer_type(module)
    if kind is None and len(kinds) == 1:  # a model of one layer type that names none (Mistral)
        kind = kinds[0]
    if kind not in kinds:
        raise ValueError(f"attn_implementation='dcp': layer {getattr(module, 'layer_idx', '?')} is of type {kind!r}, "
                         f"but the plan's layer kinds are {list(kinds)} (plan with dcp.hf.layer_kinds(config))")
    return plan.kind(kind)


def _plan_specs(plan: Any):
    """The masks a plan was made for, one spec per entry (None: planned from a dcp.Batch)."""
    from .masks import normalize

    masks = getattr(plan, "masks", None)
    if masks is None:
        return None
    single = not isinstance(masks, (list, tuple)) or (isinstance(masks, tuple) and len(masks) == 3 and
                                                      isinstance(masks[0], str))
    return [normalize(m) for m in ([masks] if single else list(masks))]


def _check_bidirectional(plan: Any, module: torch.nn.Module) -> None:
    """A layer that attends both ways (is_causal False: encoders) must not run a plan of a causal
    kind; full masks, or explicit ranges the caller wrote, are what such a layer means."""
    checked = plan.runtime_state.setdefault("hf_windows_checked", set())
    if "bidirectional" in checked:
        return
    for kind, *_ in _plan_specs(plan) or []:
        if kind not in ("full", "ranges"):
            raise ValueError(f"attn_implementation='dcp': layer {getattr(module, 'layer_idx', '?')} attends both ways "
                             f"(is_causal=False), but its plan's mask is {kind} (plan it with dcp.masks.full())")
    checked.add("bidirectional")


def _check_window(plan: Any, module: torch.nn.Module, window: int) -> None:
    """A layer that attends within a sliding window must run a plan of that window (HF's: the row
    and the window - 1 keys before it, no sink), not silently another mask."""
    from .masks import lambda_mask

    specs = _plan_specs(plan)
    if specs is None:  # planned from a dcp.Batch: nothing to compare
        return
    checked = plan.runtime_state.setdefault("hf_windows_checked", set())
    if window in checked:  # once per plan and window: every layer of the step calls this
        return
    want = lambda_mask(0, window)
    for got in specs:
        if got != want:
            raise ValueError(f"attn_implementation='dcp': layer {getattr(module, 'layer_idx', '?')} attends within a "
                             f"sliding window of {window} keys, but its plan's mask is {got[0]} {got[1]} (plan the step "
                             "with dcp.hf.layer_kinds(config) as the masks)")
    checked.add(window)


def _check_chunks(plan: Any, module: torch.nn.Module, chunk: int) -> None:
    """A layer that attends within chunks must run a plan of those chunks."""
    from .masks import chunked

    specs = _plan_specs(plan)
    if specs is None:
        return
    checked = plan.runtime_state.setdefault("hf_windows_checked", set())
    if ("chunk", chunk) in checked:
        return
    want = chunked(chunk)
    for got in specs:
        if got != want:
            raise ValueError(f"attn_implementation='dcp': layer {getattr(module, 'layer_idx', '?')} attends within chunks "
                             f"of {chunk} tokens, but its plan's mask is {got[0]} {got[1]} (plan the step with "
                             "dcp.hf.layer_kinds(config) as the masks)")
    checked.add(("chunk", chunk))


def layer_kinds(config: Any, full: Any = None) -> Any:
    """The masks of a model whose config names each layer's type (config.layer_types; without it,
    every layer is of one type: sliding where config.sliding_window is set, as in Mistral), as
    dcp.LayerKinds weighed by how many layers each type has: "full_attention" layers causal (or `full`: any dcp mask, one for every
    document or one per document), "sliding_attention" layers causal within config.sliding_window
    keys (the row itself included, no sink: dcp.masks.lambda_mask(0, window)), "chunked_attention"
    layers causal within chunks of config.attention_chunk_size tokens (dcp.masks.chunked). Pass it
    to Planner.submit as the masks."""
    from .masks import causal, chunked, lambda_mask
    from .planner import LayerKinds

    # A config without layer_types has one type: sliding where it sets a window (Mistral), else full.
    one_type = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    layer_types = list(getattr(config, "layer_types", None) or [one_type] * int(getattr(config, "num_hidden_layers", 1)))
    types = list(dict.fromkeys(layer_types))
    masks = {}
    for t in types:
        if t == "full_attention":
            masks[t] = full if full is not None else causal()
        elif t == "sliding_attention":
            window = getattr(config, "sliding_window", None)
            if not window:
                raise ValueError("layer_kinds: sliding_attention layers, but config.sliding_window is not set")
            masks[t] = lambda_mask(0, int(window))
        elif t == "chunked_attention":
            chunk = getattr(config, "attention_chunk_size", None)
            if not chunk:
                raise ValueError("layer_kinds: chunked_attention layers, but config.attention_chunk_size is not set")
            masks[t] = chunked(int(chunk))
        else:
            raise ValueError(f"layer_kinds: layer type {t!r} has no dcp mask (full_attention, sliding_attention and "
                             "chunked_attention do)")
    return LayerKinds(masks, layers={t: layer_types.count(t) for t in types})


def lengths_from_position_ids(position_ids: torch.Tensor) -> list:
    """The document lengths of a packed sequence in HF's flattened form (DataCollatorWithFlattening:
    one row whose position ids restart at 0 at every document), as Planner.submit takes them."""
    pos = position_ids.reshape(-1).cpu()
    if pos.numel() == 0:
        return []
    if int(pos[0]) != 0:
        raise ValueError(f"position_ids: the first token's position is {int(pos[0])}; a packed sequence starts a "
                         "document at position 0")
    starts = torch.nonzero(pos == 0).reshape(-1).tolist() + [pos.numel()]
    lengths = [b - a for a, b in zip(starts, starts[1:])]
    at = 0
    for n in lengths:
        if not torch.equal(pos[at:at + n], torch.arange(n)):
            raise ValueError(f"position_ids: the document starting at token {at} does not count 0, 1, 2, ... "
                             "(positions must restart at 0 per document and grow by one)")
        at += n
    return lengths


def pack(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
         labels: Optional[torch.Tensor] = None, ignore_index: int = -100):
    """A padded batch ([batch, seq] input ids, 1 where attention_mask keeps a token, padding
    anywhere) as one packed sequence: (lengths, ids, labels), each row a document, no padding. The
    labels are the given ones of the kept tokens, or next-token targets inside each document
    (ignore_index on every document's last token), as HF models shift them."""
    if input_ids.dim() != 2:
        raise ValueError(f"pack: input_ids has shape {tuple(input_ids.shape)}; expected [batch, seq]")
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if keep.shape != input_ids.shape:
        raise ValueError(f"pack: attention_mask {tuple(keep.shape)} and input_ids {tuple(input_ids.shape)} differ")
    lengths = [int(n) for n in keep.sum(dim=1).tolist() if n > 0]
    ids = input_ids[keep]
    if labels is not None:
        return lengths, ids, labels[keep]
    packed = torch.full_like(ids, ignore_index)
    at = 0
    for n in lengths:
        packed[at:at + n - 1] = ids[at + 1:at + n]
        at += n
    return lengths, ids, packed


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
