"""One process of the launcher tests: started by srun's environment (emulated) or by mpirun, it
starts torch.distributed through dcp.launch, sums its rank over the group, makes a planner and
writes what it saw to OUT/rankR.json."""
import json
import os
import sys

import torch
import torch.distributed as dist

import dcp
import dcp.launch


def main(out_dir: str) -> None:
    launch = dcp.launch.init_process_group(device="cpu", timeout_s=120)
    total = torch.tensor([launch.rank + 1.0])
    dist.all_reduce(total)
    planner = dcp.Planner(None, "h200-nvl", shape=(2, 1, 8), threads=1)
    seen = {"launcher": launch.launcher, "rank": launch.rank, "world": launch.world_size,
            "local_rank": launch.local_rank, "local_world": launch.local_world_size,
            "torch_rank": dist.get_rank(), "torch_world": dist.get_world_size(), "sum": float(total),
            "nodes": planner.cluster.nodes, "devices_per_node": planner.cluster.devices_per_node,
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                   "MASTER_ADDR", "MASTER_PORT")}}
    planner.close()
    with open(os.path.join(out_dir, f"rank{launch.rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
