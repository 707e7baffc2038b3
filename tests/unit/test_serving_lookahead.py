"""ordered_map: work on later items starts while earlier ones run; results come back in item order."""
import asyncio

import pytest

from omni_backends.serving.lookahead import ordered_map

pytestmark = pytest.mark.unit


class _Stage:
    """Work whose calls finish when the test releases them; records what ran at once."""

    def __init__(self):
        self.gates: dict[str, asyncio.Event] = {}
        self.running: set[str] = set()
        self.peak = 0
        self.started: list[str] = []
        self.cancelled: list[str] = []

    async def work(self, item: str) -> str:
        self.started.append(item)
        self.running.add(item)
        self.peak = max(self.peak, len(self.running))
        try:
            await self.gates.setdefault(item, asyncio.Event()).wait()
            return item.upper()
        except asyncio.CancelledError:
            self.cancelled.append(item)
            raise
        finally:
            self.running.discard(item)

    def release(self, item: str) -> None:
        self.gates.setdefault(item, asyncio.Event()).set()


async def _items(values):
    for value in values:
        yield value


async def _settle():
    for _ in range(10):
        await asyncio.sleep(0)


def test_results_in_order_with_work_ahead():
    async def run():
        stage, results = _Stage(), []

        async def consume():
            async for item, result in ordered_map(_items("abcd"), stage.work, ahead=2):
                results.append((item, result))

        consumer = asyncio.ensure_future(consume())
        await _settle()
        assert stage.started == ["a", "b"]  # two at once, not three
        stage.release("b")  # b finishes first but waits for a
        await _settle()
        assert results == [] and stage.started == ["a", "b", "c"]
        stage.release("a")
        await _settle()
        assert results == [("a", "A"), ("b", "B")]
        for item in "cd":
            stage.release(item)
        await consumer
        assert results == [("a", "A"), ("b", "B"), ("c", "C"), ("d", "D")] and stage.peak == 2

    asyncio.run(run())


def test_first_alone_then_ahead():
    async def run():
        stage = _Stage()
        out = []

        async def consume():
            async for item, _ in ordered_map(_items("abc"), stage.work, ahead=2, first_alone=True):
                out.append(item)

        consumer = asyncio.ensure_future(consume())
        await _settle()
        assert stage.started == ["a"]  # the second item waits for the first one's work
        stage.release("a")
        await _settle()
        assert stage.started == ["a", "b", "c"]
        stage.release("b"), stage.release("c")
        await consumer
        assert out == ["a", "b", "c"]

    asyncio.run(run())


def test_error_is_raised_in_order_and_running_work_is_cancelled():
    async def first_released():
        stage = _Stage()
        stage.release("a")

        async def work(item):
            if item == "b":
                raise ValueError("bad b")
            return await stage.work(item)

        seen = []
        with pytest.raises(ValueError, match="bad b"):
            async for item, _ in ordered_map(_items("abc"), work, ahead=3):
                seen.append(item)
        assert seen == ["a"] and stage.cancelled == ["c"]

    asyncio.run(first_released())


def test_consumer_stopping_early_cancels_the_work_ahead():
    async def run():
        stage = _Stage()
        stage.release("a")
        stream = ordered_map(_items("abc"), stage.work, ahead=3)
        assert await stream.__anext__() == ("a", "A")
        await stream.aclose()
        assert sorted(stage.cancelled) == ["b", "c"] and not stage.running

    asyncio.run(run())


def test_slow_source_does_not_hold_back_results():
    async def run():
        more = asyncio.Event()

        async def source():
            yield "a"
            await more.wait()
            yield "b"

        async def work(item):
            return item * 2

        stream = ordered_map(source(), work, ahead=2)
        assert await asyncio.wait_for(stream.__anext__(), 5) == ("a", "aa")
        more.set()
        assert [entry async for entry in stream] == [("b", "bb")]

    asyncio.run(run())


def test_source_error_is_raised():
    async def source():
        yield "a"
        raise RuntimeError("source broke")

    async def work(item):
        await asyncio.sleep(0.01)
        return item

    async def run():
        return [entry async for entry in ordered_map(source(), work, ahead=1)]

    with pytest.raises(RuntimeError, match="source broke"):
        asyncio.run(run())
    with pytest.raises(ValueError, match="ahead"):
        asyncio.run(ordered_map(_items("a"), work, ahead=0).__anext__())
