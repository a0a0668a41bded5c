"""dcp.launch: every launcher's environment read the same way, groups started from srun's and
mpirun's environments, and the planner's node layout found from the group."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

import dcp
import dcp.launch
from dcp.launch import detect, first_host, layout_of
from ranks import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = shutil.which("mpirun")


def test_each_launcher_read():
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "n0", "MASTER_PORT": "1234"}
    assert detect(torchrun) == dcp.launch.Launch("torchrun", 5, 8, 1, 4, "n0", 1234)
    openmpi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert detect(openmpi) == dcp.launch.Launch("openmpi", 3, 4, 1, 2)
    mpich = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
    assert detect(mpich) == dcp.launch.Launch("mpich", 2, 3, 2, 3)
    slurm = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
             "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "123456"}
    assert detect(slurm) == dcp.launch.Launch("slurm", 6, 8, 2, 4, "gpu007", 29500 + 3456)
    # What the user set wins over what srun implies.
    assert detect(dict(slurm, MASTER_ADDR="head", MASTER_PORT="777")).master_addr == "head"
    assert detect(dict(slurm, MASTER_ADDR="head", MASTER_PORT="777")).master_port == 777
    assert detect({}) == dcp.launch.Launch("single", 0, 1, 0, 1)


def test_launchers_nested_in_slurm():
    allocation = {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_JOB_ID": "9"}
    # torchrun started by srun: each process is torchrun's worker, srun's variables describe the agent.
    got = detect(dict(allocation, RANK="3", WORLD_SIZE="4", LOCAL_RANK="3", LOCAL_WORLD_SIZE="4"))
    assert (got.launcher, got.rank, got.world_size) == ("torchrun", 3, 4)
    # mpirun inside an allocation: the processes inherit the batch step's SLURM_PROCID of 0.
    got = detect(dict(allocation, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                      OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2"))
    assert (got.launcher, got.rank, got.world_size) == ("openmpi", 1, 2)


@pytest.mark.parametrize("env, what", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 of 2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "5", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     "local rank 5 of 2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-2"}, "host list"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK is not set"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
])
def test_bad_environment_named(env, what):
    with pytest.raises(ValueError) as err:
        detect(env)
    assert what in str(err.value)


@pytest.mark.parametrize("nodelist, host", [
    ("gpu007", "gpu007"), ("gpu[003-005,9],cpu1", "gpu003"), ("a1,b[2-3]", "a1"),
    ("rack[1-2]-n[07-08]", "rack1-n07"), ("n[12,4-6]", "n12"), (" node-a ", "node-a"),
])
def test_first_host_of_a_slurm_host_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "n[1-2", "n1-2]", "[]"])
def test_first_host_refuses_what_it_cannot_read(nodelist):
    with pytest.raises(ValueError, match="host list"):
        first_host(nodelist)


def test_layout_of_ranks():
    assert layout_of(["a"] * 4) == (1, 4)
    assert layout_of(["a", "a", "b", "b", "c", "c"]) == (3, 2)
    assert layout_of(["a", "b", "c"]) == (3, 1)
    with pytest.raises(dcp.Error, match="not grouped by node.*rank 2: node 0"):
        layout_of(["a", "b", "a", "b"])
    with pytest.raises(dcp.Error, match="different numbers of ranks.*rank 3: node 1"):
        layout_of(["a", "a", "a", "b"])


def _planner_nodes(rank, world, hosts, devices_per_node):
    """A planner on a group whose ranks claim the machines `hosts` (one per rank)."""
    dcp.launch.node_key = lambda: hosts[rank]
    try:
        planner = dcp.Planner(None, "h200-nvl", shape=(2, 1, 8), threads=1, devices_per_node=devices_per_node)
    except dcp.Error as e:
        return "error: " + str(e)
    planner.close()
    return (planner.cluster.nodes, planner.cluster.devices_per_node)


def test_planner_takes_the_nodes_from_the_group():
    assert run_ranks(4, _planner_nodes, ["h0", "h0", "h1", "h1"], None) == [(2, 2)] * 4
    assert run_ranks(4, _planner_nodes, ["h0"] * 4, None) == [(1, 4)] * 4
    # Ranks dealt round-robin over nodes: every rank raises (no rank is left waiting), and an
    # explicit node size overrides the check.
    got = run_ranks(4, _planner_nodes, ["h0", "h1", "h0", "h1"], None)
    assert all(g.startswith("error: ") and "the ranks are not grouped by node" in g for g in got), got
    assert run_ranks(4, _planner_nodes, ["h0", "h1", "h0", "h1"], 2) == [(2, 2)] * 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(**extra):
    """This environment without any launcher's per-process variables (MPI's own settings, such as
    OMPI_MCA_*, stay: a machine may need them for mpirun to start at all), plus `extra`."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    env = {k: v for k, v in os.environ.items()
           if k not in launcher and not k.startswith(("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")])), **extra)
    return env


def _read(out, world):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def test_group_started_from_srun_environment():
    """Two processes with the variables srun gives its tasks (and nothing of torchrun's)."""
    world = 2
    with tempfile.TemporaryDirectory() as out:
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "launch_case.py"), out],
                                  env=_clean_env(SLURM_PROCID=str(r), SLURM_NTASKS=str(world), SLURM_LOCALID=str(r),
                                                 SLURM_STEP_TASKS_PER_NODE=str(world),
                                                 SLURM_STEP_NODELIST="localhost", MASTER_PORT=str(port)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        logs = [p.communicate(timeout=180)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
        for r, seen in enumerate(_read(out, world)):
            assert (seen["launcher"], seen["rank"], seen["world"]) == ("slurm", r, world)
            assert (seen["torch_rank"], seen["torch_world"], seen["sum"]) == (r, world, 3.0)
            assert (seen["nodes"], seen["devices_per_node"]) == (1, 2)
            # torch's names are filled for code that reads them.
            assert seen["env"] == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                                   "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_group_started_from_mpirun():
    """mpirun -np 2 on this host: no MASTER_ADDR, the rendezvous on this host."""
    world = 2
    with tempfile.TemporaryDirectory() as out:
        env = _clean_env(MASTER_PORT=str(_free_port()), OMPI_ALLOW_RUN_AS_ROOT="1",
                         OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        run = subprocess.run([MPIRUN, "-np", str(world), sys.executable, os.path.join(HERE, "launch_case.py"), out],
                             env=env, capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        for r, seen in enumerate(_read(out, world)):
            assert seen["launcher"] in ("openmpi", "mpich")
            assert (seen["rank"], seen["world"], seen["local_world"]) == (r, world, world)
            assert (seen["torch_rank"], seen["sum"]) == (r, 3.0)
            assert seen["env"]["MASTER_ADDR"] == "127.0.0.1"
            assert (seen["nodes"], seen["devices_per_node"]) == (1, 2)
