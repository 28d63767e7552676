"""The parallel layout of a job: the `distributed:` section read into a `DistributedSetup`,
the rules a topology obeys (sizes, world size, pipeline), and what the trainer can run.
"""
