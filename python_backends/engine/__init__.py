"""Generic engine core for autoregressive stages: continuous batching over per-request KV caches.

Public API:
    SamplingParams, sample_next_token, make_generator   (sampling)
    Prompt, StepOutput, EngineRequest                   (request)
    KVBatch, cache_layers                               (kv_batch)
    PrefixCache                                         (prefix_cache)
    Runner, DecoderRunner, RowOutput, text_mrope_position_ids   (runner)
    EngineLoop, EngineStats, EngineUnavailable          (loop)
    IncrementalDetokenizer, StopStringMatcher           (detokenizer)
    TextStream, TextDelta, Usage                        (text_stream)
"""
from omni_backends.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from omni_backends.engine.kv_batch import KVBatch, cache_layers
from omni_backends.engine.loop import EngineLoop, EngineStats, EngineUnavailable
from omni_backends.engine.prefix_cache import PrefixCache
from omni_backends.engine.request import EngineRequest, Prompt, StepOutput
from omni_backends.engine.runner import DecoderRunner, RowOutput, Runner, text_mrope_position_ids
from omni_backends.engine.sampling import SamplingParams, make_generator, sample_next_token
from omni_backends.engine.text_stream import TextDelta, TextStream, Usage

__all__ = [
    "DecoderRunner",
    "EngineLoop",
    "EngineRequest",
    "EngineStats",
    "EngineUnavailable",
    "IncrementalDetokenizer",
    "KVBatch",
    "PrefixCache",
    "Prompt",
    "RowOutput",
    "Runner",
    "SamplingParams",
    "StepOutput",
    "StopStringMatcher",
    "TextDelta",
    "TextStream",
    "Usage",
    "cache_layers",
    "make_generator",
    "sample_next_token",
    "text_mrope_position_ids",
]
