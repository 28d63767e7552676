"""Suite-wide test setup: keep every test's data out of the user's home, one BLAS thread.

Package-specific fixtures live in the conftest of each test folder.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "TUNEYARD_HOME" not in os.environ:
    os.environ["TUNEYARD_HOME"] = tempfile.mkdtemp(prefix="tuneyard-test-home-")
