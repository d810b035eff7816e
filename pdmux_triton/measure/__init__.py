"""Measurements on the GPU: timing, workloads, the calibration and comparison sweeps."""
