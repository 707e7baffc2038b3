"""HTTP routes, one module per OpenAI API area."""
