"""Persistent Triton kernels with a capped grid."""
