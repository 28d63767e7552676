"""The services' settings, read from `TUNEYARD_*` environment variables.

`Settings` extends the recipe settings (home, runs directory, allowed roots) with what only
the API, worker and scheduler read: which database and broker they talk to, whether API
keys are required, the largest request body the API reads (`TUNEYARD_MAX_BODY_BYTES`), and
how fresh a worker's heartbeat must be to count as live (`TUNEYARD_WORKER_LIVE_SECONDS`),
how long a queue's capacity is kept between reads (`TUNEYARD_CAPACITY_CACHE_SECONDS`),
how many threads run the API's sync routes (`TUNEYARD_API_THREADS`), and how long the API
waits for a request's headers and body (`TUNEYARD_HEADER_TIMEOUT_SECONDS`,
`TUNEYARD_BODY_TIMEOUT_SECONDS`).
The embedded default (no PostgreSQL, no Redis) keeps everything in a SQLite file under the
home directory.
"""

from __future__ import annotations

from functools import lru_cache

from jobs.recipe.settings import RecipeSettings, hub_offline_from_env


class Settings(RecipeSettings):
    # A server whose workers cannot download (HF_HUB_OFFLINE=1, or TUNEYARD_HUB_OFFLINE)
    # refuses hub names its cache lacks (`jobs.recipe.model.hub`).
    hub_offline: bool = hub_offline_from_env()
    # An online server fetches the config.json of a hub model it has not cached, and pins
    # the job to that commit (`jobs.recipe.model.hub`); TUNEYARD_HUB_FETCH=0 turns it off.
    hub_fetch: bool = True
    database_url: str | None = None
    broker_url: str | None = None
    auth: str = "on"
    # A recipe is a few KB; 1 MiB leaves room for long data lists and refuses a body whose
    # parsing alone would cost seconds of CPU.
    max_body_bytes: int = 1 << 20
    # A worker whose heartbeat is older is not asked whether it has a job's packages.
    worker_live_seconds: float = 30.0
    # How long the API keeps a queue's capacity (its workers' device memory, its measured
    # throughput) between reads; a new worker or a finished job shows up this much later.
    capacity_cache_seconds: float = 2.0
    # Threads the API runs its sync routes on (anyio's default is 40); the database pool
    # (10 + 30 overflow) covers them.
    api_threads: int = 16
    # A client sending its request a byte at a time holds a connection (and, while its body
    # trickles in, a request) for as long as it likes unless the server gives up on it:
    # headers must be complete this long after the connection opens or the request starts
    # (`api.server`), the whole body this long after the headers (`api.middleware`).
    # A recipe is a few KB; the largest body (1 MiB) in 60 s needs only 17 KB/s.
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    # Webhook URLs may name loopback, private and link-local addresses
    # (TUNEYARD_WEBHOOK_ALLOW_PRIVATE); unset: only on the embedded SQLite default.
    webhook_allow_private: bool | None = None

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tuneyard.db'}"

    @property
    def auth_enabled(self) -> bool:
        return self.auth.strip().lower() not in {"off", "0", "false", "no"}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
