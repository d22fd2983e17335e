"""Temporaries of a writer killed inside ``SharedDirFeatureStore.put`` are swept; a live writer's are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from featurestream import SharedDirFeatureStore
from featurestream.stores.directory import HOST

WRITER = """
import sys
from featurestream import SharedDirFeatureStore
from featurestream.testing import sample_tensors
store = SharedDirFeatureStore(sys.argv[1], max_samples=None, max_bytes=1 << 40)
tensors = sample_tensors(0, tokens=400_000)  # 16 MB: each put spends a while writing its temporary
print("ready", flush=True)
n = 0
while True:
    ref = store.put(f"s{n}", tensors)
    store.scrub(ref)
    n += 1
"""


def _temporaries(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(done.stdout)


def test_a_dead_writers_temporaries_go_at_construction_and_gc_and_live_ones_stay(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    dead, live = f".s1.{HOST}-{_dead_pid()}.abc.tmp", f".s2.{HOST}-{os.getpid()}.def.tmp"
    elsewhere = f".s3.otherhost-{_dead_pid()}.ghi.tmp"  # another host's process cannot be probed: kept
    for name in (dead, live, elsewhere):
        (tmp_path / name).write_bytes(b"partial")
    assert store.gc() == 1
    assert _temporaries(tmp_path) == sorted([live, elsewhere])
    (tmp_path / dead).write_bytes(b"partial")
    SharedDirFeatureStore(tmp_path)
    assert _temporaries(tmp_path) == sorted([live, elsewhere])


def test_a_writer_sigkilled_mid_put_leaves_no_temporary_behind_once_a_new_instance_opens(tmp_path: Path) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stdout.readline().strip() == b"ready"
    give_up = time.monotonic() + 60
    while not _temporaries(tmp_path):  # kill it inside a put
        assert writer.poll() is None, "the writer died before any put"
        assert time.monotonic() < give_up, "no put ever left a temporary to see"
        time.sleep(0.001)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    SharedDirFeatureStore(tmp_path).close()
    assert _temporaries(tmp_path) == []
