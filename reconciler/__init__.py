"""The reconciler: idle suspension, status sync with Substrate, queue repair and garbage collection,
run by one leader among any number of instances (see `reconciler.service`; entry: `reconciler.main`)."""
