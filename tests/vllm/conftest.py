"""The vLLM tests: the engine runs in ``.venv-vllm`` (``scripts/vllm-env.sh``), the comparisons and the trainer here.

vLLM's pins conflict with the test dependencies, so the engine side (``_engine.py``) runs as a process of its own
virtual environment; these tests skip (CI: fail) where it is not built. The checkpoint is a tiny random-init Llama
saved by ``save_pretrained`` (head_dim 64).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the vLLM tests compare with transformers")

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
ENGINE = Path(__file__).with_name("_engine.py")
VOCAB = 512
LAYERS = 6


def save_tiny_llama(directory: Path) -> Path:
    """A seeded random-init bf16 Llama (6 layers, hidden 256, head_dim 64, vocab 512) saved to ``directory``."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


def prompts(count: int, *, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(input_ids [T], loss_mask [T])`` of lengths 9 to 40; the first quarter of each is unsupervised."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for index in range(count):
        length = 9 + (index * 7) % 32
        ids = torch.randint(VOCAB, (length,), generator=generator)
        mask = torch.ones(length, dtype=torch.long)
        mask[: length // 4] = 0
        made.append((ids, mask))
    return made


def engine_python() -> Path:
    """``.venv-vllm``'s interpreter; skip (CI: fail) when it is not built."""
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is missing: run scripts/vllm-env.sh (vLLM's own environment)")
    return PYTHON


def run_engine(*arguments: str, timeout: float = 600.0) -> dict[str, Any]:
    """Run ``_engine.py`` with ``arguments`` in ``.venv-vllm`` and return the JSON line it prints last."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [str(engine_python()), str(ENGINE), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"the engine process exited with {done.returncode}:\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def redis_node(directory: Path) -> Any:
    """A real redis-server (AOF on) as a context manager; skip (CI: fail) where none is installed."""
    pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server)")
    from featurestream.tools.redis_servers import RedisNode

    return RedisNode(directory, appendonly=True)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_node(tmp_path_factory.mktemp("redis")) as node:
        yield node.url
