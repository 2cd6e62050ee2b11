"""The host-facing description of our algorithms: a ``CustomSpecAlgo`` subclass.

SGLang dispatches on duck-typed ``is_*()`` / ``supports_*()`` predicates and a
few more methods of its ``SpeculativeAlgorithm`` enum. The host's default
``CustomSpecAlgo`` (0.5.23) lacks ``carries_draft_hidden_states``,
``create_future_map``, ``need_topk`` and ``get_platform_worker_cls``, which the
scheduler calls; this class supplies the whole interface.

Our model-free drafters take the host's NGRAM route: ``is_ngram()`` is true so
the scheduler relays the NGRAM payload between overlapped iterations, the CUDA
graph runner builds NGRAM verify inputs, and no draft KV is reserved.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

if TYPE_CHECKING:
    import torch


@lru_cache(maxsize=1)
def grammar_overlap() -> bool:
    """``SGLANG_SPEC_EXT_GRAMMAR_OVERLAP`` (read once per process: the scheduler asks every
    step)."""
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    return bool(plugin_config().grammar_overlap)


class _PluginSpecAlgo(CustomSpecAlgo):
    """What every algorithm of ours answers alike: the host's future map, no platform
    worker, and grammar batches under overlap scheduling: our workers take the scheduler's
    grammar barrier and advance the grammar FSM inside their step (SUFFIX before it drafts,
    the FSM advance is the drafts' input too; HYBRID in the host's EAGLE verify, under the
    target's forward). Without it the host syncs every grammar batch, as for its NGRAM."""

    def supports_grammar_overlap(self) -> bool:
        return grammar_overlap()

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(
            device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    def get_platform_worker_cls(self) -> type | None:
        # Our workers are the same on every platform the host's paths support.
        return None


class ModelFreeSpecAlgo(_PluginSpecAlgo):
    """Spec class for drafters without a draft model (SUFFIX)."""

    def is_ngram(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return False

    def supports_mixed_chunk(self) -> bool:
        # Same reason as the host's NGRAM: the overlap relay skips output_tokens_buf.
        return False

    def need_topk(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def supports_ragged_verify(self) -> bool:
        """Whether the target's verify graphs are keyed by total verify tokens (the host's
        compact ragged mode) in this server (``sglang/verify/ragged_graphs.py``)."""
        from sglang_spec_ext.sglang.verify.ragged_graphs import ragged_graphs_wanted

        return ragged_graphs_wanted()

    def build_disagg_draft_input(
        self, batch: Any, last_tokens_tensor: torch.Tensor, future_map: Any
    ) -> Any:
        """The draft input of a batch whose KV came from a prefill server (PD decode)."""
        from sglang_spec_ext.sglang.serving.disagg_decode import build_suffix_disagg_draft_input

        return build_suffix_disagg_draft_input(batch, last_tokens_tensor, future_map)

    def handle_server_args(self, server_args: Any) -> None:
        from sglang_spec_ext.sglang.serving.server_args import handle_server_args

        handle_server_args(self.name, server_args)


class HybridSpecAlgo(_PluginSpecAlgo):
    """Spec class for HYBRID: the host's model-draft route, answering as STANDALONE or
    EAGLE/EAGLE3 according to the draft kind (``server_args.hybrid_kind``), so the
    scheduler, memory sizing and model runners treat the draft model as the host does."""

    def _kind(self) -> str:
        from sglang_spec_ext.sglang.serving.server_args import hybrid_kind

        return hybrid_kind()

    def is_standalone(self) -> bool:
        return self._kind() == "standalone"

    def is_eagle(self) -> bool:
        return self._kind() in ("eagle", "eagle3")

    def is_eagle3(self) -> bool:
        return self._kind() == "eagle3"

    def supports_mixed_chunk(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return True

    def carries_draft_hidden_states(self) -> bool:
        return self.is_eagle()

    def handle_server_args(self, server_args: Any) -> None:
        from sglang_spec_ext.sglang.serving.server_args import handle_hybrid_server_args

        handle_hybrid_server_args(self.name, server_args)

    def resolve_max_speculative_num_draft_tokens(self, server_args: Any) -> int | None:
        """The model's verify width, or the suffix width where wide steps can verify a
        suffix draft at its own length (``hybrid/wide.py``): the scheduler reserves each
        request's KV, and the host sizes its logits and eager buffers, for the largest."""
        from sglang.srt.arg_groups.overrides import resolving_view

        from sglang_spec_ext.sglang.serving.server_args import plugin_config

        width = resolving_view(server_args).speculative_num_draft_tokens
        if width is None:
            return None
        return max(int(width), int(plugin_config().hybrid_suffix_width))
