import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # ranks spawned by the tests import these modules
os.environ.setdefault("OMP_NUM_THREADS", "1")
