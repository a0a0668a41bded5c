"""Launched with mpirun, CPU ranks move dcp's data over MPI: the same results as the reference."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

import dcp
import test_op
from reference import rel_error

MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None or not dcp.mpi_available(), reason="needs mpirun and a dcp built with MPI")
def test_mpirun_two_ranks_over_mpi():
    seed = 31
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        case = os.path.join(os.path.dirname(__file__), "mpi_case.py")
        run = subprocess.run([MPIRUN, "-np", "2", sys.executable, case, tmp, str(seed)], env=env,
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        want = test_op.reference(seed, torch.float32)
        for r in range(2):
            got = np.load(os.path.join(tmp, f"rank{r}.npz"))
            for name in ("o", "lse", "dq", "dk", "dv"):
                err = rel_error(torch.from_numpy(got[name]), want[name])
                assert err < 1e-5, f"rank {r} {name}: {err:.3g}"
