"""OpenAI Realtime (GA events) over WebSocket: `/v1/realtime?model=voice`, and the browser page `GET /realtime`.

`route` (the endpoints), `session` (one connection's state machine and tasks), `protocol` (event codec on the
`openai` SDK's `openai.types.realtime` models), `config` (session defaults, deep merge, validation),
`conversation` (items, transcripts, truncation), `audio` (input/output formats), `stages` (the VAD sequence
and ASR calls to Triton). No model code: models run in Triton.
"""
