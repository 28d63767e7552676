"""Suite-wide test setup: keep every test's data out of the user's home, one BLAS thread.

Package-specific fixtures live in the conftest of each test folder; `s3_server` (a real
SeaweedFS S3 gateway, `tests/s3_server.py`) is shared by every folder that stores artifacts.
"""

from __future__ import annotations

import os
import tempfile

from s3_server import s3_server  # noqa: F401 - the session's SeaweedFS, started on first use

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "TUNEYARD_HOME" not in os.environ:
    os.environ["TUNEYARD_HOME"] = tempfile.mkdtemp(prefix="tuneyard-test-home-")
