"""tokenmill's Triton kernels: CUDA, or the CPU through Triton's interpreter (tests); triton
itself is imported on first use."""
