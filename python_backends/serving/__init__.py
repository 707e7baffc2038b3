"""Triton Python-backend adapters. Only imported inside Triton stub processes (they use
`triton_python_backend_utils`); the stage logic they wrap lives in plain modules next door."""
