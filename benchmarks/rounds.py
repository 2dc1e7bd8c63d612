"""Latency in interleaved rounds: numbers that survive a rerun on a shared machine.

One latency pass per row measures each row during a different minute, so a noisy minute lands on
whichever row ran then. Here every row's model is loaded once, in a server process of its own
(``python -m benchmarks.rounds REQUEST.json``, the same loaders and timing loop as
``compress.evaluate_worker``), and each round times every row over the dev rows once. A round is cut
into ``slices``: slice by slice, every server in turn times its share of the dev rows, so the rows
take turns every second or two rather than every minute. A row's round is its slices' requests
pooled; its p50 is the median of its rounds' p50s, with their min–max as the spread. The turns
alternate direction (forward, backward, forward, ...) so a drift in the machine's speed falls on
early rows in one turn and late rows in the next.

Why slices: on a shared 2-vCPU VM the machine slows down by ~1.6× for a few seconds at a time
(measured on the AMD EPYC host: one process timing two models alone on the VM saw both slow down
together; that the cause lies outside the VM is an inference, not a measurement). Rows measured
minutes apart then catch different shares of slow seconds, and their ratios move by 20-40% between
runs; rows that take turns every second or two catch about the same share. Slices do not help when a
slow spell lasts the whole of a task's rounds (benchmarks/README.md). Loading once per row keeps the
extra wall time to the timing loops and a few untimed requests before each slice (``rewarm``), which
refill the caches the other rows' turns evicted.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol, TextIO


class Server(Protocol):
    def latency(self, warmup: int, samples: int, start: int = 0) -> dict[str, Any]: ...


def round_order(rows: int, index: int) -> list[int]:
    """The order rows are measured in round ``index`` (from 0): forward on even rounds, backward on odd."""
    order = list(range(rows))
    return order if index % 2 == 0 else order[::-1]


def aggregate(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's latency over its rounds: the median of the rounds' p50 and p90, the p50's min–max,
    and each part's median p50 when the rounds timed parts."""
    if not per_round:
        raise ValueError("no rounds to aggregate")
    p50s = [r["p50"] for r in per_round]
    out: dict[str, Any] = {
        "rounds": len(per_round),
        "p50_ms": statistics.median(p50s),
        "p50_min_ms": min(p50s),
        "p50_max_ms": max(p50s),
        "p90_ms": statistics.median(r["p90"] for r in per_round),
        "per_round": [{key: r[key] for key in ("p50", "p90", "mean", "samples")} for r in per_round],
        "parts_ms": None,
    }
    if all(r.get("parts") for r in per_round):
        names = per_round[0]["parts"]
        out["parts_ms"] = {
            name: statistics.median(r["parts"][name]["p50"] for r in per_round) for name in names
        }
    return out


def slice_bounds(samples: int, slices: int) -> list[tuple[int, int]]:
    """``(start, count)`` of each slice of ``samples`` requests: contiguous, covering each once, sizes
    differing by at most one; never more slices than requests."""
    slices = max(1, min(slices, samples))
    edges = [samples * k // slices for k in range(slices + 1)]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(edges)]


def pool(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's summary from its slices' raw timings (``seconds``, ``part_seconds``), as if timed
    in one pass; a round of one slice is that slice's summary."""
    if len(pieces) == 1:
        return {k: v for k, v in pieces[0].items() if k not in ("seconds", "part_seconds")}
    from compress.metrics import latency_parts, latency_summary

    out: dict[str, Any] = latency_summary([t for piece in pieces for t in piece["seconds"]])
    if all(piece.get("part_seconds") for piece in pieces):
        names = pieces[0]["part_seconds"]
        out["parts"] = latency_parts(
            {name: [t for piece in pieces for t in piece["part_seconds"][name]] for name in names}
        )
    return out


def interleave(
    servers: Sequence[Server],
    rounds: int,
    warmup: int,
    samples: int,
    slices: int = 1,
    rewarm: int = 2,
) -> tuple[list[list[dict[str, Any]]], list[list[int]]]:
    """Every server's latency summary per round (``[server][round]``) and the order of every turn
    (``rounds × slices`` of them). Each turn asks every server for one slice of the requests; a
    server's first slice is preceded by ``warmup`` untimed requests, every later one by ``rewarm``."""
    results: list[list[dict[str, Any]]] = [[] for _ in servers]
    orders, turn = [], 0
    bounds = slice_bounds(samples, slices)
    for _ in range(rounds):
        pieces: list[list[dict[str, Any]]] = [[] for _ in servers]
        for start, count in bounds:
            order = round_order(len(servers), turn)
            for position in order:
                before = warmup if turn == 0 else rewarm
                pieces[position].append(servers[position].latency(before, count, start))
            orders.append(order)
            turn += 1
        for position, piece in enumerate(pieces):
            results[position].append(pool(piece))
    return results, orders


def apply(row: dict[str, Any], summary: dict[str, Any]) -> None:
    """Make the rounds' median the row's p50 and p90 (its floor ratio follows); the single pass of its
    evaluation stays in ``row["entry"]``."""
    row["rounds"] = summary
    row["p50_ms"], row["p90_ms"] = summary["p50_ms"], summary["p90_ms"]
    row["x_floor"] = row["p50_ms"] / row["floor_ms"]


def server_request(row: dict[str, Any], texts: list[str], pairs: list[str] | None) -> dict[str, Any]:
    """What a server loads and times: the row's model, with the threads its evaluation used."""
    entry = row["entry"]
    kind = {"torch": "torch", "pt2": "pt2"}.get(entry["format"], "artifact")
    return {
        "kind": kind,
        "model": entry["path"],
        "threads": entry["measured"]["threads"],
        "max_length": entry.get("max_length") or 128,
        "texts": texts,
        "pairs": pairs,
    }


class ProcessServer:
    """A server process holding one loaded model; ``latency`` runs one timed pass in it."""

    def __init__(self, request: dict[str, Any], folder: Path, name: str):
        from compress.evaluate import worker_env

        self.model, self.log_path = request["model"], folder / f"{name}.log"
        request_path = folder / f"{name}.json"
        request_path.write_text(json.dumps(request))
        env = worker_env(request["threads"])
        if request["kind"] == "pt2":  # the evaluation's inductor cache: a warm compile, as torch_int8 runs it
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(request["model"]).parent / "inductor-cache")
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.rounds", str(request_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        self._read()  # the ready line: the model is loaded

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"latency server for {self.model} exited ({self.proc.returncode}):\n{tail}")
        return json.loads(line)

    def latency(self, warmup: int, samples: int, start: int = 0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        command = {"warmup": warmup, "samples": samples, "start": start}
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def process_servers(requests: list[dict[str, Any]]) -> Iterator[list[ProcessServer]]:
    """One loaded server per request, started one after another; all closed on the way out."""
    with tempfile.TemporaryDirectory(prefix="bench-rounds-") as tmp, ExitStack() as stack:
        servers = []
        for index, request in enumerate(requests):
            server = ProcessServer(request, Path(tmp), f"row{index}")
            stack.callback(server.close)
            servers.append(server)
        yield servers


def measure_rounds(
    task_rows: list[dict[str, Any]],
    texts: list[str],
    pairs: list[str] | None,
    rounds: int,
    warmup: int,
    samples: int,
    start: Callable[[list[dict[str, Any]]], Any] = process_servers,
    slices: int = 1,
) -> list[list[int]]:
    """Measure every row's latency in ``rounds`` interleaved rounds of ``slices`` turns each and make
    the median of its rounds its p50.

    ``start(requests)`` is a context manager yielding one server per request (process servers by
    default). Each row records its ``turn`` (0-based place) in every turn, and the slices per round;
    returns every turn's order of row positions."""
    requests = [server_request(row, texts, pairs) for row in task_rows]
    with start(requests) as servers:
        results, orders = interleave(servers, rounds, warmup, samples, slices)
    used = len(slice_bounds(samples, slices))
    for position, (row, per_round) in enumerate(zip(task_rows, results, strict=True)):
        turns = [order.index(position) for order in orders]
        apply(row, {**aggregate(per_round), "slices": used, "turn": turns})
    return orders


def load(request: dict[str, Any]) -> Any:
    """The request's model, loaded as its evaluation loaded it."""
    from compress.evaluate_worker import Model, load_model

    if request["kind"] == "pt2":
        from benchmarks.torch_int8 import load_program

        predict, _ = load_program(request["model"], request["threads"], 1)
        return Model.plain(predict)
    model, _ = load_model(request)
    return model


def serve(request: dict[str, Any], commands: TextIO, replies: TextIO) -> None:
    """Load once, say ready, then answer each command line with one latency summary line."""
    from compress.evaluate_worker import time_requests

    model = load(request)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in commands:
        command = json.loads(line)
        summary = time_requests(
            model,
            request["texts"],
            request["pairs"],
            command["warmup"],
            command["samples"],
            start=command.get("start", 0),
            raw=True,
        )
        replies.write(json.dumps(summary) + "\n")
        replies.flush()


def reply_stream() -> TextIO:
    """A worker's replies: the original stdout, kept apart; from here on, anything a library prints to
    stdout goes to stderr, so it never mixes with the replies the parent reads."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


def main(argv: list[str]) -> int:
    """The server: replies go to the original stdout; anything a library prints goes to stderr."""
    (request_path,) = argv
    replies = reply_stream()
    serve(json.loads(Path(request_path).read_text()), sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
