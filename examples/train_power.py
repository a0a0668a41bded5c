"""train_power.py — the energy and SM clock of a rank's GPU over a run's measured steps, from NVML.

Why a training run records them: an H200 trains at its power limit, and a mode whose kernels do
the same work in less time draws that limit harder, so the GPU lowers its SM clock for every
kernel of the step, the GEMMs that both modes share included (docs/training.md, "The power
limit"). Step times then tell half of a comparison; energy per step and the clock tell the rest.

The energy is NVML's counter (mJ since the driver loaded), read at the start of the first measured
step and after the last one: exact over the window, whatever the sampling. The clock is sampled
every `period_s` on a thread of its own. NVML ships with the driver (libnvidia-ml.so.1) and is
reached through ctypes, so nothing is installed for it; where it is missing (CPU runs, no NVIDIA
driver, a GPU NVML cannot name) the meter is None and the run records no figures.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from typing import Dict, List, Optional, Tuple

_NVML_SUCCESS = 0
_NVML_CLOCK_SM = 1


def _nvml_uuid(device) -> Optional[str]:
    """The GPU's UUID as NVML writes it ("GPU-xxxxxxxx-..."), from torch's device properties."""
    import torch
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid


class GpuMeter:
    """The energy counter on demand and SM clock samples of one GPU; open() gives None where NVML
    cannot measure it."""

    def __init__(self, lib, handle, period_s: float):
        self._lib, self._handle, self._period = lib, handle, period_s
        self._samples: List[Tuple[float, int]] = []  # (time.perf_counter(), SM clock in MHz)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="gpu-meter", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, device, period_s: float = 0.05) -> Optional["GpuMeter"]:
        if getattr(device, "type", None) != "cuda":
            return None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        lib.nvmlDeviceGetHandleByUUID.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        lib.nvmlDeviceGetTotalEnergyConsumption.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]
        lib.nvmlDeviceGetClockInfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
        lib.nvmlDeviceGetEnforcedPowerLimit.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
        if lib.nvmlInit_v2() != _NVML_SUCCESS:
            return None
        handle = ctypes.c_void_p()
        uuid = _nvml_uuid(device)
        found = uuid is not None and lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) == _NVML_SUCCESS
        if not found and "CUDA_VISIBLE_DEVICES" not in os.environ:  # torch's index is NVML's index then
            found = lib.nvmlDeviceGetHandleByIndex_v2(device.index or 0, ctypes.byref(handle)) == _NVML_SUCCESS
        if not found:
            lib.nvmlShutdown()
            return None
        meter = cls(lib, handle, period_s)
        if meter.energy_mj() is None:  # GPUs before Volta have no counter
            meter.close()
            return None
        return meter

    def energy_mj(self) -> Optional[int]:
        value = ctypes.c_ulonglong()
        ok = self._lib.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(value)) == _NVML_SUCCESS
        return int(value.value) if ok else None

    def power_limit_w(self) -> Optional[float]:
        value = ctypes.c_uint()
        ok = self._lib.nvmlDeviceGetEnforcedPowerLimit(self._handle, ctypes.byref(value)) == _NVML_SUCCESS
        return value.value / 1e3 if ok else None

    def clocks_between(self, t0: float, t1: float) -> List[int]:
        return [mhz for t, mhz in list(self._samples) if t0 <= t <= t1]

    def _sample(self) -> None:
        value = ctypes.c_uint()
        while not self._stop.wait(self._period):
            if self._lib.nvmlDeviceGetClockInfo(self._handle, _NVML_CLOCK_SM, ctypes.byref(value)) == _NVML_SUCCESS:
                self._samples.append((time.perf_counter(), int(value.value)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._lib.nvmlShutdown()


def window_figures(energy_mj: Tuple[int, int], seconds: float, steps: int, clocks_mhz: List[int],
                   power_limit_w: Optional[float]) -> Dict[str, object]:
    """One GPU's figures over `steps` steps that took `seconds` and used the energy between the
    counter's two readings; the clock's median and spread over the samples in that window."""
    joules = (energy_mj[1] - energy_mj[0]) / 1e3
    clocks = sorted(clocks_mhz)

    def pick(f):
        return clocks[min(len(clocks) - 1, int(f * len(clocks)))] if clocks else None

    return {"energy_j_per_step": round(joules / steps, 2), "power_w_mean": round(joules / seconds, 1),
            "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
            "sm_clock_mhz_p10": pick(0.1), "sm_clock_mhz_p90": pick(0.9), "clock_samples": len(clocks),
            "power_limit_w": power_limit_w}


def run_figures(per_rank: List[Optional[Dict[str, object]]], tokens_per_step: int) -> Optional[Dict[str, object]]:
    """The run's figures from every rank's window_figures (None unless every rank measured): the
    energy of a step summed over the GPUs, tokens per kJ of it, the slowest rank's median clock."""
    if not per_rank or any(r is None for r in per_rank):
        return None
    joules = sum(r["energy_j_per_step"] for r in per_rank)
    clocks = [r["sm_clock_mhz_median"] for r in per_rank if r["sm_clock_mhz_median"] is not None]
    return {"energy_j_per_step": round(joules, 2), "tokens_per_kj": round(tokens_per_step / joules * 1e3, 1) if joules > 0 else None,
            "power_w_mean": round(sum(r["power_w_mean"] for r in per_rank), 1),
            "sm_clock_mhz_median": min(clocks) if clocks else None, "ranks": per_rank}
