"""vLLM producer vs the Hugging Face wrapper: DFlash samples/s and tokens/s on one checkpoint, in one run.

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--prompts 64] [--length 128] [--layers 6] [--hidden 256]

Run in vLLM's environment (``scripts/vllm-env.sh``). A random-init bf16 Llama is saved to a temp directory; the
same prompts are produced into an in-process store and queue (each sample stored, its ref put, then leased and
acked so the queue never fills) by:

- ``hf``: ``FeatureProducer(HFDFlashTargetModel(model))``, one prompt per forward;
- ``vllm stream``: ``VLLMFeatureEngine.stream``, every prompt in flight, each sample stored from the engine step;
- ``vllm target``: ``FeatureProducer(VLLMDFlashTarget(engine))``, one prompt per engine call (the resume path).

Also prints the engine's start time (``vllm.LLM`` construction, after vLLM is imported).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch
import transformers

from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.hf import HFDFlashTargetModel
from featurestream.pipeline.producer import FeatureProducer
from featurestream.stores.local import LocalFeatureStore
from featurestream.vllm import VLLMDFlashTarget, VLLMFeatureEngine

VOCAB = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    if args.layers < 4:
        parser.error(f"--layers must be at least 4 (layers 1, layers/2 and the last are captured), got {args.layers}")
    if args.hidden < 128 or args.hidden % 64:
        parser.error(f"--hidden must be a multiple of 64, >= 128 (64-wide heads, 2 KV heads), got {args.hidden}")
    layer_ids = [1, args.layers // 2, args.layers - 1]
    with tempfile.TemporaryDirectory() as directory:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=2,
            head_dim=64, max_position_embeddings=2 * args.length, tie_word_embeddings=False,
        )  # fmt: skip
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
        model.save_pretrained(directory)
        generator = torch.Generator().manual_seed(1)
        prompts = [(torch.randint(VOCAB, (args.length,), generator=generator),) * 2 for _ in range(args.prompts)]
        prompts = [(ids, torch.ones_like(ids)) for ids, _ in prompts]
        tokens = args.prompts * args.length
        engine = VLLMFeatureEngine(
            directory, "dflash", layer_ids, dtype="bfloat16", max_model_len=2 * args.length, skip_tokenizer_init=True
        )
        print(f"checkpoint: Llama, {args.layers} layers, hidden {args.hidden}, bf16; {args.prompts} prompts x "
              f"{args.length} tokens; torch threads {torch.get_num_threads()}")  # fmt: skip
        print(f"engine start (vllm.LLM construction): {engine.start_seconds:.1f} s")
        runs: dict[str, Callable[[FeatureProducer, SampleRefQueue], None]] = {
            "hf": lambda producer, queue: _one_by_one(producer, queue, prompts),
            "vllm stream": lambda producer, queue: _drained(queue, engine.stream(prompts, producer, queue)),
            "vllm target": lambda producer, queue: _one_by_one(producer, queue, prompts),
        }
        targets = {
            "hf": HFDFlashTargetModel(model, layer_ids),
            "vllm stream": VLLMDFlashTarget(engine),
            "vllm target": VLLMDFlashTarget(engine),
        }
        results = {}
        for name, run in runs.items():
            store = LocalFeatureStore(max_samples=None)
            queue = SampleRefQueue(store)
            producer = FeatureProducer(targets[name], store, run_id=name.replace(" ", "-"))
            run(producer, queue)  # warm-up pass
            started = time.perf_counter()
            run(producer, queue)
            results[name] = time.perf_counter() - started
            assert queue.stats().acked == 2 * args.prompts, queue.stats()
        for name, seconds in results.items():
            print(
                f"{name:12s} {args.prompts / seconds:8.1f} samples/s {tokens / seconds:10.0f} tokens/s "
                f"{results['hf'] / seconds:6.2f}x hf"
            )
        engine.close()


def _one_by_one(producer: FeatureProducer, queue: SampleRefQueue, prompts: list[tuple[torch.Tensor, ...]]) -> None:
    refs = []
    for ids, mask in prompts:
        ref = producer.produce(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], loss_mask=mask[None])
        queue.put(ref)
        refs.append(ref)
    _drained(queue, refs)


def _drained(queue: SampleRefQueue, refs: list[object]) -> None:
    for _ in refs:
        lease = queue.acquire(timeout=5.0)
        assert lease is not None, "a stored sample was not queued"
        queue.ack(lease)


if __name__ == "__main__":
    main()
