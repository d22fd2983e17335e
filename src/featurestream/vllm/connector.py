"""``FeatureStreamConnector``: a vLLM KV connector for the ``extract_hidden_states`` method.

vLLM's ``extract_hidden_states`` speculative method writes the states of the
layers in ``eagle_aux_hidden_state_layer_ids`` into a cache-only attention
layer's KV cache. This connector takes them out when a request finishes,
as a CPU tensor, and hands them with the request's token ids and its
``kv_transfer_params["featurestream"]`` to the sink named by the connector's
``featurestream_sink`` extra config (``featurestream.vllm.sinks``): no file in
between. Only tensor-parallel rank 0 delivers. The copy to the host is a
plain ``.to("cpu")``, so the connector runs on a CPU host as on a GPU one.

Scheduler side: every finished request that was scheduled keeps its blocks
(``request_finished`` returns ``True``) until the worker has delivered it; the
worker reports it in ``get_finished`` on the step after.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

from featurestream.vllm.sinks import PARAMS_KEY, SINK_KEY, CapturedRequest, StateSink, resolve_sink

if TYPE_CHECKING:
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["FeatureStreamConnector"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Finished:
    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    params: dict[str, Any]


@dataclasses.dataclass
class FeatureStreamMetadata(KVConnectorMetadata):
    """The requests whose states the worker takes out this step."""

    finished: list[_Finished] = dataclasses.field(default_factory=list)


class FeatureStreamConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only KV connector: each finished request's extracted hidden states go to a featurestream sink."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        speculative = vllm_config.speculative_config
        if speculative is None or not speculative.uses_extract_hidden_states():
            raise ValueError(
                "FeatureStreamConnector needs speculative_config={'method': 'extract_hidden_states', ...}; "
                f"got {None if speculative is None else speculative.method!r}"
            )
        spec = self._kv_transfer_config.get_from_extra_config(SINK_KEY, None)
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"FeatureStreamConnector needs kv_connector_extra_config[{SINK_KEY!r}], got {spec!r}")
        self._sink_spec = spec
        self._sink: StateSink | None = None
        self._group = ExampleHiddenStatesConnector._find_cache_kv_group_id(kv_cache_config)
        self._block_size = ExampleHiddenStatesConnector._get_cache_block_size(vllm_config, kv_cache_config, self._group)
        # Scheduler side: requests scheduled and not yet finished, and those finished since the last step.
        self._scheduled: set[str] = set()
        self._finished: list[_Finished] = []
        # Worker side.
        self._kv_cache: torch.Tensor | None = None
        self._rank_zero = True
        self._delivered: set[str] = set()
        self._reported: set[str] = set()

    # -- worker side ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        self._rank_zero = get_tensor_model_parallel_rank() == 0
        layers = list(get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches)))
        if len(layers) != 1:
            raise ValueError(f"expected one CacheOnlyAttentionLayer (extract_hidden_states), got {layers}")
        self._kv_cache = kv_caches[layers[0]]
        if self._kv_cache.shape[2] != self._block_size:
            raise ValueError(
                f"hidden-states block size {self._block_size} differs from the cache's {self._kv_cache.shape[2]}"
            )

    def start_load_kv(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the connector only stores."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to load: the connector only stores."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        """The cache-only layer already holds the states; they are taken out when the request finishes."""

    def wait_for_save(self) -> None:
        """Deliveries complete inside ``get_finished``; nothing is in flight between steps."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Deliver this step's finished requests, then report every delivered request the scheduler has
        announced finished (in this call or an earlier one)."""
        if self.has_connector_metadata():
            metadata = self._get_connector_metadata()
            if isinstance(metadata, FeatureStreamMetadata):
                for finished in metadata.finished:
                    self._deliver(finished)
        self._reported.update(finished_req_ids)
        done = self._delivered & self._reported
        self._delivered -= done
        self._reported -= done
        return done or None, None

    def _deliver(self, finished: _Finished) -> None:
        if not self._rank_zero:  # get_finished_count: rank 0 alone reports
            return
        self._delivered.add(finished.request_id)
        assert self._kv_cache is not None
        blocks = torch.tensor(finished.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten().to(self._kv_cache.device)
        states = extract_from_kv_cache(self._kv_cache, slots, len(finished.token_ids)).to("cpu")
        captured = CapturedRequest(
            finished.request_id, torch.tensor(finished.token_ids, dtype=torch.long), states, finished.params
        )
        try:
            if self._sink is None:
                self._sink = resolve_sink(self._sink_spec)
            self._sink.deliver(captured)
        except Exception:
            logger.exception("featurestream sink %r failed on request %s", self._sink_spec, finished.request_id)

    # -- scheduler side ----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Nothing is loaded, so nothing is allocated for it."""

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._scheduled.update(new.req_id for new in scheduler_output.scheduled_new_reqs)
        metadata = FeatureStreamMetadata(self._finished)
        self._finished = []
        return metadata

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if request.request_id not in self._scheduled:  # aborted before it ran: no states to take
            return False, None
        self._scheduled.discard(request.request_id)
        params = dict((request.kv_transfer_params or {}).get(PARAMS_KEY) or {})
        token_ids = list(request.prompt_token_ids or ())
        self._finished.append(_Finished(request.request_id, token_ids, list(block_ids), params))
        return True, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        if not 0 <= self._group < len(block_ids):
            self._scheduled.discard(request.request_id)
            return False, None
        return self.request_finished(request, block_ids[self._group])

    def get_finished_count(self) -> int:
        """Only tensor-parallel rank 0 delivers, so one notice per request."""
        return 1

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """Tokens first, so each token's states are contiguous (as the extraction indexes them)."""
        return "LBNHC"
