"""Engine adapters: ``vllm`` (also vLLM-Ascend's MRv2 path), ``vllm_ascend`` (MRv1's policy
factory) and ``sglang``. Pure Python; torch is imported only when an engine hands tensors.

Each adapter checks what it patches before patching; when it cannot apply, the engine keeps its
own policy and a warning says why."""

from ._record import record_iteration_ms

__all__ = ["record_iteration_ms"]
