"""Fixtures for API tests: a migrated PostgreSQL database and SQLite file, an app per
backend on Redis DB 1, API keys of every role in two projects, and a valid recipe.

PostgreSQL databases are `tuneyard_api_test_<random>` (created and dropped through the
`postgres` database); Redis DB 1 belongs to these tests and is flushed before and after.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pg_databases import create_pg_database, drop_pg_database
from sqlalchemy.orm import Session, sessionmaker

from api.main import create_app
from cli.demo_assets import write_squad_dir
from jobs.store.api_keys import create_api_key
from jobs.store.engine import dispose_engines, get_engine, upgrade_database
from jobs.store.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/1"
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture(scope="session")
def redis_db1() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    model = root / "tiny_llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    write_squad_dir(root / "squad", n=8)
    return root


@pytest.fixture(scope="session")
def recipe(data_root: Path) -> dict[str, Any]:
    return {
        "step_scheduler": {"max_steps": 20, "global_batch_size": 8},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(data_root / "tiny_llama"),
                  "dtype": "float32"},
        "distributed": {"strategy": "fsdp2", "dp_size": "auto"},
        "dataset": {"_target_": "tuneyard.datasets.SquadDataset",
                    "path_or_dataset": str(data_root / "squad"), "max_seq_length": 64},
        "dataloader": {"batch_size": 4},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
    }  # fmt: skip


@dataclass
class Stack:
    """One app on one backend, with keys: `client(role)` sends that role's key."""

    backend: str
    settings: Settings
    app: FastAPI
    keys: dict[str, str]  # role -> raw key of project A; "other" -> admin of project B
    project: str

    def headers(self, role: str = "submit") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def session(self) -> Session:
        return sessionmaker(bind=get_engine(self.settings), expire_on_commit=False)()


def _settings(url: str, tmp: Path, data_root: Path) -> Settings:
    return Settings(home=tmp / "home", database_url=url, broker_url=REDIS_URL,
                    data_roots=str(data_root), checkpoint_roots=str(tmp / "ckpt"),
                    runs_dir=tmp / "runs", auth="on")  # fmt: skip


def _make_stack(backend: str, url: str, tmp: Path, data_root: Path) -> Stack:
    settings = _settings(url, tmp, data_root)
    upgrade_database(settings)
    project = f"proj-{uuid.uuid4().hex[:6]}"
    keys: dict[str, str] = {}
    with sessionmaker(bind=get_engine(settings))() as session:
        for role in ("admin", "submit", "read"):
            keys[role] = create_api_key(session, project, role)[1]
        keys["other"] = create_api_key(session, project + "-other", "admin")[1]
        session.commit()
    return Stack(backend, settings, create_app(settings), keys, project)


@pytest.fixture(scope="session")
def pg_stack(tmp_path_factory, data_root, redis_db1) -> Iterator[Stack]:
    url = create_pg_database()
    try:
        yield _make_stack("postgresql", url, tmp_path_factory.mktemp("pg"), data_root)
    finally:
        dispose_engines()
        drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_stack(tmp_path_factory, data_root, redis_db1) -> Stack:
    tmp = tmp_path_factory.mktemp("sqlite")
    return _make_stack("sqlite", f"sqlite:///{tmp / 'tuneyard.db'}", tmp, data_root)


@pytest.fixture(params=["postgresql", "sqlite"])
def stack(request: pytest.FixtureRequest) -> Stack:
    return request.getfixturevalue("pg_stack" if request.param == "postgresql" else "sqlite_stack")


@pytest.fixture
def client(stack: Stack) -> Iterator[TestClient]:
    with TestClient(stack.app) as test_client:
        yield test_client


@pytest.fixture
def body(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"name": "tiny", "recipe": copy.deepcopy(recipe),
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip
