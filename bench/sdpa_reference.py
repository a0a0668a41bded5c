"""Reference TFLOP/s of PyTorch SDPA (cuDNN and FlashAttention-2 backends) on the shapes of
bench_cuda_attention: 32 q heads (8 kv heads expanded), head dim 128, bf16, one sequence.
Comparison point only (never a dependency). FLOPs: 4*S*S*D*H forward (half when causal), 2.5x bwd.

cuDNN also runs the work of the diagonal lists (`causal`, `partial`): S / B causal sequences of
B tokens in one batch (rows with `block` = B), FLOPs of the exact causal area B (B + 1) / 2 per
sequence, as the kernel benchmark counts the mask's area. A list of short diagonal tiles is a
different workload from one long sequence (each 128-row chunk walks B / 128 / 2 key sub-tiles on
average), so those lists are compared with this, not with the long sequence's rate.
SDPA_ENERGY_S=N: each 32K single-sequence case also runs its forward, and its forward with the
backward, back to back until they fill N seconds each, with the GPU's energy counter read around
them (NVML by ctypes, as bench_cuda_attention's DCP_BENCH_ENERGY_S): TFLOP per kJ, mean watts and
the median SM clock of each pass (the backward's joules are the pair's minus the forward's).
SDPA_SETTLE_MS (default 500): each timed pass first runs back to back this long, so that it is
timed at its own sustained clock (bench_cuda_attention's DCP_BENCH_SETTLE_MS).
Usage: python3 bench/sdpa_reference.py [out.json]"""
import ctypes
import json
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


SETTLE_S = float(os.environ.get("SDPA_SETTLE_MS", "500")) / 1e3


def median_ms(fn, warmup=2, reps=7):
    # Run back to back for SETTLE_S first, as bench_cuda_attention does: at the power limit a pass
    # timed right after another starts at the clock the other left.
    t0 = time.monotonic()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    while time.monotonic() - t0 < SETTLE_S:
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


class EnergyMeter:
    """NVML's energy counter (mJ) and SM clock of CUDA device 0, found by its PCI bus id."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        p = torch.cuda.get_device_properties(0)
        bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0".encode()
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle)) != 0:
            raise OSError(f"no NVML device at {bus.decode()}")

    def energy_mj(self):
        v = ctypes.c_ulonglong()
        return v.value if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(v)) == 0 else None

    def sm_mhz(self):
        v = ctypes.c_uint()
        return v.value if self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(v)) == 0 else None


def run_for(meter, fn, seconds):
    """Joules per run, mean watts and median SM clock of `fn` run back to back for `seconds`."""
    fn()
    torch.cuda.synchronize()
    t0, e0, mhz, runs = time.perf_counter(), meter.energy_mj(), [], 0
    while True:
        fn()
        torch.cuda.synchronize()
        runs += 1
        mhz.append(meter.sm_mhz() or 0)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    joules = (meter.energy_mj() - e0) / 1e3
    return joules / runs, joules / elapsed, sorted(mhz)[len(mhz) // 2]


def time_case(rows, backend_name, backend, h, d, seq, causal, block=None, meter=None, energy_s=0.0):
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
        if meter is not None and energy_s > 0 and block is None and seq == 32768:
            f_j, f_w, f_mhz = run_for(meter, fwd, energy_s)
            p_j, p_w, p_mhz = run_for(meter, both, energy_s)
            row.update(fwd_tflop_per_kj=flops / 1e12 / (f_j / 1e3), fwd_watts=f_w, fwd_mhz=f_mhz,
                       bwd_tflop_per_kj=2.5 * flops / 1e12 / ((p_j - f_j) / 1e3), pair_watts=p_w, pair_mhz=p_mhz)
            print(f"  energy: fwd {row['fwd_tflop_per_kj']:.0f} TFLOP/kJ at {f_w:.0f} W, {f_mhz} MHz; "
                  f"bwd {row['bwd_tflop_per_kj']:.0f} TFLOP/kJ (fwd + bwd at {p_w:.0f} W, {p_mhz} MHz)", flush=True)
    if block is not None:
        row["block"] = block
    rows.append(row)
    shape = f"S={seq:6d}" + (f" as {batch} x {block}" if block is not None else "")
    print(f"{backend_name:6s} {shape} causal={int(causal)} fwd {f_ms:8.3f} ms {row['fwd_tflops']:6.1f} TF/s"
          f"  bwd {b_ms:8.3f} ms {row['bwd_tflops']:6.1f} TF/s", flush=True)


def main():
    rows = []
    h, d = 32, 128
    energy_s = float(os.environ.get("SDPA_ENERGY_S", "0"))
    meter = None
    if energy_s > 0:
        try:
            meter = EnergyMeter()
        except (OSError, AttributeError) as e:
            print(f"SDPA_ENERGY_S: no energy meter ({e}); energy not measured", file=sys.stderr)
    for backend_name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)]:
        for s in (16384, 32768):
            for causal in (False, True):
                time_case(rows, backend_name, backend, h, d, seq=s, causal=causal, meter=meter, energy_s=energy_s)
    for block in (1024, 2048, 4096):
        time_case(rows, "cudnn", SDPBackend.CUDNN_ATTENTION, h, d, seq=32768, causal=True, block=block)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
