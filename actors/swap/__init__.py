"""Model swaps: the procedure, the step boundary it waits for, where models may be loaded from."""
