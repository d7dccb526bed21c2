"""Triton kernels for CUDA, or the CPU under Triton's interpreter; triton loads on first use."""
