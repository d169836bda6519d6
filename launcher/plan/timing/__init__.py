"""Step time: kernels, collectives, priced from the catalog or a measured profile; the estimate that
sums them."""
