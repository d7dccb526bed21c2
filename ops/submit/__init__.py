"""`tokenmill submit`: produce requests and wait for their results."""
