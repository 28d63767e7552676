"""A local server that speaks the Hugging Face hub's file protocol, for tests and the sweep.

`serve_hub(root)` serves the repositories under `root/<org>/<name>/` over HTTP on loopback, as
the hub does for `huggingface_hub` pointed at it with `HF_ENDPOINT` (or `endpoint=`):
`HEAD`/`GET /<org>/<name>/resolve/<revision>/<file>` with the `X-Repo-Commit`, `ETag` and
size headers `hf_hub_download` and `get_hf_file_metadata` read, and
`GET /api/models/<org>/<name>[/revision/<revision>]` (`sha`, `siblings`) and
`.../tree/<revision>` (the file list) that `snapshot_download` reads. Dataset repositories live
under `root/datasets/<org>/<name>/` (`write_dataset_repo`) and answer the same requests with the
hub's dataset prefixes: `/datasets/<org>/<name>/resolve/...` and `/api/datasets/<org>/<name>...`,
as `snapshot_download(repo_type="dataset")` asks. A repository's commit is a hash of its files,
so changing a file makes a new revision; `main` and every commit the server has shown resolve (the hub keeps
history), anything else is `RevisionNotFound`.
Missing repositories and files answer 404 with the hub's `X-Error-Code`, and a repository
named in `gated` answers 401 `GatedRepo`, so callers meet the hub's own exceptions.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

DATASETS = "datasets"  # the folder under root, and the URL prefix, of dataset repositories


def _files_of(repo: Path) -> dict[str, bytes]:
    files = sorted(p for p in repo.rglob("*") if p.is_file())
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in files}


def _commit_of(files: dict[str, bytes]) -> str:
    digest = hashlib.sha1()
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def repo_commit(repo: Path) -> str:
    """The 40-hex commit of a repository directory: a hash of its file names and contents."""
    return _commit_of(_files_of(repo))


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _HubHandler(BaseHTTPRequestHandler):
    root: Path
    gated: frozenset[str] = frozenset()
    # (repo, commit) -> its files: every commit the server has shown stays resolvable, as
    # on the hub, after the directory (`main`) changes.
    history: dict[tuple[str, str], dict[str, bytes]]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(send_body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if parts[:2] in (["api", "models"], ["api", "datasets"]) and len(parts) >= 4:
            # a dataset repository is named by its place under root: datasets/<org>/<name>
            prefix = [] if parts[1] == "models" else [DATASETS]
            revision = parts[5] if len(parts) >= 6 else "main"
            return self._repo_info(prefix + parts[2:4], revision, tree=parts[4:5] == ["tree"])
        if parts[:1] == [DATASETS] and len(parts) >= 6 and parts[3] == "resolve":
            return self._file(parts[:3], parts[4], "/".join(parts[5:]), send_body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(parts[:2], parts[3], "/".join(parts[4:]), send_body)
        return self._error(404, "RepoNotFound")

    def _repo(self, org_name: list[str], revision: str) -> tuple[dict[str, bytes], str] | None:
        """The files and commit of `revision` (main: the directory now), or None (answered)."""
        name = "/".join(org_name)
        repo = self.root.joinpath(*org_name)
        if name in self.gated:
            self._error(401, "GatedRepo")
            return None
        if not repo.is_dir() or any(p in ("", ".", "..") for p in org_name):
            self._error(404, "RepoNotFound")
            return None
        files = _files_of(repo)
        commit = _commit_of(files)
        self.history.setdefault((name, commit), files)
        if revision == "main":
            return files, commit
        if (name, revision) not in self.history:
            self._error(404, "RevisionNotFound")
            return None
        return self.history[(name, revision)], revision

    def _repo_info(self, org_name: list[str], revision: str, tree: bool) -> None:
        """The repository's info (`sha`, `siblings`), or its recursive file tree."""
        found = self._repo(org_name, revision)
        if found is None:
            return
        files, commit = found
        info = {
            "id": "/".join(org_name[-2:]),
            "sha": commit,
            "siblings": [{"rfilename": n} for n in sorted(files)],
        }
        listing = [
            {"type": "file", "path": n, "size": len(data), "oid": _git_blob_id(data)}
            for n, data in sorted(files.items())
        ]
        body = json.dumps(listing if tree else info).encode()
        self._send(200, body, {"Content-Type": "application/json"}, True)

    def _file(self, org_name: list[str], revision: str, name: str, send_body: bool) -> None:
        found = self._repo(org_name, revision)
        if found is None:
            return
        files, commit = found
        if name not in files:
            return self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
        body = files[name]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(body).hexdigest()}"'}
        self._send(200, body, headers, send_body)

    def _error(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self._send(status, body, {"X-Error-Code": code, **(headers or {})}, True)

    def _send(self, status: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)


@contextmanager
def serve_hub(root: Path, gated: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve the repositories under `root` on a free loopback port; yields the endpoint URL."""
    attrs = {"root": root, "gated": frozenset(gated), "history": {}}
    handler = type("HubHandler", (_HubHandler,), attrs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write_repo(root: Path, name: str, files: dict[str, bytes | str | dict]) -> Path:
    """A repository `name` (org/name) under `root` with the given files (dicts as JSON)."""
    repo = root / name
    for relative, content in files.items():
        path = repo / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict):
            content = json.dumps(content)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return repo


def write_dataset_repo(root: Path, name: str, files: dict[str, bytes | str | dict]) -> Path:
    """A dataset repository `name` (org/name) under `root`, served as the hub serves datasets."""
    return write_repo(root / DATASETS, name, files)
