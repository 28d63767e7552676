"""Local commands: `tuneyard up` (the whole stack in one command) and `tuneyard demo`.

`up` runs `tuneyard migrate`, then the API, a worker and the scheduler as child processes on
the embedded default (SQLite database and broker under TUNEYARD_HOME, auth off) unless the
environment names PostgreSQL/Redis; Ctrl-C stops all of them, process groups included. Its
API logs no line per request unless `--access-log` asks for them: the dashboard polls every
few seconds, and those lines would bury what the stack has to say.
`demo` does the same on a free port, builds a tiny Llama and a dataset it visibly learns
(`cli.demo_assets`, no downloads), submits a short fine-tune, shows its progress, and ends
with the checkpoint path and how to load it with transformers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import webbrowser
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from cli.client_cmds import console, exits_on_client_error, watch_job
from cli.http_client import TuneyardClient, items_of
from cli.terminal import markup_safe
from jobs.store.status import JobStatus

SERVICES = ("api", "worker", "scheduler")


def embedded_env(port: int, force_embedded: bool = False) -> dict[str, str]:
    """The child processes' environment; auth is off only on the embedded database.

    `force_embedded` (the demo) ignores a configured PostgreSQL/Redis: the demo never
    writes into a shared deployment.
    """
    env = dict(os.environ)
    if force_embedded:
        for name in ("TUNEYARD_DATABASE_URL", "TUNEYARD_BROKER_URL", "TUNEYARD_AUTH"):
            env.pop(name, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["TUNEYARD_URL"] = f"http://127.0.0.1:{port}"
    if "TUNEYARD_DATABASE_URL" not in env:
        env.setdefault("TUNEYARD_AUTH", "off")
    return env


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free TCP port")


class LocalStack:
    """migrate, then api + worker + scheduler as child process groups; stops them all."""

    def __init__(
        self,
        host: str,
        port: int,
        log_dir: Path | None = None,
        embedded: bool = False,
        access_log: bool = False,
    ):
        self.host, self.port, self.log_dir, self.access_log = host, port, log_dir, access_log
        self.env = embedded_env(port, force_embedded=embedded)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list[IO[str]] = []

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def command(self, name: str) -> list[str]:
        cmd = [sys.executable, "-m", "cli.main", name]
        if name != "api":
            return cmd
        access = "--access-log" if self.access_log else "--no-access-log"
        return [*cmd, "--host", self.host, "--port", str(self.port), access]

    def _output(self, name: str) -> dict[str, Any]:
        if self.log_dir is None:
            return {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("a")
        self.logs.append(log)
        return {"stdout": log, "stderr": subprocess.STDOUT}

    def start(self) -> None:
        migrate = subprocess.run(self.command("migrate"), env=self.env, **self._output("migrate"))
        if migrate.returncode != 0:
            raise RuntimeError(f"`tuneyard migrate` failed{self.hint('migrate')}")
        for name in SERVICES:
            self.procs[name] = subprocess.Popen(
                self.command(name), env=self.env, start_new_session=True, **self._output(name)
            )

    def hint(self, name: str) -> str:
        return f"; see {self.log_dir / f'{name}.log'}" if self.log_dir else ""

    def dead(self) -> str | None:
        """The name of a child that exited, if any."""
        return next((n for n, p in self.procs.items() if p.poll() is not None), None)

    def wait_ready(self, timeout: float = 90.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (name := self.dead()) is not None:
                raise RuntimeError(f"`tuneyard {name}` exited at start{self.hint(name)}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the API was not ready after {timeout:.0f}s{self.hint('api')}")

    def stop(self, grace: float = 20.0) -> None:
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        for log in self.logs:
            log.close()

    def __enter__(self) -> LocalStack:
        # SIGTERM (docker stop, a supervisor, `kill`) stops the children like Ctrl-C does.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the worker's torchrun ranks live in the same group


def up(
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API and dashboard port.")] = 8000,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log one line per request.")
    ] = False,
) -> None:
    """Run the API, a worker and the scheduler together (Ctrl-C stops them)."""
    stack = LocalStack(host, port, access_log=access_log)
    if stack.env.get("TUNEYARD_AUTH") == "off":
        console().print(
            "[yellow]embedded default: SQLite under TUNEYARD_HOME, auth is OFF[/yellow]"
        )
    try:
        with stack:
            console().print(f"tuneyard is up: dashboard and API at [bold]{stack.url}[/bold]")
            while (name := stack.dead()) is None:
                time.sleep(1.0)
            console().print(f"[red]`tuneyard {name}` exited; stopping the others[/red]")
            raise typer.Exit(1)
    except RuntimeError as exc:
        console().print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console().print("stopped")


DEMO_MODEL = {"hidden_size": 128, "intermediate_size": 256}  # masters the task in ~200 steps
DEMO_TRAIN, DEMO_HELD_OUT = 2000, 5


def build_demo_assets(directory: Path) -> dict[str, Path]:
    """A tiny Llama + tokenizer and a reverse-the-digits instruction set (train and val)."""
    from transformers.utils import logging as hf_logging

    from cli.demo_assets import build_tiny_llama, write_instruction_jsonl

    hf_logging.disable_progress_bar()  # the demo shows its own progress

    model_dir = directory / "model"
    config = model_dir / "config.json"
    if not config.exists() or json.loads(config.read_text())["hidden_size"] != 128:
        build_tiny_llama(model_dir, **DEMO_MODEL)
    train = write_instruction_jsonl(directory / "data" / "train.jsonl", n=DEMO_TRAIN, seed=0)
    val = write_instruction_jsonl(directory / "data" / "val.jsonl", n=64, seed=1)
    return {"model": model_dir, "train": train, "val": val}


def held_out_prompts() -> list[dict[str, str]]:
    """Prompts the demo never trains on (nor validates on): the before/after table's rows."""
    from cli.demo_assets import held_out_pairs, instruction_pairs

    seen = instruction_pairs(DEMO_TRAIN, seed=0) + instruction_pairs(64, seed=1)
    return held_out_pairs(DEMO_HELD_OUT, seen)


def answer_table(pairs: list[dict[str, str]], before: list[str], after: list[str]) -> Any:
    """Prompt, expected answer, the model's greedy answer before and after, and right/wrong."""
    from rich.table import Table

    table = Table(title="held-out prompts (never trained on)")
    for column in ("prompt", "expected", "before", "", "after", " "):
        table.add_column(column)
    for pair, old, new in zip(pairs, before, after, strict=True):
        want = pair["completion"].strip()
        table.add_row(
            pair["prompt"],
            want,
            old or "(nothing)",
            _mark(old == want),
            new or "(nothing)",
            _mark(new == want),
        )
    return table


def _mark(right: bool) -> str:
    return "[green]right[/green]" if right else "[red]wrong[/red]"


def right_count(pairs: list[dict[str, str]], answers: list[str]) -> int:
    return sum(a == p["completion"].strip() for p, a in zip(pairs, answers, strict=True))


def demo_recipe(assets: dict[str, Path], max_steps: int) -> dict[str, Any]:
    """A short full fine-tune of the tiny Llama that visibly lowers the loss on CPU."""

    def dataset(path: Path) -> dict[str, Any]:
        return {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(path),
            "tokenizer_name_or_path": str(assets["model"]),
            "max_seq_length": 64,
        }

    return {
        "step_scheduler": {
            "max_steps": max_steps,
            "num_epochs": 100,  # max_steps ends the run, not the 32-step epoch
            "global_batch_size": 16,
            "local_batch_size": 16,
            "val_check_interval": max(1, max_steps // 4),
            "checkpoint_interval": max_steps,
            "log_interval": 1,
        },
        "rng": {"seed": 0},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(assets["model"]),
            "dtype": "float32",
        },
        "dataset": dataset(assets["train"]),
        "validation_dataset": dataset(assets["val"]),
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 2e-3, "weight_decay": 0.0},
        "checkpoint": {"enabled": True},
    }


def hf_model_dir(checkpoint: str) -> Path:
    """The transformers-loadable folder of a checkpoint (its consolidated `model/`)."""
    path = Path(checkpoint)
    return path / "model" if (path / "model" / "config.json").exists() else path


def loading_snippet(model_dir: Path) -> str:
    return (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f'model = AutoModelForCausalLM.from_pretrained("{model_dir}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{model_dir}")\n'
        'inputs = tokenizer("<s>Reverse 1 2 3 4:", return_tensors="pt", add_special_tokens=False)\n'
        "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=8)[0]))"
    )


@exits_on_client_error
def demo(
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Do not open a browser.")
    ] = False,
    port: Annotated[int, typer.Option(help="Port (a free one if taken).")] = 8000,
    max_steps: Annotated[int, typer.Option(help="Training steps.")] = 300,
) -> None:
    """Train a tiny model end to end on this machine and show where its checkpoint is."""
    from jobs.store.settings import get_settings

    home = get_settings().home
    directory = home / "demo"
    console().print(f"building a tiny Llama and a dataset in {directory} ...")
    assets = build_demo_assets(directory)
    from cli.demo_assets import greedy_answers

    held_out = held_out_prompts()
    before = greedy_answers(assets["model"], [p["prompt"] for p in held_out])
    stack = LocalStack("127.0.0.1", free_port(port), directory / "logs", embedded=True)
    console().print("starting the API, a worker and the scheduler (embedded SQLite) ...")
    try:
        with stack:
            client = TuneyardClient(stack.url)  # the embedded stack runs with auth off
            job = client.submit(
                {
                    "name": "demo",
                    "recipe": demo_recipe(assets, max_steps),
                    "labels": {"demo": "true"},
                }
            )
            url = f"{stack.url}/jobs/{job['id']}"
            console().print(f"job {job['id']} submitted; watch it live at [bold]{url}[/bold]")
            if not no_browser:
                webbrowser.open(url)
            job = watch_job(client, job["id"], 1.0, console(), as_json=False)
            model_dir = report_demo(client, job, assets, stack)
            after = greedy_answers(model_dir, [p["prompt"] for p in held_out])
            console().print(answer_table(held_out, before, after))
            console().print(
                f"held-out answers right: {right_count(held_out, before)}/"
                f"{len(held_out)} before -> {right_count(held_out, after)}/"
                f"{len(held_out)} after training"
            )
    except RuntimeError as exc:
        console().print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console().print("interrupted; the stack is stopped")
        raise typer.Exit(130) from None


def report_demo(
    client: TuneyardClient, job: dict, assets: dict[str, Path], stack: LocalStack
) -> Path:
    """The job's outcome and loss; returns the checkpoint's transformers-loadable folder."""
    if job["status"] != JobStatus.SUCCEEDED:
        reason = markup_safe(job.get("error_message") or "")
        console().print(f"[red]demo job {markup_safe(job['status'])}:[/red] {reason}")
        console().print(f"logs: tuneyard logs {job['id']} (stack logs in {stack.log_dir})")
        raise typer.Exit(1)
    checkpoints = client.checkpoints(job["id"])
    if not checkpoints:
        console().print("[red]the job succeeded but recorded no checkpoint[/red]")
        raise typer.Exit(1)
    model_dir = hf_model_dir(checkpoints[-1]["path"])
    console().print(f"[green]demo job succeeded[/green]; checkpoint: [bold]{model_dir}[/bold]")
    first = items_of(client.metrics(job["id"]))[:1]
    last = job.get("latest_metrics") or {}
    if first and last.get("loss") is not None:
        console().print(
            f"train loss fell from {first[0]['loss']:.2f} to {last['loss']:.2f} "
            f"over {last.get('step')} steps"
        )
    console().print("load it with transformers:\n")
    console().print(loading_snippet(model_dir), markup=False)
    console().print("\nbrowse the dashboard again with `tuneyard up`.")
    return model_dir


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(demo)
