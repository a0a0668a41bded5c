"""One rank of the MPI test: launched by mpirun, torch.distributed over gloo from Open MPI's
environment, dcp's transfers over MPI (dcp.torch.configure(cpu_comm='mpi'))."""
import os
import sys

import numpy as np
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import cases  # noqa: E402
import dcp.torch  # noqa: E402


def main(out_dir, seed):
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=world)
    dcp.torch.configure(cpu_comm="mpi")
    result = cases.op_case(rank, world, seed, "fp32", "dcp", 32)
    np.savez(f"{out_dir}/rank{rank}.npz", **{k: v.numpy() for k, v in result.items()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
