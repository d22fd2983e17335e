"""``TargetHead``: the target's LM head on the trainer's side, from a model or from a checkpoint's head alone."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the target-head tests need transformers: pip install 'featurestream[hf]'")

import featurestream
from featurestream.pipeline import target_head
from featurestream.pipeline.target_head import TargetHead
from support.tiny import prompts, tiny_model


def last_hidden_and_logits(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids, attention_mask, _ = prompts()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits


@pytest.mark.parametrize(("tied", "dtype"), [(False, torch.float32), (True, torch.bfloat16)])
def test_from_model_rebuilds_the_models_logits_bit_for_bit(tied: bool, dtype: torch.dtype) -> None:
    model = tiny_model("llama", layers=2, tied=tied, dtype=dtype)
    head = TargetHead.from_model(model)
    hidden, logits = last_hidden_and_logits(model)
    assert head.weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()  # shared, not copied
    assert tied == (head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr())
    assert torch.equal(head.logits(hidden), logits)
    assert featurestream.TargetHead is TargetHead


def test_fingerprint_names_shape_dtype_and_weight() -> None:
    model = tiny_model("llama", layers=2)
    head = TargetHead.from_model(model)
    assert head.fingerprint.startswith("128x32:float32:")
    assert TargetHead(head.weight.clone()).fingerprint == head.fingerprint
    other_seed = TargetHead.from_model(tiny_model("llama", layers=2, seed=1))
    other_dtype = TargetHead(head.weight.to(torch.bfloat16))
    other_vocab = TargetHead(head.weight[:100])
    one_bit = head.weight.clone()
    one_bit.view(torch.int32)[3, 4] ^= 1
    fingerprints = {h.fingerprint for h in (head, other_seed, other_dtype, other_vocab, TargetHead(one_bit))}
    assert len(fingerprints) == 5


class ReadCounter:
    """Counts the bytes read from each file the target-head module opens."""

    def __init__(self) -> None:
        self.read: dict[str, int] = {}

    def open(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = builtins.open(path, mode, *args, **kwargs)
        name = os.path.basename(os.fspath(path))
        self.read.setdefault(name, 0)
        counter = self

        class Counted:
            def __getattr__(self, attr: str) -> Any:
                return getattr(file, attr)

            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                file.close()

            def read(self, size: int = -1) -> Any:
                data = file.read(size)
                counter.read[name] += len(data)
                return data

            def readinto(self, buffer: Any) -> int:
                count = file.readinto(buffer)
                counter.read[name] += count
                return count

        return Counted()


@pytest.mark.parametrize(("tied", "sharded"), [(False, False), (False, True), (True, True)])
def test_from_pretrained_reads_the_head_alone_and_equals_from_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool, sharded: bool
) -> None:
    model = tiny_model("llama", layers=2, tied=tied, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "1GB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert (len(shards) > 2) == sharded
    counter = ReadCounter()
    monkeypatch.setattr(target_head, "open", counter.open, raising=False)
    loaded = TargetHead.from_pretrained(tmp_path)
    expected = TargetHead.from_model(model)
    assert torch.equal(loaded.weight, expected.weight) and loaded.fingerprint == expected.fingerprint
    head_bytes = expected.weight.numel() * expected.weight.element_size()
    read_from_shards = {name: count for name, count in counter.read.items() if name.endswith(".safetensors")}
    if sharded:  # one shard opened, the one the index names for the head (the embedding when tied)
        weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
        key = "model.embed_tokens.weight" if tied else "lm_head.weight"
        assert list(read_from_shards) == [weight_map[key]]
    else:  # the single file is opened twice: its header for the names, then the header and the head
        assert list(read_from_shards) == ["model.safetensors"]
    total = sum(os.path.getsize(tmp_path / name) for name in shards)
    header_bytes = sum(read_from_shards.values()) - head_bytes
    assert head_bytes < total / 2 and 0 < header_bytes < 8192, (read_from_shards, head_bytes, total)


def test_from_pretrained_errors_name_the_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors\.index\.json nor model\.safetensors"):
        TargetHead.from_pretrained(tmp_path)
    model = tiny_model("llama", layers=2, tied=True)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no LM head"):
        TargetHead.from_pretrained(tmp_path)
    config["final_logit_softcapping"] = 30.0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"final_logit_softcapping=30\.0"):
        TargetHead.from_pretrained(tmp_path)


def test_refuses_what_it_cannot_rebuild() -> None:
    model = tiny_model("llama", layers=2)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match=r"final_logit_softcapping=30\.0.*supervision='logits'"):
        TargetHead.from_model(model)
    with pytest.raises(ValueError, match=r"floating \[vocab, hidden\] matrix, got shape \(4,\)"):
        TargetHead(torch.ones(4))
    head = TargetHead(torch.ones(8, 4))
    with pytest.raises(ValueError, match=r"takes \[\.\.\., 4\] torch.float32 hidden states, got \[2, 5\]"):
        head.logits(torch.ones(2, 5))
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(128))
    with pytest.raises(ValueError, match="has a bias"):
        TargetHead.from_model(model)
