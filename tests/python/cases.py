"""Per-rank bodies of the multi-rank tests (importable by spawned ranks)."""
from __future__ import annotations

import random

import torch

import dcp
import dcp.torch as dt

SHAPE = (4, 2, 64)


def random_docs(seed: int, max_len: int = 150, num_docs: int = 4):
    """Documents of random lengths, each with a random mask of every kind (explicit ranges too)."""
    rng = random.Random(seed)
    lengths, specs = [], []
    for i in range(num_docs):
        n = rng.randint(1, max_len)
        kind = (seed + i) % 7
        if kind == 0:
            spec = dcp.masks.causal()
        elif kind == 1:
            spec = dcp.masks.full()
        elif kind == 2:
            spec = dcp.masks.lambda_mask(rng.randint(0, 8), rng.randint(1, 40))
        elif kind == 3:
            spec = dcp.masks.causal_blockwise(16 * rng.randint(1, 2), rng.randint(0, 2), rng.randint(0, 1))
        elif kind == 4 and n >= 5:
            spec = dcp.masks.shared_question_for(n, 0.2, rng.randint(1, 4))
        elif kind == 5:
            spec = dcp.masks.chunked(rng.randint(1, 48))
        else:
            rows = []
            for r in range(n):
                row, at = [], 0
                while at < n and rng.randrange(3) != 0:
                    b = at + rng.randrange(max(1, n // 4))
                    if b >= n:
                        break
                    e = min(n, b + 1 + rng.randrange(max(1, n // 3)))
                    row.append((b, e))
                    at = e + 1
                rows.append(row)
            spec = dcp.masks.ranges(rows)
        lengths.append(n)
        specs.append(spec)
    return lengths, specs


def inputs(seed: int, total: int, shape=SHAPE):
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d = shape
    q = torch.randn(total, hq, d, generator=g) * 1.5
    k = torch.randn(total, hkv, d, generator=g) * 1.5
    v = torch.randn(total, hkv, d, generator=g)
    w = torch.randn(total, hq, d, generator=g)  # upstream gradient of o
    return q, k, v, w


def op_case(rank, world, seed, dtype_name, method, block, in_place=False):
    """Forward and backward of the operator on this rank's tokens; the whole batch's outputs and
    gradients gathered back (identical on every rank). in_place: the plan option outputs_in_place."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    lengths, specs = random_docs(seed)
    options = {"method": method, "block_size": block, "stages": 2, "outputs_in_place": in_place}
    planner = dcp.Planner(None, "h200-nvl", options, shape=SHAPE, dtype=dtype_name)
    planner.submit(seed, lengths, specs)
    plan = planner.get(seed)
    q, k, v, w = inputs(seed, sum(lengths))
    ql, kl, vl = (plan.dispatch(t).to(dtype).requires_grad_() for t in (q, k, v))
    o, lse = dt.attention(ql, kl, vl, plan, 0, return_lse=True)
    (o.float() * plan.dispatch(w)).sum().backward()
    return {name: plan.undispatch(t.detach().float()) for name, t in
            (("o", o), ("lse", lse), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}


def dispatch_case(rank, world, seed):
    lengths, specs = random_docs(seed, max_len=300, num_docs=6)
    planner = dcp.Planner(None, "a100-p4d", {"block_size": 64}, shape=SHAPE)
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    total = sum(lengths)
    x = torch.arange(total * 3, dtype=torch.float32).reshape(total, 3)
    local = plan.dispatch(x)
    back = plan.undispatch(local)
    positions = plan.undispatch(plan.positions())
    return {"identity": bool(torch.equal(back, x)), "tokens": plan.num_tokens, "positions": positions,
            "total": total, "lengths": lengths}


def hash_case(rank, world, seed, corrupt_rank):
    """Every rank plans; with corrupt_rank >= 0 that rank plans a different batch."""
    lengths, specs = random_docs(seed)
    if rank == corrupt_rank:  # one more document: a valid batch, but not the others'
        lengths = lengths + [7]
        specs = specs + [dcp.masks.causal()]
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=SHAPE)
    planner.submit(0, lengths, specs)
    try:
        plan = planner.get(0)
        return ("ok", plan.plan.hash)
    except dcp.Error as e:
        return ("error", str(e))


def broadcast_case(rank, world, seed):
    lengths, specs = random_docs(seed)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=SHAPE, broadcast=True)
    planner.submit(0, lengths, specs)
    return planner.get(0).plan.hash


def wrong_world_case(rank, world):
    """A plan for 3 ranks run on 2: a clear error on every rank, no hang."""
    lengths, specs = random_docs(5)
    p = dcp.plan(lengths, specs, SHAPE, world_size=3, options={"block_size": 32})
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=SHAPE)
    step = dcp.StepPlan(p, 0, rank, planner.group, planner)
    q = torch.randn(p.num_tokens(rank), 4, 64)
    k = torch.randn(p.num_tokens(rank), 2, 64)
    try:
        dt.attention(q, k, k, step, 0)
    except dcp.Error as e:
        return str(e)
    return "accepted"


def mesh_case(rank, world, dims, broadcast):
    """Context parallelism inside data parallelism: a (dp, cp) DeviceMesh of 2 x 2 CPU ranks, laid
    out as `dims` says (("dp", "cp"): cp groups {0, 1}, {2, 3}; ("cp", "dp"): {0, 2}, {1, 3}).
    Each cp group plans its own batch over its group (seed 30 + its dp index), runs the operator
    and gathers its outputs and gradients over the cp group; then the gradient of a weight every
    rank holds is summed over its tokens: over the cp group (its batch's tokens are split there),
    then over the dp group (the batches), as DDP over the dp x cp ranks does."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=dims)
    cp, dp = mesh["cp"].get_group(), mesh["dp"].get_group()
    dp_index = mesh["dp"].get_local_rank()
    seed = 30 + dp_index
    lengths, specs = random_docs(seed)
    planner = dcp.Planner(cp, "h200-nvl", {"block_size": 32, "stages": 2}, shape=SHAPE, dtype="fp32",
                          broadcast=broadcast)
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    q, k, v, w = inputs(seed, sum(lengths))
    scale = torch.ones((), requires_grad=True)  # a parameter every rank holds
    ql, kl, vl = (plan.dispatch(t).requires_grad_() for t in (q, k, v))
    o = dt.attention(ql * scale, kl, vl, plan, 0)
    (o * plan.dispatch(w)).sum().backward()
    torch.distributed.all_reduce(scale.grad, group=cp)
    torch.distributed.all_reduce(scale.grad, group=dp)
    out = {name: plan.undispatch(t.detach()) for name, t in
           (("o", o), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}
    out.update(seed=seed, cp_rank=plan.rank, cp_ranks=torch.distributed.get_process_group_ranks(cp),
               scale_grad=scale.grad.detach(), hash=plan.plan.hash)
    return out


def lse_docs():
    """Documents whose every row has an allowed key (lse finite: a loss may read it)."""
    lengths = [37, 80, 19, 64]
    specs = [dcp.masks.causal(), dcp.masks.lambda_mask(4, 16), dcp.masks.shared_question_for(19, 0.2, 2),
             dcp.masks.causal_blockwise(16, 1, 1)]
    return lengths, specs


def lse_case(rank, world, use_o, device_type="cpu", dtype_name="fp32"):
    """A loss that reads lse (sum(lse * u)), with or without o (sum(o * w)): outputs and
    gradients gathered back."""
    dev = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    lengths, specs = lse_docs()
    shape = (4, 2, 64) if device_type == "cpu" else (8, 2, 128)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 16 if device_type == "cpu" else 128, "stages": 2},
                          shape=shape, dtype=dtype_name)
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    q, k, v, w = inputs(41, sum(lengths), shape)
    u = torch.randn(sum(lengths), shape[0], generator=torch.Generator().manual_seed(42))
    ql, kl, vl = (plan.dispatch(t.to(dtype)).to(dev).requires_grad_() for t in (q, k, v))
    o, lse = dt.attention(ql, kl, vl, plan, 0, return_lse=True)
    loss = (lse * plan.dispatch(u).to(dev)).sum()
    if use_o:
        loss = loss + (o.float() * plan.dispatch(w).to(dev)).sum()
    loss.backward()
    return {name: plan.undispatch(t.detach().float()).cpu() for name, t in
            (("o", o), ("lse", lse), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}


# ---- the operator on each rank's device (GPU r under nccl, else the CPU) ---------------------
DEVICE_SHAPE = (8, 2, 128)


def _rank_device(rank):
    import torch.distributed as dist

    return torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def device_docs(seed: int):
    return random_docs(seed, max_len=700, num_docs=6)


def _device_plan(seed: int):
    lengths, specs = device_docs(seed)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 128, "stages": 2}, shape=DEVICE_SHAPE)
    planner.submit(0, lengths, specs)
    return planner.get(0), sum(lengths)


def device_op_case(rank, world, seed):
    """bf16 forward and backward of one layer; outputs and gradients gathered back (every rank)."""
    dev = _rank_device(rank)
    plan, total = _device_plan(seed)
    q, k, v, w = inputs(seed, total, DEVICE_SHAPE)
    ql, kl, vl = (plan.dispatch(t.to(torch.bfloat16)).to(dev).requires_grad_() for t in (q, k, v))
    o, lse = dt.attention(ql, kl, vl, plan, 0, return_lse=True)
    (o.float() * plan.dispatch(w).to(dev)).sum().backward()
    return {name: plan.undispatch(t.detach().float()).cpu() for name, t in
            (("o", o), ("lse", lse), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}


def graph_case(rank, world, seed, deterministic, device=None):
    """One layer's forward and backward captured into a CUDA graph on every rank (its transfers
    too), replayed on new inputs: per output, whether the replay equals the eager operator
    bitwise, and its relative error against it; whether the replays allocated nothing. device:
    this process's GPU when called in-process (default: GPU r of a spawned rank)."""
    from reference import rel_error

    dev = device if device is not None else _rank_device(rank)
    dt.configure(deterministic=deterministic)
    try:
        plan, _ = _device_plan(seed)
        hq, hkv, d = DEVICE_SHAPE

        def new_inputs(s):
            g = torch.Generator().manual_seed(1000 * s + rank)
            return [torch.randn(plan.num_tokens, h, d, generator=g).to(dev, torch.bfloat16) for h in (hq, hkv, hkv, hq)]

        def layer(q, k, v, d_o):
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = dt.attention(q, k, v, plan, 0)
            return (o, *torch.autograd.grad(o, (q, k, v), d_o))

        static = new_inputs(1)
        dt.prepare(plan, dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            layer(*static)
        torch.cuda.current_stream(dev).wait_stream(side)
        layer(*static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(*static)
        backend = plan.runtime_state[("backend", str(static[0].device))]
        allocations = backend.num_allocations  # the capture's own counter included
        out = {}
        for s in (2, 3):
            fresh = new_inputs(s)
            for dst, src in zip(static, fresh):
                dst.copy_(src)
            graph.replay()
            want = layer(*fresh)
            for name, got, ref in zip(("o", "dq", "dk", "dv"), captured, want):
                out[f"{name}_{s}_equal"] = bool(torch.equal(got, ref))
                out[f"{name}_{s}_error"] = rel_error(got.float().cpu(), ref.float().cpu())
        torch.cuda.synchronize(dev)
        out["allocations_steady"] = backend.num_allocations == allocations
        return out
    finally:
        dt.configure(deterministic=False)


# ---- HF Llama ---------------------------------------------------------------------------------
def tiny_llama(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(1234)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                         attention_dropout=0.0, tie_word_embeddings=False)
    config._attn_implementation = attn
    model = LlamaForCausalLM(config).float()
    return model


def llama_docs(seed: int = 77, lengths=(37, 80, 19, 64)):
    """Documents of bytes-as-tokens, packed: ids, next-token labels (-100 across documents)."""
    g = torch.Generator().manual_seed(seed)
    lengths = list(lengths)
    ids = torch.randint(0, 64, (sum(lengths),), generator=g)
    labels = torch.full_like(ids, -100)
    start = 0
    for n in lengths:
        labels[start:start + n - 1] = ids[start + 1:start + n]
        start += n
    return lengths, ids, labels


def tiny_mistral(attn: str):
    """A Mistral: every layer attends within a sliding window of 8 keys (config.sliding_window, no
    layer_types)."""
    from transformers import MistralConfig, MistralForCausalLM

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(2468)
    config = MistralConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                           attention_dropout=0.0, tie_word_embeddings=False, sliding_window=8)
    config._attn_implementation = attn
    return MistralForCausalLM(config).float()


def tiny_gemma3(attn: str):
    """A Gemma 3 (text): a sliding-window layer (8 keys) then a global one, scores scaled by
    query_pre_attn_scalar**-0.5 (not 1/sqrt(head_dim)), QK norms and local / global RoPE bases."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(1357)
    config = Gemma3TextConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
                              max_position_embeddings=512, attention_dropout=0.0, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention"])
    config._attn_implementation = attn
    return Gemma3ForCausalLM(config).float()


def tiny_gpt_oss(attn: str):
    """A GPT-OSS: learned sink logits per head (s_aux), a sliding-window layer (8 keys) then a
    global one, two experts."""
    from transformers import GptOssConfig, GptOssForCausalLM

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(8642)
    config = GptOssConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=2,
                          num_experts_per_tok=1, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                          max_position_embeddings=512, attention_dropout=0.0, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = attn
    model = GptOssForCausalLM(config).float()
    with torch.no_grad():  # sinks of the order of the scores, so that they matter
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def tiny_llama4(attn: str):
    """A Llama 4 (text): a chunked layer (chunks of 16 tokens, RoPE) then a global one without
    RoPE whose queries are temperature-tuned by position (floor_scale 4, so that the tuning acts
    on these short documents), QK norms, two experts."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(9753)
    config = Llama4TextConfig(vocab_size=64, hidden_size=128, intermediate_size=128, intermediate_size_mlp=256,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              num_local_experts=2, num_experts_per_tok=1, attention_chunk_size=16,
                              layer_types=["chunked_attention", "full_attention"], no_rope_layers=[1, 0],
                              attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5, use_qk_norm=True,
                              moe_layers=[0], max_position_embeddings=512, attention_dropout=0.0,
                              tie_word_embeddings=False)
    config._attn_implementation = attn
    return Llama4ForCausalLM(config).float()


# More Hugging Face architectures, each tiny (the shape of tiny_llama) with what sets it apart:
# name -> config arguments beyond the common ones. Every one runs attn_implementation="dcp" planned
# with dcp.hf.layer_kinds(config).
_ZOO_COMMON = dict(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=512, attention_dropout=0.0,
                   tie_word_embeddings=False, pad_token_id=0)
_SLIDING = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
HF_ZOO = {
    "Qwen3": {},                                                    # q and k norms per head
    "Qwen3Moe": dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=64, decoder_sparse_step=1),
    "Mixtral": dict(num_local_experts=2, num_experts_per_tok=2),
    "Phi3": {},                                                     # fused qkv projection
    "Granite": dict(attention_multiplier=0.1, embedding_multiplier=2.0, residual_multiplier=0.5,
                    logits_scaling=2.0),                            # its own score scale
    "Olmo2": {},                                                    # q and k norms over all heads
    "SmolLM3": dict(no_rope_layers=[1, 0]),                         # a layer without RoPE
    "Glm4": {}, "Apertus": {}, "Arcee": {},
    "SeedOss": dict(residual_dropout=0.0),                          # attention biases
    "Starcoder2": dict(sliding_window=None, use_bias=True),
    "Cohere2": dict(_SLIDING), "Exaone4": dict(_SLIDING), "Ministral": dict(_SLIDING), "Olmo3": dict(_SLIDING),
    "Gemma2": dict(attn_logit_softcapping=None, final_logit_softcapping=None, query_pre_attn_scalar=24, **_SLIDING),
}


def tiny_zoo(name: str, attn: str):
    import transformers

    import dcp.hf

    dcp.hf.register()
    config = getattr(transformers, name + "Config")(**dict(_ZOO_COMMON, **HF_ZOO[name]))
    config._attn_implementation = attn
    torch.manual_seed(4242)
    return getattr(transformers, name + "ForCausalLM")(config).float()


def hf_zoo_case(rank, world, names):
    """hf_dcp_case for each architecture of HF_ZOO in `names` (one spawn for all of them)."""
    return {name: hf_dcp_case(rank, world, name) for name in names}


def hf_dcp_case(rank, world, model_name):
    """Loss and gradients of the packed batch through attn_implementation='dcp' on `world` ranks
    (gradients summed over ranks, as data parallelism does): tiny_llama planned causal, or
    tiny_qwen2 and tiny_mistral planned with dcp.hf.layer_kinds (one plan per layer type on one
    token placement)."""
    import torch.distributed as dist

    import dcp.hf

    makers = {"llama": tiny_llama, "qwen2": tiny_qwen2, "mistral": tiny_mistral, "gemma3": tiny_gemma3,
              "gpt_oss": tiny_gpt_oss, "llama4": tiny_llama4}
    model = makers[model_name]("dcp") if model_name in makers else tiny_zoo(model_name, "dcp")
    masks = dcp.masks.causal() if model_name == "llama" else dcp.hf.layer_kinds(model.config)
    lengths, ids, labels = llama_docs()
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 16, "stages": 2}, shape=(4, 2, 32), dtype="fp32")
    planner.submit(0, lengths, masks)
    plan = planner.get(0)
    logits = model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions()[None], dcp_plan=plan).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, plan.dispatch(labels), ignore_index=-100, reduction="sum")
    loss = loss / plan.num_targets(labels)
    loss.backward()
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
        for p in model.parameters():
            dist.all_reduce(p.grad)
    return {"loss": total, "grads": {n: p.grad for n, p in model.named_parameters()}, "kinds": list(plan.kinds)}


def llama_eager_reference():
    """The same loss with eager attention, one document at a time (no packing involved)."""
    return eager_reference(tiny_llama("eager"))


def kinds_case(rank, world, seed, method):
    """Two layers of different masks (layer kinds) over one plan: a global layer of random masks and
    a local sliding-window layer, each with its own inputs; both layers' outputs and the summed
    gradients gathered back, and whether every kind holds this rank's tokens in the same order."""
    lengths, specs = random_docs(seed)
    local = [dcp.masks.lambda_mask(2, 9)] * len(lengths)
    planner = dcp.Planner(None, "h200-nvl", {"method": method, "block_size": 32, "stages": 2}, shape=SHAPE)
    planner.submit(seed, lengths, dcp.LayerKinds({"global": specs, "local": local}))
    plan = planner.get(seed)
    same_rows = all(torch.equal(plan.kind(name).rows(), plan.rows()) for name in plan.kinds)
    q, k, v, w = inputs(seed, sum(lengths))
    ql, kl, vl = (plan.dispatch(t).requires_grad_() for t in (q, k, v))
    o_global = dt.attention(ql, kl, vl, plan.kind("global"), 0)
    o_local = dt.attention(ql * 0.5, kl, vl, plan.kind("local"), 1)
    ((o_global + 2 * o_local) * plan.dispatch(w)).sum().backward()
    out = {name: plan.undispatch(t.detach()) for name, t in
           (("o_global", o_global), ("o_local", o_local), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}
    out.update(kinds=list(plan.kinds), same_rows=same_rows)
    return out


def tiny_qwen2(attn: str):
    """A Qwen2 whose first layer attends within a sliding window of 8 keys and second globally."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import dcp.hf

    dcp.hf.register()
    torch.manual_seed(4321)
    config = Qwen2Config(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attention_dropout=0.0, tie_word_embeddings=False, use_sliding_window=True,
                         sliding_window=8, max_window_layers=0,
                         layer_types=["sliding_attention", "full_attention"])
    config._attn_implementation = attn
    return Qwen2ForCausalLM(config).float()


def eager_reference(model, docs=None):
    """The loss of `model` (eager attention) one document at a time, and its gradients (added to
    what they hold: several batches' references sum)."""
    lengths, ids, labels = docs or llama_docs()
    targets = int((labels != -100).sum())
    start, total = 0, 0.0
    for n in lengths:
        logits = model(input_ids=ids[start:start + n][None]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, labels[start:start + n], ignore_index=-100,
                                                 reduction="sum") / targets
        loss.backward()
        total += float(loss.detach())
        start += n
    return {"loss": torch.tensor(total), "grads": {n: p.grad for n, p in model.named_parameters()}}


def layer_counts_case(rank, world):
    """The local kind's plan hash with a hundred local layers to one global, with a hundred global
    layers to one local, and planned alone. The lead is the kind whose token homes give the fastest
    predicted step over all layers, so the counts decide which kind keeps its own placement."""
    lengths = [900, 400, 700, 300]
    local = dcp.masks.lambda_mask(0, 32)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 64}, shape=SHAPE)
    for step, layers in enumerate(({"global": 1, "local": 100}, {"global": 100, "local": 1})):
        planner.submit(step, lengths, dcp.LayerKinds({"global": "causal", "local": local}, layers=layers))
    planner.submit(2, lengths, local)
    return [planner.get(0).kind("local").plan.hash, planner.get(1).kind("local").plan.hash, planner.get(2).plan.hash]


def kinds_broadcast_case(rank, world):
    """Layer kinds planned on rank 0 only and sent to the others (broadcast=True): every rank's
    plan of every kind, by hash."""
    lengths = [300, 120, 500]
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 64}, shape=SHAPE, broadcast=True)
    planner.submit(0, lengths, dcp.LayerKinds({"global": "causal", "local": dcp.masks.lambda_mask(4, 40)}))
    plan = planner.get(0)
    return {name: plan.kind(name).plan.hash for name in plan.kinds}


def per_rank_docs(seed: int, rank: int):
    """Rank r's own documents in the per-rank data tests (rank 1 loads none)."""
    count = [2, 0, 3, 1][rank % 4]
    lengths, specs = random_docs(seed * 10 + rank, max_len=120, num_docs=max(count, 1))
    return lengths[:count], specs[:count]


def per_rank_case(rank, world, seed, dtype_name, block=32, broadcast=False):
    """Each rank loads its own documents and inputs; the operator runs on the dispatched tokens
    and its outputs go back to the loading ranks, differentiably (the gradients arrive in the
    loaded tensors). On GPUs (nccl) with rank r on GPU r; broadcast: rank 0 plans alone."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    dev = _rank_device(rank)
    lengths, specs = per_rank_docs(seed, rank)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": block, "stages": 2}, shape=SHAPE, dtype=dtype_name,
                          per_rank_data=True, broadcast=broadcast)
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    q, k, v, w = (t.to(dev) for t in inputs(seed * 10 + rank, sum(lengths)))
    q, k, v = (t.to(dtype).detach().requires_grad_() for t in (q, k, v))
    o, lse = dt.attention(plan.dispatch(q), plan.dispatch(k), plan.dispatch(v), plan, 0, return_lse=True)
    o_loaded = plan.undispatch(o)
    (o_loaded.float() * w).sum().backward()
    ids = torch.arange(sum(lengths), dtype=torch.int64, device=dev) + 1000 * rank
    labels = torch.where(ids % 3 == 0, torch.full_like(ids, -100), ids)
    return {"o": o_loaded.detach().float(), "lse": plan.undispatch(lse.detach()).float(),
            "dq": q.grad.float(), "dk": k.grad.float(), "dv": v.grad.float(),
            "ids_back": plan.undispatch(plan.dispatch(ids)), "ids_held": plan.dispatch(ids),
            "rows": plan.rows(), "positions": plan.undispatch(plan.positions(dev)),
            "targets": plan.num_targets(labels), "loaded": plan.loaded_tokens, "total": plan.plan.total_tokens}


def per_rank_error_case(rank, world, what):
    """One rank submits something wrong: every rank gets the same error, none waits."""
    lengths, specs = per_rank_docs(3, rank)
    masks = specs
    if what == "masks" and rank == 1:
        lengths, masks = [5, 6], [dcp.masks.causal()] * 3
    if what == "kinds":
        masks = dcp.LayerKinds({"global": "causal", ("local" if rank == 0 else "window"): "full"})
    if what == "batch" and rank == 0:
        lengths = dcp.make_batch([8], "causal", SHAPE)
    step = rank if what == "steps" else 0
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=SHAPE, per_rank_data=True)
    try:
        planner.submit(step, lengths, masks)
    except ValueError as e:
        return str(e)
    return "accepted"


def per_rank_kinds_case(rank, world):
    """Per-rank data with layers of two masks: every kind holds the same tokens, and each kind's
    gathered masks are the documents' in rank order."""
    lengths, _ = per_rank_docs(4, rank)
    local = dcp.masks.lambda_mask(4, 16)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=SHAPE, per_rank_data=True)
    planner.submit(0, lengths, dcp.LayerKinds({"global": "causal", "local": [local] * len(lengths)},
                                              layers={"global": 1, "local": 3}))
    plan = planner.get(0)
    ids = torch.arange(sum(lengths), dtype=torch.int64) + 1000 * rank
    return {"kinds": plan.kinds, "same_tokens": bool(torch.equal(plan.dispatch(ids), plan.kind("local").dispatch(ids))),
            "local_masks": plan.kind("local").masks, "loaded": plan.kind("local").loaded_tokens}


def exchange_case(rank, world, seed):
    """TokenExchange on a random assignment of rows to ranks in a random held order (plans hold
    rows in ascending order; the exchange must not rely on it): held ids, and the round trip."""
    from dcp.exchange import TokenExchange, exchange

    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 9, (world,), generator=g).tolist()
    total = sum(counts)
    owner = torch.randint(0, world, (total,), generator=g)
    order = torch.randperm(total, generator=g)
    held = {d: order[owner[order] == d].numpy() for d in range(world)}
    ex = TokenExchange(counts, lambda d: held[d], rank, world)
    start = sum(counts[:rank])
    x = (torch.arange(counts[rank], dtype=torch.float64) + start).requires_grad_()
    y = exchange(x.unsqueeze(1).repeat(1, 2), ex, None, True)
    (y[:, 0] * (y[:, 0] + 1)).sum().backward()  # d/dx of x(x+1) summed: 2x + 1, at the loader
    back = exchange(y.detach(), ex, None, False)
    return {"held": y.detach()[:, 0], "want": torch.from_numpy(held[rank]).double(), "back": back[:, 1],
            "x": x.detach(), "grad": x.grad}


TP_SHAPE = (4, 2, 16)  # the whole layer's heads; each of 2 tensor-parallel ranks holds half
TP_MODEL = 24


def tp_weights(seed: int):
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d = TP_SHAPE
    scale = TP_MODEL ** -0.5
    return {"wq": torch.randn(TP_MODEL, hq * d, generator=g) * scale,
            "wk": torch.randn(TP_MODEL, hkv * d, generator=g) * scale,
            "wv": torch.randn(TP_MODEL, hkv * d, generator=g) * scale,
            "wo": torch.randn(hq * d, TP_MODEL, generator=g) * (hq * d) ** -0.5}


class _SumOverTp(torch.autograd.Function):
    """The row-parallel projection's sum of partial outputs: forward an all-reduce; the gradient of
    each partial is the sum's gradient itself, already whole on every tp rank."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_cp_case(rank, world, seed):
    """Tensor parallelism inside context parallelism: a (cp, tp) DeviceMesh of 2 x 2 CPU ranks
    (tp groups {0, 1}, {2, 3}; cp groups {0, 2}, {1, 3}). An attention layer's heads are split
    over tp (q, k, v projections by columns, the output projection by rows, its partial outputs
    summed over tp); each tp rank's cp group plans the batch for its own heads. The tp ranks of a
    token must hold it in the same place, which one plan per head count guarantees: the planner is
    deterministic. Returns the layer's output and every gradient, gathered whole."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    cp, tp = mesh["cp"].get_group(), mesh["tp"].get_group()
    t = mesh["tp"].get_local_rank()
    hq, hkv, d = TP_SHAPE
    local_shape = (hq // 2, hkv // 2, d)
    lengths, specs = random_docs(seed, num_docs=5)
    planner = dcp.Planner(cp, "h200-nvl", {"block_size": 32, "stages": 2}, shape=local_shape, dtype="fp32")
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    total = sum(lengths)
    x = torch.randn(total, TP_MODEL, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    w_out = torch.randn(total, TP_MODEL, generator=torch.Generator().manual_seed(seed + 1))
    full = tp_weights(seed)
    cols = lambda w, heads: w[:, t * heads * d:(t + 1) * heads * d]  # noqa: E731
    shard = {"wq": cols(full["wq"], hq // 2), "wk": cols(full["wk"], hkv // 2), "wv": cols(full["wv"], hkv // 2),
             "wo": full["wo"][t * (hq // 2) * d:(t + 1) * (hq // 2) * d]}
    shard = {k: v.clone().requires_grad_() for k, v in shard.items()}
    xl = plan.dispatch(x)
    q = (xl @ shard["wq"]).view(-1, hq // 2, d)
    k = (xl @ shard["wk"]).view(-1, hkv // 2, d)
    v = (xl @ shard["wv"]).view(-1, hkv // 2, d)
    o = dt.attention(q, k, v, plan, 0)
    y = _SumOverTp.apply(o.reshape(o.shape[0], -1) @ shard["wo"], tp)  # row-parallel output
    (y * plan.dispatch(w_out)).sum().backward()
    grads = {}
    for name, p in shard.items():  # the shard's gradient: its tokens' parts summed over cp
        g = p.grad.clone()
        dist.all_reduce(g, group=cp)
        grads[name] = g
    dx = x.grad.clone()
    dist.all_reduce(dx)  # every rank's tokens, every rank's heads
    return {"y": plan.undispatch(y.detach()), "dx": dx, "grads": grads, "tp": t,
            "rows": plan.rows(), "hash": plan.plan.hash, "tp_ranks": dist.get_process_group_ranks(tp)}


FSDP_DOCS = [(77, (37, 80, 19, 64)), (78, (90, 23, 51))]  # each dp group's batch: (seed, lengths)


def fsdp_case(rank, world):
    """A tiny HF Llama with attn_implementation="dcp", sharded by FSDP2 over all 4 ranks of a
    (dp, cp) = 2 x 2 mesh, as TorchTitan shards over dp x cp: each cp group plans and runs its
    own batch. FSDP averages gradients over the 4 ranks, so each rank's loss (its tokens' summed
    loss over its batch's targets) is scaled by the cp size: the gradient is then the mean over
    the dp groups of each batch's mean loss. Returns every parameter's full gradient and the
    step's loss."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
    cp = mesh["cp"].get_group()
    everyone = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = tiny_llama("dcp")
    for layer in model.model.layers:
        fully_shard(layer, mesh=everyone)
    fully_shard(model, mesh=everyone)
    seed, lengths = FSDP_DOCS[mesh["dp"].get_local_rank()]
    lengths, ids, labels = llama_docs(seed, lengths)
    planner = dcp.Planner(cp, "h200-nvl", {"block_size": 16, "stages": 2}, shape=(4, 2, 32), dtype="fp32")
    planner.submit(0, lengths, dcp.masks.causal())
    plan = planner.get(0)
    logits = model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions()[None], dcp_plan=plan).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, plan.dispatch(labels), ignore_index=-100, reduction="sum")
    loss = loss / plan.num_targets(labels)
    (loss * dist.get_world_size(cp)).backward()
    total = loss.detach().clone()
    dist.all_reduce(total)  # both batches' losses
    return {"loss": total / 2, "grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()}}
