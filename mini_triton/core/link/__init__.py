"""A link between two of our processes: a socket pair for small messages and shared memory
for large tensors. A Python model's worker and the server talk over one; so do a front-end
process and the main process."""
