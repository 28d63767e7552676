"""What the client commands print for a job and a refusal (`cli.job_views`): `--json`
refusals keep the server's code, status and extra fields; summaries and status cards show
`-` for what the job does not have yet, and escape what the server sent."""

from __future__ import annotations

from cli.http_client import ClientError, CliExitCode, error_from_response
from cli.job_views import error_json, status_lines, summary_lines


class Answer:
    def __init__(self, status_code: int, body: dict):
        self.status_code, self.body, self.text = status_code, body, ""

    def json(self) -> dict:
        return self.body


def test_a_server_refusal_as_json_keeps_its_code_status_and_candidates():
    body = {"error": {"code": "ambiguous_job_id", "message": "m", "candidates": ["a", "b"]}}
    assert error_json(error_from_response(Answer(409, body))) == {
        "error": {"code": "ambiguous_job_id", "message": "m", "candidates": ["a", "b"],
                  "http_status": 409, "exit_code": 2}
    }  # fmt: skip


def test_field_errors_and_local_refusals_as_json():
    fields = error_from_response(Answer(422, {"errors": [{"loc": "x", "msg": "m"}]}))
    assert error_json(fields)["error"]["errors"] == [{"loc": "x", "msg": "m"}]
    assert error_json(fields)["error"]["code"] == "invalid_fields"
    local = error_json(ClientError("still running", CliExitCode.TIMED_OUT))["error"]
    assert local == {"code": "timed_out", "message": "still running", "http_status": None,
                     "exit_code": 4}  # fmt: skip


def test_a_job_without_metrics_plan_or_checkpoint_shows_dashes():
    job = {"id": "j", "name": "n\x1b", "status": "queued", "max_steps": None}
    lines = status_lines(job)
    assert lines[0] == "n\\x1b j"
    assert "  last step  - (no train record yet)" in lines
    assert summary_lines(job, []) == [
        "  state       queued", "  steps       0/?", "  final loss  -", "  checkpoint  -",
    ]  # fmt: skip
