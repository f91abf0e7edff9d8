"""`python -m atefleet`: the same as the `atefleet` command."""

from atefleet.cli import main

main()
