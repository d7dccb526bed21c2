"""`tokenmill swap/rollback/drain/status`: signed control commands and the events they answer
with."""
