"""Training data: allowlisted datasets, packing, collation and the resumable sampler."""
