"""`python -m ops ...` is `tokenmill ...` (for environments without the console script)."""

from ops.cli import main

main()
