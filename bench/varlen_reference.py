"""Comparison point for `dcp bench` on one GPU: one monolithic FlashAttention-2 varlen call
(PyTorch's aten._flash_attention_forward, autograd for the backward) over the same sequences.
Never a dependency of the C++ code. Usage: varlen_reference.py batch.json [out.json]
Mask-area FLOPs as in dcp: causal area n(n+1)/2 per sequence; 'lambda' timed as a causal sliding
window (FA2 has no attention sink), others as causal (a lower bound on their cost)."""
import json, sys, time
import torch

def area(n, mask):
    if mask.get("kind") == "lambda":
        w = mask.get("window", 4096); s = mask.get("sink", 64)
        return sum(min(i + 1, w + s) for i in range(n))
    return n * (n + 1) // 2

def median_ms(fn, warmup=2, reps=7):
    for _ in range(warmup): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]

def main():
    batch = json.load(open(sys.argv[1]))
    hq, hkv, d = batch["heads"]["q"], batch["heads"]["kv"], batch["heads"]["dim"]
    lens = [s["length"] for s in batch["sequences"]]
    mask = batch["sequences"][0]["mask"]
    total = sum(lens)
    dev = "cuda"
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
    mx = max(lens)
    win = mask.get("window", 4096) if mask.get("kind") == "lambda" else -1
    def fwd():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False,
                                                       window_size_left=win if win > 0 else None,
                                                       window_size_right=0 if win > 0 else None)[0]
    flops = 4.0 * sum(area(n, mask) for n in lens) * d * hq
    res = {"tokens": total, "sequences": len(lens), "mask": mask, "fa2_varlen": {}}
    try:
        f_ms = median_ms(lambda: fwd())
        res["fa2_varlen"]["fwd_ms"] = f_ms
        res["fa2_varlen"]["fwd_tflops"] = flops / f_ms / 1e9
        go = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
        o = fwd()
        def bwd():
            torch.autograd.grad(o, (q, k, v), go, retain_graph=True)
        b_ms = median_ms(bwd)
        res["fa2_varlen"]["bwd_ms"] = b_ms
        res["fa2_varlen"]["bwd_tflops"] = 2.5 * flops / b_ms / 1e9
    except Exception as e:  # report what worked
        res["fa2_varlen"]["error"] = repr(e)[:300]
    print(json.dumps(res))
    if len(sys.argv) > 2: json.dump(res, open(sys.argv[2], "w"), indent=1)

main()
