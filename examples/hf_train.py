"""Training a Hugging Face causal LM with dcp's attention (attn_implementation="dcp").

    torchrun --standalone --nproc-per-node 2 examples/hf_train.py --arch llama4
    python3 examples/hf_train.py --config path/to/config.json --device cpu --steps 5

The model is built from a config with random weights (nothing is downloaded): `--arch` picks a
small model of a known family, `--config` reads any config.json of a decoder-only model (its
vocabulary is set to 256). The data is examples/train_data.py's: the standard library's source
as bytes, packed into steps of `--tokens` with no padding. Each rank reads only its own share of
a step's documents, as a data loader per rank would; the planner gathers their lengths, plans a
few steps ahead and `plan.dispatch` moves the tokens. Layer types in the config (full, sliding,
chunked) become one plan per kind on one token placement (dcp.hf.layer_kinds). Gradients are
summed over the ranks by an all-reduce, or sharded with FSDP2 (`--fsdp`).

Every rank prints nothing but rank 0's lines: `step N loss X` with the step's mean loss over
every rank's targets.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist

import dcp
import dcp.hf
import dcp.launch
import dcp.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_data  # noqa: E402

# Small models of known families, with what sets each apart (all: 4 layers, 8 query and 2 KV
# heads of 64, vocabulary 256).
_COMMON = dict(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=1 << 17, attention_dropout=0.0,
               tie_word_embeddings=False, pad_token_id=0)
ARCHS = {
    "llama": ("Llama", {}),
    "qwen3": ("Qwen3", {}),
    # sliding-window layers between global ones
    "gemma3": ("Gemma3Text", dict(sliding_window=512, query_pre_attn_scalar=64,
                                  layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    # chunked layers with RoPE, a global one without, its queries temperature-tuned
    "llama4": ("Llama4Text", dict(attention_chunk_size=1024, intermediate_size_mlp=1024, num_local_experts=2,
                                  num_experts_per_tok=1, moe_layers=[1, 3], no_rope_layers=[1, 1, 1, 0],
                                  layer_types=["chunked_attention"] * 3 + ["full_attention"])),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(ARCHS), default="llama", help="a small model of this family")
    p.add_argument("--config", default=None, help="a config.json instead of --arch (its model_type names the model)")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per step over all ranks (no padding)")
    p.add_argument("--max-doc", type=int, default=8192, help="documents longer than this are cut")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--block-size", type=int, default=1024, help="dcp's token block size")
    p.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 (fully_shard) over the ranks")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if available")
    p.add_argument("--seed", type=int, default=0, help="data order and initial weights")
    return p.parse_args(argv)


def make_model(args, device: torch.device):
    import transformers

    if args.config:
        with open(args.config) as f:
            values = json.load(f)
        config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
        config.vocab_size = 256
        config.pad_token_id = 0
    else:
        family, extra = ARCHS[args.arch]
        config = getattr(transformers, family + "Config")(**dict(_COMMON, **extra))
    config._attn_implementation = "dcp"
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="dcp")
    return model.float()


def main(argv=None) -> int:
    args = parse_args(argv)
    launch = dcp.launch.init_process_group(device=args.device)  # torchrun, srun, mpirun or one process
    world, rank, device = launch.world_size, launch.rank, launch.device
    cuda = device.type == "cuda"
    dcp.hf.register()
    model = make_model(args, device)
    config = model.config
    if world > 1:
        for p in model.parameters():  # rank 0's initial weights everywhere
            dist.broadcast(p.data, src=0)
    if args.fsdp and world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (config.num_attention_heads, config.num_key_value_heads, head_dim)
    masks = dcp.hf.layer_kinds(config)  # one mask per layer type, for every document
    planner = dcp.Planner(None, "h200-nvl", {"block_size": args.block_size}, shape=shape,
                          dtype="bf16" if cuda else "fp32", per_rank_data=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()

    def my_documents():
        for step in train_data.steps(train_data.text_corpus(), args.tokens, args.max_doc, args.seed, "causal"):
            first, last = train_data.rank_share(step, rank, world)
            begin, end = sum(step.lengths[:first]), sum(step.lengths[:last])
            ids = torch.from_numpy(step.tokens[begin:end].astype("int64"))
            labels = torch.from_numpy(step.labels()[begin:end])
            yield step.lengths[first:last], masks, (ids, labels)

    for step, (_, _, (ids, labels)), plan in planner.iterate(my_documents()):
        if step >= args.steps:
            break
        ids, labels = ids.to(device), labels.to(device)
        targets = plan.num_targets(labels)  # every rank's
        with autocast:
            logits = model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions(device)[None],
                           dcp_plan=plan).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), plan.dispatch(labels), ignore_index=-100,
                                                 reduction="sum") / targets
        # FSDP averages gradients over the ranks; the loss is already the mean over all of them.
        (loss * world if args.fsdp and world > 1 else loss).backward()
        if world > 1 and not args.fsdp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss.detach()
        if world > 1:
            dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {float(total):.6f}", flush=True)
        plan.release()
    # Tear down in order while the interpreter is whole: the planner's threads and dcp's
    # communicators (over the process group) first, then the group, once every rank is done.
    planner.close()
    plan = None  # its runner holds dcp's communicator
    gc.collect()
    dcp.torch.shutdown()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
