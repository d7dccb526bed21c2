"""`tokenmill quantize`: post-training quantization with a sensitivity report."""
