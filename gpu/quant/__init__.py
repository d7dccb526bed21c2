"""Weight-only quantization: quantized matrices, the layers that run them, and their kernels."""
