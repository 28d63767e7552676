"""Which paths a recipe may name: the data and checkpoint roots, path forms (prefixes,
globs), reading a file inside them, and the caller's project scope for run directories.
"""
