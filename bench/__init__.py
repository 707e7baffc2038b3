"""omni_bench: the benchmark client of Omni-Triton (`scripts/bench`, docs/benchmarks.md).

Drives the OpenAI-compatible frontend over HTTP (httpx, SSE) and measures what a user sees: time to
first text (TTFT), time to first audio packet (TTFP), inter-token latency, real-time factor and
throughput, per request and summarised. Imports no model code; only `omni_bench.baseline` (loaded
for `--baseline inprocess`) calls the model libraries in this process for comparison.
"""
