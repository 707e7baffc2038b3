"""The generic diffusion machinery without a server: DenoiseLoop scheduling (buckets, slots, aborts,
errors), ragged tensors, and bit-exact segmented batching on the tiny Qwen-Image transformer."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from omni_backends.diffusion import DenoiseJob, DenoiseLoop, DenoiseParams, Denoiser
from omni_backends.diffusion.tensors import pack_ragged, unpack_ragged

pytestmark = pytest.mark.unit


@dataclass
class _Job(DenoiseJob):
    value: float = 0.0


class _CountingDenoiser(Denoiser):
    """Adds 1 per step; records the jobs of every forward; can be told to fail or to block."""

    def __init__(self):
        self.forwards: list[list[int]] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def step(self, jobs):
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("boom")
        self.forwards.append([id(j) for j in jobs])
        for job in jobs:
            job.value += 1
            job.step += 1

    def rows(self, job):
        return 1

    def latents(self, job):
        return np.array([job.value], np.float32)


def _collect():
    outputs: dict[str, list] = {}
    done = threading.Event()
    finished = set()

    def on_output(rid, output):
        outputs.setdefault(rid, []).append(output)
        if output.finished:
            finished.add(rid)
            done.set()
    return outputs, finished, on_output


def _wait(predicate, timeout=10.0):
    import time
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.005)
    return predicate()


def test_jobs_of_one_bucket_share_forwards_and_return_latents_when_asked():
    denoiser = _CountingDenoiser()
    denoiser.gate.clear()                                   # hold the loop so all three join one iteration
    loop = DenoiseLoop(denoiser, max_running=8)
    outputs, finished, on_output = _collect()
    loop.submit("a", _Job(bucket=(1,), total_steps=3), DenoiseParams(frozenset({1})), on_output)
    loop.submit("b", _Job(bucket=(1,), total_steps=2), DenoiseParams(), on_output)
    loop.submit("c", _Job(bucket=(2,), total_steps=1), DenoiseParams(), on_output)
    denoiser.gate.set()
    assert _wait(lambda: finished == {"a", "b", "c"})
    loop.shutdown(5)
    assert [o.step for o in outputs["a"]] == [1, 2, 3] and outputs["a"][-1].finish_reason == "stop"
    assert outputs["a"][0].latents is not None and outputs["a"][1].latents is None
    assert outputs["a"][-1].latents.tolist() == [3.0] and outputs["b"][-1].latents.tolist() == [2.0]
    assert max(o.batch_jobs for o in outputs["a"]) == 2     # a and b together; c (other bucket) alone
    assert all(o.batch_jobs == 1 for o in outputs["c"])
    assert loop.stats().max_batch_jobs == 2 and loop.stats().in_flight == 0


def test_abort_frees_the_slot_and_waiting_jobs_take_it():
    denoiser = _CountingDenoiser()
    loop = DenoiseLoop(denoiser, max_running=1)
    outputs, finished, on_output = _collect()
    loop.submit("long", _Job(bucket=0, total_steps=10 ** 6), DenoiseParams(), on_output)
    loop.submit("next", _Job(bucket=0, total_steps=2), DenoiseParams(), on_output)
    assert _wait(lambda: len(outputs.get("long", [])) >= 3)
    assert "next" not in outputs                            # one slot: it waits
    assert loop.abort("long")
    assert _wait(lambda: finished == {"long", "next"})
    assert outputs["long"][-1].finish_reason == "abort" and outputs["next"][-1].finish_reason == "stop"
    assert not loop.abort("long") and loop.stats().in_flight == 0
    loop.shutdown(5)


def test_a_failing_forward_finishes_its_jobs_with_an_error_and_the_loop_survives():
    denoiser = _CountingDenoiser()
    denoiser.fail = True
    loop = DenoiseLoop(denoiser)
    outputs, finished, on_output = _collect()
    loop.submit("x", _Job(bucket=0, total_steps=2), DenoiseParams(), on_output)
    assert _wait(lambda: "x" in finished)
    assert outputs["x"][-1].finish_reason == "error" and "boom" in outputs["x"][-1].error
    denoiser.fail = False
    loop.submit("y", _Job(bucket=0, total_steps=1), DenoiseParams(), on_output)
    assert _wait(lambda: "y" in finished) and outputs["y"][-1].finish_reason == "stop"
    loop.submit("z", _Job(bucket=0, total_steps=10 ** 6), DenoiseParams(), on_output)
    with pytest.raises(ValueError):                          # the id is in flight
        loop.submit("z", _Job(bucket=0, total_steps=1), DenoiseParams(), on_output)
    loop.shutdown(5)
    with pytest.raises(RuntimeError):
        loop.submit("w", _Job(bucket=0, total_steps=1), DenoiseParams(), on_output)


def test_ragged_pack_round_trips_images_and_latents():
    images = [np.random.default_rng(k).integers(0, 255, (h, w, 3), dtype=np.uint8) for k, (h, w) in
              enumerate([(5, 7), (9, 3)])]
    padded, sizes = pack_ragged(images)
    assert padded.shape == (2, 9, 7, 3) and sizes.tolist() == [[5, 7], [9, 3]]
    assert all(np.array_equal(a, b) for a, b in zip(unpack_ragged(padded, sizes), images))
    latents = [np.ones((16, 1, 4, 6), np.float32), np.zeros((16, 1, 8, 2), np.float32)]
    padded, sizes = pack_ragged(latents)
    assert padded.shape == (2, 16, 1, 8, 6) and sizes.tolist() == [[4, 6], [8, 2]]
    assert all(np.array_equal(a, b) for a, b in zip(unpack_ragged(padded, sizes), latents))
    with pytest.raises(ValueError):
        unpack_ragged(padded, np.array([[9, 6], [8, 2]], np.int32))


@pytest.fixture(scope="module")
def tiny_checkpoint():
    from omni_backends.paths import model_home
    from omni_backends.qwen_image.checkpoint import write_checkpoint
    from omni_backends.qwen_image.serving.protocol import TINY

    return write_checkpoint(model_home() / TINY)   # idempotent: the default checkpoint


def test_segmented_batch_rows_equal_unbatched_forwards_bit_for_bit(tiny_checkpoint):
    """A naive batch differs from one-request forwards in the last bits; the segmented forward does not."""
    from omni_backends.qwen_image.denoiser import QwenImageDenoiser
    from omni_backends.qwen_image.loading import component

    transformer = component(tiny_checkpoint, "transformer")
    g = torch.Generator().manual_seed(0)
    lat = [torch.randn(n, 16, 64, generator=g) for n in (1, 2, 1)]
    txt = [torch.randn(n, length, 32, generator=g) for n, length in ((1, 7), (2, 12), (1, 20))]
    ts = [torch.full((n,), t) for n, t in ((1, 1.0), (2, 0.75), (1, 0.3))]

    def forward(hidden, t, text):
        with torch.no_grad():
            return transformer(hidden_states=hidden, timestep=t, encoder_hidden_states=text,
                               img_shapes=[[(1, 4, 4)]], return_dict=False)[0]

    alone = [forward(h, t, e) for h, t, e in zip(lat, ts, txt)]
    width = max(e.shape[1] for e in txt)
    padded = torch.cat([torch.cat([e, e.new_zeros(e.shape[0], width - e.shape[1], 32)], 1) for e in txt])
    QwenImageDenoiser(transformer, component(tiny_checkpoint, "scheduler"), tiny_checkpoint)  # installs segments
    denoiser_segments = transformer.transformer_blocks[0].attn.processor.owner
    with denoiser_segments.layout([1, 2, 1], [7, 12, 20]):
        batched = forward(torch.cat(lat), torch.cat(ts), padded)
    assert torch.equal(batched, torch.cat(alone))
