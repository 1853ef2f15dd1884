"""`python -m kfuse` is the `kfuse` command."""

from kfuse.cli import main

main()
