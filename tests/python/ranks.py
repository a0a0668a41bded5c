"""Runs a function on N ranks (processes over a file rendezvous: gloo on CPUs, or nccl with rank r
on GPU r) and returns each rank's result, raising the first rank's error. The function must live
in an importable module."""
from __future__ import annotations

import os
import tempfile
import traceback

import torch.multiprocessing as mp


def _plain(x):
    """Tensors as numpy arrays (pickled by value: the rank may exit before the parent reads)."""
    import torch

    if isinstance(x, torch.Tensor):
        return ("__tensor__", x.detach().cpu().numpy())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _tensors(x):
    import torch

    if isinstance(x, tuple) and len(x) == 2 and x[0] == "__tensor__":
        return torch.from_numpy(x[1])
    if isinstance(x, dict):
        return {k: _tensors(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_tensors(v) for v in x)
    return x


def _entry(rank, world, init_file, fn, args, results, backend):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        # Gloo's init returns on a rank once its own side of the mesh is connected: a function that
        # needs no collective could let that rank finish and exit while a slower one still connects
        # to it, which then fails ("connection closed by peer"). Every rank passes this barrier only
        # after all of them are connected.
        dist.barrier()
        results.put((rank, "ok", _plain(fn(rank, world, *args))))
    except BaseException:  # report, never hang the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout_s: float = 300.0, backend: str = "gloo"):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(r, world, init_file, fn, args, results, backend)) for r in range(world)]
        for p in procs:
            p.start()
        out = {}
        try:
            for _ in range(world):
                rank, status, value = results.get(timeout=timeout_s)
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                out[rank] = _tensors(value)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return [out[r] for r in range(world)]
