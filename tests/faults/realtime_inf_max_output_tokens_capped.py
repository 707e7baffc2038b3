"""Server A. A realtime session with max_output_tokens "inf" (the default, echoed in session.created/updated and
in each response) still has its answers cut at the voice pipeline's default of 256 tokens, and response.done says
status "incomplete", reason "max_output_tokens" — a limit the client never set.

Steps: client.realtime.connect(model="voice"); session.update output_modalities ["text"]; a user item asking for a
very long story; response.create; read until response.done.
Expected: "inf" means no per-response cap below the documented session maximum (docs/pipelines.md "Realtime voice":
max_output_tokens "inf" or 1-4096; OpenAI: "inf" = the model's maximum), so a 256-token answer is not reported as
cut by max_output_tokens (or the session should state the real cap instead of "inf").
Actual: status incomplete / max_output_tokens with output_tokens == 256 while max_output_tokens is "inf".
"""
import asyncio, os, sys
import openai

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")


async def main() -> int:
    client = openai.AsyncOpenAI(base_url=B + "/v1", api_key="unused")
    async with client.realtime.connect(model="voice") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": "inf",
                                           "instructions": "You write very long, detailed stories."})
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Write a very long story of at least 2000 words about a dragon and a knight."}]})
        await conn.response.create()
        async for ev in conn:
            if ev.type == "response.done":
                r = ev.response
                print("max_output_tokens", r.max_output_tokens, "status", r.status, r.status_details,
                      "output_tokens", r.usage and r.usage.output_tokens)
                if r.status == "incomplete" and r.status_details and r.status_details.reason == "max_output_tokens" \
                        and r.max_output_tokens == "inf" and r.usage.output_tokens < 4096:
                    print("FAULT: cut by max_output_tokens at", r.usage.output_tokens, "tokens with max_output_tokens 'inf'")
                    return 1
                return 0
    return 0

sys.exit(asyncio.run(main()))
