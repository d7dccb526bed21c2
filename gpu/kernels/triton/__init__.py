"""tokenmill's Triton kernels: CUDA, or the CPU through Triton's interpreter (tests)."""
