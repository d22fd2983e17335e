"""The engine side of the vLLM tests, run by ``.venv-vllm/bin/python`` (vLLM's own environment).

``features``: one DFlash or EAGLE-3 engine captures the prompts of ``--prompts`` (a ``torch.save``d list of
``(input_ids, loss_mask)``) into ``--out``, records the errors its bad inputs raise and, for DFlash with ``--url``,
streams the prompts as samples into a shared-directory store and a Redis queue. ``produce``: the resume recipe's
producer (``ResumableProducer``) over a DFlash engine, to be SIGKILLed and restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine runs in this process: its sink is here
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default takes most of the host's memory

import torch

from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.resume import ResumableProducer
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.vllm import VLLMDFlashTarget, VLLMFeatureEngine

LAYERS = {"dflash": [3, 0, 5], "eagle3": [1, 2, 4]}
ENGINE = {"dtype": "bfloat16", "max_model_len": 128, "skip_tokenizer_init": True, "enforce_eager": True}


def engine(model: str, algorithm: str) -> VLLMFeatureEngine:
    return VLLMFeatureEngine(model, algorithm, LAYERS[algorithm], **ENGINE)


def refused(call: Any) -> str:
    """The ``type: message`` of what ``call()`` raises (the test checks it names the value)."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def features(args: argparse.Namespace) -> None:
    prompts = torch.load(args.prompts)
    started = time.monotonic()
    built = engine(args.model, args.algorithm)
    result: dict[str, Any] = {"start_seconds": built.start_seconds, "process_start_seconds": time.monotonic() - started}
    captured = built.capture([ids.tolist() for ids, _ in prompts])
    result["errors"] = {
        "out_of_range": refused(lambda: VLLMFeatureEngine(args.model, "dflash", [0, 6])),
        "algorithm": refused(lambda: VLLMFeatureEngine(args.model, "dspark", [0, 1])),
        "no_model": refused(lambda: VLLMFeatureEngine(args.prompts + ".missing", "dflash", [0])),
    }
    if args.unloadable:
        result["errors"]["unloadable"] = refused(lambda: VLLMFeatureEngine(args.unloadable, "dflash", [0], **ENGINE))
    if args.algorithm == "eagle3":
        result["errors"]["eagle3_target"] = refused(lambda: VLLMDFlashTarget(built))
        result["errors"]["eagle3_stream"] = refused(lambda: built.stream(prompts, None, None))  # type: ignore[arg-type]
    if args.url:
        store = SharedDirFeatureStore(args.store_dir)
        queue = RedisSampleRefQueue(store, url=args.url, name=args.name)
        producer = FeatureProducer(VLLMDFlashTarget(built), store, run_id="vllm")
        refs = built.stream(prompts, producer, queue)
        result["streamed"] = [ref.sample_id for ref in refs]
        queue.close()
        # A closed queue refuses the puts: nothing more is enqueued, and what was stored for them is discarded.
        result["after_close"] = len(built.stream(prompts[:2], producer, queue))
        result["resident_after_close"] = store.health().sample_count
    torch.save(captured, args.out)
    built.close()
    print(json.dumps(result), flush=True)


def produce(args: argparse.Namespace) -> None:
    prompts = torch.load(args.prompts)
    # A cap of 4 samples: the producer waits for the (slow) trainer, so a SIGKILL finds it mid-run.
    store = SharedDirFeatureStore(args.store_dir, max_samples=4, max_bytes=1 << 30)
    queue = RedisSampleRefQueue(store, url=args.url, name=args.name)
    producer = FeatureProducer(VLLMDFlashTarget(engine(args.model, "dflash")), store, run_id="vllm-resume")
    triples = [(ids[None], torch.ones_like(ids)[None], mask[None]) for ids, mask in prompts]
    report = ResumableProducer(producer, queue, triples, chunk=2, poll_interval=0.05).run()
    print(json.dumps(vars(report)), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("features", "produce"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--algorithm", default="dflash", choices=sorted(LAYERS))
    parser.add_argument("--out")
    parser.add_argument("--url")
    parser.add_argument("--name")
    parser.add_argument("--store-dir")
    parser.add_argument("--unloadable", help="features: a checkpoint whose config loads and vLLM refuses")
    args = parser.parse_args()
    {"features": features, "produce": produce}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
