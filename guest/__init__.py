"""atefleet guest: the tool server inside each actor (entry point: `python -m guest`)."""
