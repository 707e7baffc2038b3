"""omni_frontend: the OpenAI-compatible HTTP/WebSocket frontend and the launcher for tritonserver.

Maps OpenAI requests onto Triton gRPC streaming calls of the client-facing pipeline models in
`model_repository/`. Never imports model code.
"""
