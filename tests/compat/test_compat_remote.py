"""The reference's remote EAGLE-3 target feeds featurestream's producer: draft-vocab supervision, streamed unchanged.

The reference's target server (``eagle.remote.server``: its request handler, serving a tiny random Llama through
the reference's ``HFEagle3TargetModel``) runs over HTTP on 127.0.0.1 with its NCCL data plane disabled
(``NEMO_EAGLE_ENABLE_NCCL=0``: the tensors travel in its wire format). Its client, ``RemoteEagle3TargetModel``, is
handed to ``FeatureProducer`` unchanged; the batches the loader yields equal what the client returns, field for
field, and featurestream's own projection (``DraftVocabTarget`` over its ``HFEagle3TargetModel``) equals the
server's, to the bit.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream.eagle3 import DraftVocab, DraftVocabTarget
from featurestream.hf import HFEagle3TargetModel
from featurestream.loader import FeatureDataLoader
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm
from featurestream.stores.base import FeatureStore
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.tools.models import TinyConfig, tiny_hf_causal_lm

from .conftest import PREFIX, Reference

CONFIG = TinyConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, max_seq_len=32)
DRAFT_VOCAB = 40  # of the target's 64: some top-1 tokens fall outside, so position_mask holds both values
TOKENS = 12


@dataclasses.dataclass(frozen=True)
class Remote:
    model: torch.nn.Module
    client: Any


@pytest.fixture
def remote(reference: Reference, monkeypatch: pytest.MonkeyPatch) -> Iterator[Remote]:
    """The reference's server on an ephemeral 127.0.0.1 port and its client, NCCL off on both sides."""
    monkeypatch.setenv("NEMO_EAGLE_ENABLE_NCCL", "0")  # read by the server's and the client's constructors
    server = importlib.import_module(f"{PREFIX}.eagle.remote.server")
    client_module = importlib.import_module(f"{PREFIX}.eagle.remote.client")
    model = tiny_hf_causal_lm("llama", CONFIG, num_layers=8)
    logic = server.TargetModelServer(reference.target.HFEagle3TargetModel(model), nccl_port=0, host="127.0.0.1")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server._make_request_handler(logic))
    httpd.daemon_threads = True
    serving = threading.Thread(target=httpd.serve_forever, name="remote-target", daemon=True)
    serving.start()
    client = client_module.RemoteEagle3TargetModel(
        [f"http://127.0.0.1:{httpd.server_address[1]}"], device=torch.device("cpu"), timeout=60, max_retries=0
    )
    try:
        yield Remote(model, client)
    finally:
        client.close()
        httpd.shutdown()
        httpd.server_close()
        logic.close()
        serving.join(timeout=10)


def draft_vocab() -> DraftVocab:
    ids = torch.randperm(CONFIG.vocab_size, generator=torch.Generator().manual_seed(3))[:DRAFT_VOCAB].sort().values
    mask = torch.zeros(CONFIG.vocab_size, dtype=torch.bool)
    mask[ids] = True
    return DraftVocab(ids, mask)


def prompts() -> list[dict[str, torch.Tensor]]:
    """Three rows of ``TOKENS`` tokens; the second right-padded, the first three tokens of each unsupervised."""
    out = []
    for seed in range(3):
        input_ids = torch.randint(0, CONFIG.vocab_size, (1, TOKENS), generator=torch.Generator().manual_seed(seed))
        attention_mask = torch.ones(1, TOKENS, dtype=torch.long)
        if seed == 1:
            attention_mask[:, -4:] = 0
        loss_mask = attention_mask.clone()
        loss_mask[:, :3] = 0
        out.append({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})
    return out


STORES: dict[str, Callable[[Path], FeatureStore]] = {
    "local": lambda _: LocalFeatureStore(),
    "shared_dir": lambda path: SharedDirFeatureStore(path, max_samples=None, max_bytes=1 << 30),
}


def stream(target: Any, store: FeatureStore, vocab: DraftVocab | None = None) -> list[Any]:
    """``prompts()`` through ``FeatureProducer(target)`` -> store -> queue -> loader: the batches, in order."""
    queue = SampleRefQueue(store)
    producer = FeatureProducer(target, store, run_id="remote")
    assert producer.algorithm is FeatureAlgorithm.EAGLE3, "inferred from the backend's class"
    if vocab is not None:
        producer.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
    for given in prompts():
        ref = producer.produce(**given)
        assert "logits" not in ref.feature_keys and {"target_probs", "position_mask"} <= set(ref.feature_keys)
        queue.put(ref)
    queue.close()
    with FeatureDataLoader(queue, store) as loader:
        return list(loader)


def assert_same_batch(got: Any, expected: Any) -> None:
    for field in dataclasses.fields(expected):
        want, have = getattr(expected, field.name), getattr(got, field.name)
        if want is None:
            assert have is None, field.name
        else:
            assert have.dtype == want.dtype and torch.equal(have, want), field.name


@pytest.mark.parametrize("store_kind", sorted(STORES))
def test_the_remote_clients_batches_come_out_of_the_loader_unchanged(
    remote: Remote, reference: Reference, store_kind: str, tmp_path: Path
) -> None:
    vocab = draft_vocab()
    remote.client.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
    expected = [remote.client.generate_batch(**given) for given in prompts()]
    assert all(batch.logits is None and batch.target_probs.shape[-1] == DRAFT_VOCAB for batch in expected)
    masks = torch.cat([batch.position_mask.flatten() for batch in expected])
    assert masks.any() and not masks.all(), "the draft vocabulary keeps some supervised positions and drops others"

    batches = stream(remote.client, STORES[store_kind](tmp_path))

    assert len(batches) == len(expected)
    for got, want in zip(batches, expected, strict=True):
        assert isinstance(got, reference.target.Eagle3TargetBatch)
        assert_same_batch(got, want)


def test_featurestreams_own_projection_equals_the_remote_servers_to_the_bit(remote: Remote) -> None:
    vocab = draft_vocab()
    remote.client.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
    expected = [remote.client.generate_batch(**given) for given in prompts()]

    # The same model, wrapped by featurestream and projected on the producer's side before anything is stored.
    batches = stream(DraftVocabTarget(HFEagle3TargetModel(remote.model)), LocalFeatureStore(), vocab)

    for got, want in zip(batches, expected, strict=True):
        assert_same_batch(got, want)
