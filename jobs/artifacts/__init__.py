"""The artifact store: checkpoints and exports copied to S3-compatible object storage.

`manifest` says what a stored artifact is (every file with its size and SHA-256) and checks
a directory against it; `s3` uploads a directory (multipart, checksummed, resumable, the
manifest written last so that no half upload is ever presented as complete), downloads and
verifies one, deletes one (manifest first, so that no half delete is presented as
complete either), and signs short-lived download URLs. The layout of keys is the contract's
(`jobs.recipe.paths.stored`); the database rows that list artifacts are `jobs.store`'s.
boto3 is imported only when a store is used: the API and `tuneyard validate` start without it.
"""
