"""A Mooncake store's first contact, as a user's process meets it: a wrong master address is refused within
seconds by one error naming it, and Mooncake's own C++ logs stay off unless ``MC_LOG_LEVEL`` asks for them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

from featurestream.tools.mooncake import MooncakeMaster
from featurestream.tools.servers import free_port

# A line glog writes (``I1207 13:20:14.388399 14846 client_metric.cpp:102] ...``) or its pre-init notice.
GLOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]|WARNING: Logging before InitGoogleLogging)", re.M
)

USER = textwrap.dedent(
    """
    import sys, time
    from featurestream import MooncakeFeatureStore
    kwargs = dict(master_server_address=sys.argv[1], metadata_server=sys.argv[2], local_hostname="127.0.0.1",
                  global_segment_size=16 << 20, local_buffer_size=16 << 20, close_timeout=0)
    started = time.monotonic()
    try:
        store = MooncakeFeatureStore(**kwargs)
    except ConnectionError as exc:
        print(f"refused after {time.monotonic() - started:.1f} s: {exc}")
    else:
        store.close()
        print("connected")
    """
)


def _user(master: str, metadata: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("MC_LOG_LEVEL", "GLOG_minloglevel")}
    return subprocess.run(
        [sys.executable, "-c", USER, master, metadata],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_client_is_quiet_unless_mc_log_level_asks(mooncake_master: MooncakeMaster) -> None:
    address, metadata = mooncake_master.master_server_address, mooncake_master.metadata_server
    quiet = _user(address, metadata)
    assert quiet.stdout.strip() == "connected", quiet.stdout + quiet.stderr
    assert not GLOG_LINE.search(quiet.stderr), quiet.stderr
    loud = _user(address, metadata, MC_LOG_LEVEL="INFO")  # the documented way to see them
    assert loud.stdout.strip() == "connected", loud.stdout + loud.stderr
    assert len(GLOG_LINE.findall(loud.stderr)) >= 5, loud.stderr


def test_a_wrong_master_port_is_refused_within_seconds_naming_it(mooncake_master: MooncakeMaster) -> None:
    wrong = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = _user(wrong, mooncake_master.metadata_server)
    assert time.monotonic() - started < 30.0  # the interpreter's start and imports included
    found = re.fullmatch(r"refused after ([\d.]+) s: (.*)", done.stdout.strip())
    assert found is not None, done.stdout + done.stderr
    assert float(found.group(1)) < 5.0
    assert f"cannot reach the Mooncake master at {wrong}" in found.group(2)
    assert "featurestream serve mooncake" in found.group(2)
    assert not GLOG_LINE.search(done.stderr), done.stderr


def test_a_wrong_metadata_server_is_refused_naming_it(mooncake_master: MooncakeMaster) -> None:
    wrong = f"http://127.0.0.1:{free_port()}/metadata"
    done = _user(mooncake_master.master_server_address, wrong)
    assert f"cannot reach the Mooncake metadata server at {wrong}" in done.stdout, done.stdout + done.stderr
