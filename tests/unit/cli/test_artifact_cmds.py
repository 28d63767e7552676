"""`tuneyard download` writes only inside its directory, whatever paths the server lists
(the commands themselves run against the API in tests/integration/api/test_api_artifacts.py)."""

from __future__ import annotations

import pytest

from cli.artifact_cmds import safe_target
from cli.http_client import ClientError


def test_a_listed_path_lands_inside_the_directory(tmp_path) -> None:
    assert safe_target(tmp_path, "model/weights.bin") == tmp_path / "model" / "weights.bin"


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "", "."])
def test_a_path_that_would_leave_the_directory_is_refused(tmp_path, path: str) -> None:
    with pytest.raises(ClientError, match="unsafe file path"):
        safe_target(tmp_path, path)
