"""Producer and trainer in separate processes: refs through Redis, tensors through Mooncake (both real servers)."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from featurestream.tools.mooncake import MooncakeMaster, missing_reason

WORKER = str(Path(__file__).with_name("_mooncake_worker.py"))
DEADLINE = 120.0


@pytest.fixture
def master(tmp_path: Path) -> Any:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with MooncakeMaster(client_ttl=2, log=tmp_path / "master.log") as running:
        yield running


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Run:
    def __init__(self, redis_url: str, master: MooncakeMaster, tmp_path: Path) -> None:
        self.args = [redis_url, f"q-{uuid.uuid4().hex}", master.master_server_address, master.metadata_server]
        self.namespace = f"run-{uuid.uuid4().hex[:8]}"
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, role: str) -> Path:
        return self.tmp_path / f"{role}.log"

    def spawn(self, role: str, *rest: object) -> subprocess.Popen[bytes]:
        command = [sys.executable, WORKER, role, *self.args, self.namespace, str(self.log(role)), *map(str, rest)]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs[role] = proc
        return proc

    def wait_for(self, what: str, condition: Any) -> None:
        give_up = time.monotonic() + DEADLINE
        while not condition():
            if time.monotonic() > give_up:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def finish(self) -> dict[str, int]:
        codes = {}
        try:
            for role, proc in self.procs.items():
                codes[role] = proc.wait(timeout=DEADLINE)
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
        return codes

    def events(self, role: str, kind: str) -> collections.Counter[str]:
        return collections.Counter(line.split()[1] for line in _lines(self.log(role)) if line.split()[0] == kind)

    def stderr(self, role: str) -> str:
        """The worker's stderr without Mooncake's glog lines (``I1201 ...``): its traceback, if any."""
        stream = self.procs[role].stderr
        text = stream.read().decode(errors="replace") if stream else ""
        return "\n".join(line for line in text.splitlines() if not re.match(r"[IWEF]\d{4} ", line))[-3000:]


SAMPLES = 40


def test_every_sample_reaches_the_trainer_bit_exact_and_acked_once_with_nothing_left(
    redis_server: Any, master: MooncakeMaster, tmp_path: Path
) -> None:
    run = Run(redis_server.url, master, tmp_path)
    run.spawn("train")
    run.spawn("produce", SAMPLES)
    codes = run.finish()
    assert codes == {"train": 0, "produce": 0}, {role: run.stderr(role) for role in codes}
    everything = {f"s{i}" for i in range(SAMPLES)}
    consumed, acks = run.events("train", "consumed"), run.events("train", "Ack")
    assert set(consumed) == everything and max(consumed.values()) == 1
    assert set(acks) == everything and max(acks.values()) == 1
    assert not run.events("train", "DeadLetter")
    # The producer's close returned only once every sample it hosted was scrubbed; then nothing was resident.
    assert run.events("produce", "resident") == {"0": 1} and run.events("train", "resident") == {"0": 1}


def test_a_producer_killed_with_samples_queued_ends_in_lost_dead_letters_not_redeliveries(
    redis_server: Any, master: MooncakeMaster, tmp_path: Path
) -> None:
    run = Run(redis_server.url, master, tmp_path)
    run.spawn("produce", 6, "exit")
    run.wait_for("the producer to queue its samples", lambda: "queued" in _lines(run.log("produce")))
    run.procs["produce"].send_signal(signal.SIGKILL)
    run.spawn("train")
    codes = run.finish()
    assert codes == {"produce": -signal.SIGKILL, "train": 0}, run.stderr("train")[-3000:]
    dead, lost = run.events("train", "DeadLetter"), run.events("train", "lost")
    everything = {f"s{i}" for i in range(6)}
    assert set(dead) == everything and max(dead.values()) == 1, "each lost sample is dead-lettered once"
    assert set(lost) == everything and max(lost.values()) == 1, "each loss is reported to the trainer once"
    assert not run.events("train", "consumed") and not run.events("train", "Ack")


def test_a_restarted_master_forgets_the_queued_samples_and_each_is_dead_lettered_lost_once(
    redis_server: Any, master: MooncakeMaster, tmp_path: Path
) -> None:
    run = Run(redis_server.url, master, tmp_path)
    producer = run.spawn("produce", 6, "hold")
    run.wait_for("the producer to queue its samples", lambda: "queued" in _lines(run.log("produce")))
    master.restart(kill=True)  # no HA, no snapshots: every object is forgotten
    run.spawn("train")
    run.wait_for("the trainer to finish", lambda: run.procs["train"].poll() is not None)
    assert producer.stdin is not None
    producer.stdin.write(b"close\n")
    producer.stdin.flush()
    codes = run.finish()
    assert codes == {"produce": 0, "train": 0}, {role: run.stderr(role) for role in codes}
    everything = {f"s{i}" for i in range(6)}
    dead, lost = run.events("train", "DeadLetter"), run.events("train", "lost")
    assert set(dead) == everything and max(dead.values()) == 1
    assert set(lost) == everything and max(lost.values()) == 1
    assert not run.events("train", "Ack")
    # The producer's close saw that Mooncake holds none of them any more: nothing to wait for, nothing resident.
    assert run.events("produce", "resident") == {"0": 1}


def test_the_demo_runs_producer_and_trainer_in_separate_processes_over_mooncake(
    redis_server: Any, master: MooncakeMaster, capsys: pytest.CaptureFixture[str]
) -> None:
    from featurestream.cli import main

    args = ["demo", "--redis", redis_server.url, "--store", "mooncake", "--samples", "24", "--no-progress"]
    assert main([*args, "--crash-every", "7"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"trainer: a separate process, pid \d+; tensors via mooncake://127\.0\.0\.1:\d+/demo", out), out
    assert "[ok] every sample put was acked exactly once" in out
    assert "[ok] nothing pending, leased or resident at the end" in out
    assert main(["demo", "--store", "mooncake", "--samples", "2"]) == 2
    assert "pass --redis" in capsys.readouterr().err
