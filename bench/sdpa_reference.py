"""Reference TFLOP/s of PyTorch SDPA (cuDNN and FlashAttention-2 backends) on the shapes of
bench_cuda_attention: 32 q heads (8 kv heads expanded), head dim 128, bf16, one sequence.
Comparison point only (never a dependency). FLOPs: 4*S*S*D*H forward (half when causal), 2.5x bwd.

cuDNN also runs the work of the diagonal lists (`causal`, `partial`): S / B causal sequences of
B tokens in one batch (rows with `block` = B), FLOPs of the exact causal area B (B + 1) / 2 per
sequence, as the kernel benchmark counts the mask's area. A list of short diagonal tiles is a
different workload from one long sequence (each 128-row chunk walks B / 128 / 2 key sub-tiles on
average), so those lists are compared with this, not with the long sequence's rate.
Usage: python3 bench/sdpa_reference.py [out.json]"""
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup=2, reps=7):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def time_case(rows, backend_name, backend, h, d, seq, causal, block=None):
    """Times one shape and appends its row: one sequence of `seq` tokens, or with `block` a batch
    of seq / block sequences of `block` tokens."""
    batch, length = (1, seq) if block is None else (seq // block, block)
    q = torch.randn(batch, h, length, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, h, length, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, h, length, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    if block is None:
        flops = 4.0 * seq * seq * d * h * (0.5 if causal else 1.0)
    else:
        flops = 4.0 * d * h * batch * (length * (length + 1) / 2 if causal else length * length)
    with sdpa_kernel(backend):
        fwd = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o = fwd()
        g = torch.randn_like(o)
        f_ms = median_ms(fwd)
        both = lambda: torch.autograd.grad(fwd(), (q, k, v), g)
        b_ms = median_ms(both) - f_ms
    row = dict(backend=backend_name, seq=seq, causal=causal, fwd_ms=f_ms, bwd_ms=b_ms,
               fwd_tflops=flops / (f_ms * 1e9), bwd_tflops=2.5 * flops / (b_ms * 1e9))
    if block is not None:
        row["block"] = block
    rows.append(row)
    shape = f"S={seq:6d}" + (f" as {batch} x {block}" if block is not None else "")
    print(f"{backend_name:6s} {shape} causal={int(causal)} fwd {f_ms:8.3f} ms {row['fwd_tflops']:6.1f} TF/s"
          f"  bwd {b_ms:8.3f} ms {row['bwd_tflops']:6.1f} TF/s", flush=True)


def main():
    rows = []
    h, d = 32, 128
    for backend_name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)]:
        for s in (16384, 32768):
            for causal in (False, True):
                time_case(rows, backend_name, backend, h, d, seq=s, causal=causal)
    for block in (1024, 2048, 4096):
        time_case(rows, "cudnn", SDPBackend.CUDNN_ATTENTION, h, d, seq=32768, causal=True, block=block)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
