"""A realtime session's conversation: items as OpenAI defines them (`realtime.item` messages), their
transcripts, truncation, and the chat messages a response sends to the pipeline."""
from __future__ import annotations

import asyncio
import collections
import dataclasses

import numpy as np

from omni_frontend.audio import pcm16
from omni_frontend.realtime.audio import STAGE_RATE
from omni_frontend.realtime.protocol import ProtocolError, new_id

# truncation "auto": the oldest items are left out of a response's prompt beyond this many characters
HISTORY_CHARS = 12000
# user audio a session keeps for conversation.item.retrieve (newest first, PCM16 16 kHz: ~1.9 MB)
RETAINED_AUDIO_S = 60
# What a session holds in all (`Conversation.trim`): beyond any of these the oldest items are deleted, as the
# conversation.item.deleted events a client gets say. Items (each ~1 KB besides its text and audio), client text
# (characters as the items came, 8 x the default --max-text-chars: ~1 MB of ASCII) and user audio still waiting
# for its transcription (float32 16 kHz: 600 s = 38 MB, as much as the uncommitted input buffer may hold).
MAX_ITEMS = 4096
MAX_CHARS = 1 << 20
MAX_PENDING_AUDIO_S = 600
_ROLES = {"user": ("input_text", "input_audio"), "system": ("input_text",), "assistant": ("output_text", "output_audio")}


@dataclasses.dataclass(eq=False)   # parts are compared by identity (the kept-audio queue), never by their arrays
class Part:
    """One content part. kind: input_text | input_audio | output_text | output_audio; text: the text or
    transcript; audio: user audio as float32 16 kHz until it is transcribed; kept: then the same audio as PCM16
    (int16 [samples], 16 kHz) while the session keeps it for conversation.item.retrieve (`Conversation.keep_audio`);
    spoken: assistant audio as (transcript chunk, play time in ms) pairs, in order."""

    kind: str
    text: str = ""
    audio: np.ndarray | None = None
    kept: np.ndarray | None = None
    spoken: list[tuple[str, float]] = dataclasses.field(default_factory=list)

    @property
    def user_audio(self) -> np.ndarray | None:
        """The user's audio as int16 [samples] at 16 kHz (kept, or still to be transcribed); None if none is held."""
        return self.kept if self.audio is None else np.frombuffer(pcm16(self.audio), "<i2")

    def wire(self) -> dict:
        key = "text" if self.kind.endswith("_text") else "transcript"
        return {"type": self.kind, key: self.text or ("" if key == "text" else None)}


@dataclasses.dataclass(eq=False)   # an item is itself (its id is unique), so list.index finds it by identity
class Item:
    """A message item. `transcribed` is set once every audio part has its transcript (user audio is
    transcribed asynchronously; responses wait for it)."""

    id: str
    role: str
    parts: list[Part]
    status: str = "completed"
    transcribed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self):
        if not any(p.kind == "input_audio" for p in self.parts):
            self.transcribed.set()

    def wire(self) -> dict:
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role, "status": self.status,
                "content": [p.wire() for p in self.parts]}

    @property
    def text(self) -> str:
        return " ".join(p.text.strip() for p in self.parts if p.text and p.text.strip())


def item_from_client(spec: dict) -> tuple[Item, list[tuple[Part, str, str]]]:
    """An Item from a `conversation.item.create` item (message items only), and its input_audio parts still to be
    decoded as (part, base64 audio, param), param the part's field (`item.content[2].audio`) for its errors: the
    caller bounds and decodes them (`part.audio`). Raises ProtocolError for other item types, roles or content part
    types."""
    if spec.get("type") != "message":
        raise ProtocolError(f"item type {spec.get('type')!r} is not supported (only 'message')", param="item.type",
                            code="unsupported_item")
    role = spec.get("role")
    parts, audio = [], []
    for index, part in enumerate(spec.get("content") or []):
        kind = part.get("type")
        if kind not in _ROLES.get(role, ()):
            raise ProtocolError(f"content type {kind!r} is not supported in a {role} message",
                                param=f"item.content[{index}].type", code="unsupported_content")
        if kind == "input_audio":
            if not part.get("audio"):
                raise ProtocolError("input_audio parts need base64 'audio'", param=f"item.content[{index}].audio")
            parts.append(Part(kind, text=part.get("transcript") or ""))
            audio.append((parts[-1], part["audio"], f"item.content[{index}].audio"))
        else:
            parts.append(Part(kind, text=part.get("text") or part.get("transcript") or ""))
    if not parts:
        raise ProtocolError("a message item needs at least one content part", param="item.content")
    return Item(spec.get("id") or new_id("item"), role, parts), audio


class Conversation:
    """Ordered items of one session, bounded in all by `trim` (max_items items, max_chars characters of text as the
    items came, max_pending_s seconds of user audio not yet transcribed)."""

    def __init__(self, max_items: int = MAX_ITEMS, max_chars: int = MAX_CHARS,
                 max_pending_s: float = MAX_PENDING_AUDIO_S):
        self.items: list[Item] = []
        self._by_id: dict[str, Item] = {}   # every item by its id: add, get and delete look ids up in O(1)
        self._kept: collections.deque[Part] = collections.deque()   # parts holding kept audio, oldest first
        self.max_items, self.max_chars, self.max_pending = max_items, max_chars, int(max_pending_s * STAGE_RATE)
        self.chars = 0     # characters of the items' text when they were added
        self.pending = 0   # samples of user audio waiting for its transcription (float32 16 kHz)
        self._chars: dict[str, int] = {}   # each item's share of `chars`

    def keep_audio(self, part: Part) -> None:
        """After `part`'s transcription: its float32 audio is dropped and kept as PCM16 for
        conversation.item.retrieve, the session's newest RETAINED_AUDIO_S seconds of user audio in all; older
        parts lose theirs (they are retrieved without `audio`). The transcript is what later turns use."""
        if part.audio is None:
            return
        self.pending -= part.audio.size
        part.kept, part.audio = part.user_audio, None
        self._kept.append(part)
        held = sum(p.kept.size for p in self._kept)
        while held > RETAINED_AUDIO_S * STAGE_RATE:
            oldest = self._kept.popleft()
            held -= oldest.kept.size
            oldest.kept = None

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (None: at the end; "root": first); returns the id of the item
        before it. Raises ProtocolError if `previous_item_id` is unknown or the id is taken."""
        if item.id in self._by_id:   # a scan of every item here made 10 000 items take 25 s, stalling every client
            raise ProtocolError(f"item id {item.id!r} already exists", param="item.id", code="item_exists")
        if previous_item_id is None:
            index = len(self.items)
        else:
            index = 0 if previous_item_id == "root" else self.index(previous_item_id, "previous_item_id") + 1
        self.items.insert(index, item)
        self._by_id[item.id] = item
        self._chars[item.id] = sum(len(part.text) for part in item.parts)
        self.chars += self._chars[item.id]
        self.pending += sum(part.audio.size for part in item.parts if part.audio is not None)
        return self.items[index - 1].id if index else None

    def trim(self, keep: Item) -> list[str]:
        """Deletes the oldest items while the conversation holds more than its bounds, each bound by the oldest items
        that count towards it: any item past max_items, items with text past max_chars, items with audio awaiting
        transcription past max_pending (a text conversation never loses its text for audio). Never `keep` (the item
        just added) nor an assistant item still in progress. Returns the deleted ids for conversation.item.deleted
        events. A deleted item's audio not yet transcribed is dropped (its transcription skips it)."""
        deleted = []
        for over, counts in ((lambda: len(self.items) > self.max_items, lambda item: True),
                             (lambda: self.chars > self.max_chars, lambda item: self._chars[item.id] > 0),
                             (lambda: self.pending > self.max_pending,
                              lambda item: any(part.audio is not None for part in item.parts))):
            index = 0
            while over() and index < len(self.items):
                item = self.items[index]
                if item is keep or item.status == "in_progress" or not counts(item):
                    index += 1
                    continue
                self.delete(item.id)
                deleted.append(item.id)
        return deleted

    def index(self, item_id: str, param: str = "item_id") -> int:
        """Position of the item; raises ProtocolError (item_not_found, naming the client event's field
        `param`) when there is none."""
        return self.items.index(self.get(item_id, param))

    def get(self, item_id: str, param: str = "item_id") -> Item:
        """The item; raises ProtocolError as `index` does."""
        item = self._by_id.get(item_id)
        if item is None:
            raise ProtocolError(f"no item with id {item_id!r}", param=param, code="item_not_found")
        return item

    def delete(self, item_id: str) -> None:
        """Removes the item, its kept audio and its audio still waiting for transcription; raises ProtocolError as
        `index` does."""
        item = self.items.pop(self.index(item_id))
        del self._by_id[item_id]
        self.chars -= self._chars.pop(item_id)
        for part in item.parts:
            if part.kept is not None:
                self._kept.remove(part)
                part.kept = None
            if part.audio is not None:
                self.pending -= part.audio.size
                part.audio = None

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def messages(self, instructions: str, items: list[Item] | None = None, max_chars: int = HISTORY_CHARS) -> list[dict]:
        """Chat messages for the pipeline, never none: the instructions as the system message, then the items'
        text (user audio by its transcript), newest items kept within `max_chars` (the newest one always)."""
        kept, size = [], 0
        for item in reversed(self.items if items is None else items):
            text = item.text
            if not text:
                continue
            if kept and size + len(text) > max_chars:
                break
            kept.append({"role": item.role, "content": text})
            size += len(text)
        # the instructions; also when empty if nothing else is sent: a response on an empty conversation without
        # instructions (the assistant speaks first) sends the empty system prompt, not an empty message list
        system = [{"role": "system", "content": instructions}] if instructions or not kept else []
        return system + kept[::-1]


def truncate(item: Item, content_index: int, audio_end_ms: int) -> None:
    """Cut an assistant audio part to what the user heard: the transcript keeps the chunks that played
    before `audio_end_ms` and the share of words of the chunk that was playing. Raises ProtocolError for
    a non-audio part or a time past the audio's end."""
    if item.role != "assistant" or not 0 <= content_index < len(item.parts) or item.parts[content_index].kind != "output_audio":
        raise ProtocolError("only assistant audio content can be truncated", param="content_index",
                            code="invalid_value")
    part = item.parts[content_index]
    total = sum(ms for _, ms in part.spoken)
    if not 0 <= audio_end_ms <= total + 1:
        raise ProtocolError(f"audio_end_ms {audio_end_ms} is outside the audio (0 to {total:.0f} ms)",
                            param="audio_end_ms", code="invalid_value")
    heard, elapsed = [], 0.0
    for text, ms in part.spoken:
        if elapsed + ms <= audio_end_ms:
            heard.append(text)
        elif elapsed < audio_end_ms:
            words = text.split()
            heard.append(" ".join(words[:int(len(words) * (audio_end_ms - elapsed) / ms)]))
        elapsed += ms
    part.text = " ".join(t for t in heard if t)
