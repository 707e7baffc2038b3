"""Human-readable output of a benchmark: the per-level table, the baseline comparison, the optional PNG plot."""
from __future__ import annotations

from omni_bench.metrics import STATS, UNITS

COMPARED = ("ttft_s", "ttfp_s", "e2e_s", "rtf", "image_latency_s", "frames_per_second")


def _value(name: str, value: float) -> str:
    return f"{value * 1000:.1f}" if UNITS[name] == "ms" else f"{value:.3f}"


def table(level: dict) -> str:
    """One level's header line (counts, throughput) and a row per metric: n, mean, median, p90, p99."""
    s, tp = level["summary"], level["summary"]["throughput"]
    cap = level["max_concurrency"] or "none"
    lines = [f"== {level['workload']} model={level['model']} max_concurrency={cap} "
             f"request_rate={level['request_rate']}: "
             f"{s['completed']}/{s['requests']} ok in {s['duration_s']:.2f} s | {tp['request_throughput']:.2f} req/s, "
             f"{tp['output_tokens_per_s']:.1f} output tok/s, {tp['audio_seconds_per_s']:.2f} audio s/s"
             + (f", {tp['input_audio_seconds_per_s']:.2f} input audio s/s" if tp["input_audio_seconds_per_s"] else "")
             + (f", {tp['images_per_s']:.2f} images/s" if tp.get("images_per_s") else "")
             + (f", {tp['video_frames_per_s']:.2f} video frames/s" if tp.get("video_frames_per_s") else ""),
             f"{'metric':<26}{'n':>6}" + "".join(f"{k:>11}" for k in STATS)]
    for name, values in s["metrics"].items():
        label = f"{name.removesuffix('_s')} ({UNITS[name]})"
        lines.append(f"{label:<26}{values['n']:>6}" + "".join(f"{_value(name, values[k]):>11}" for k in STATS))
    return "\n".join(lines)


def compare(served: dict, baseline: dict) -> dict:
    """Served vs in-process medians per metric both have: {metric: {served, baseline, ratio, difference}}
    (ratio = served / baseline; difference = served - baseline, in the metric's stored unit)."""
    out = {}
    for name in COMPARED:
        a, b = served["metrics"].get(name), baseline["metrics"].get(name)
        if a and b:
            out[name] = {"served_median": a["median"], "baseline_median": b["median"],
                         "ratio": a["median"] / b["median"] if b["median"] else None,
                         "difference": a["median"] - b["median"]}
    return out


def comparison_table(comparison: dict, served_concurrency: int | None) -> str:
    """The comparison as text; the first line states TTFT serving overhead in ms when measured."""
    lines = [f"== served (max_concurrency={served_concurrency or 'none'}) vs in-process baseline, medians"]
    for name, c in comparison.items():
        ratio = f"{c['ratio']:.2f}x" if c["ratio"] is not None else "n/a"
        lines.append(f"{name.removesuffix('_s'):<8} served {_value(name, c['served_median']):>9} "
                     f"baseline {_value(name, c['baseline_median']):>9} ({UNITS[name]}) ratio {ratio:>7} "
                     f"difference {_value(name, c['difference'])}")
    return "\n".join(lines)


def plot(levels: list[dict], path: str) -> str:
    """Write a PNG (medians of the time metrics and throughput against max concurrency); returns a
    message for the console (what was written, or why nothing was: matplotlib is optional)."""
    try:
        import matplotlib
    except ImportError:
        return f"--plot: matplotlib is not installed, so {path} was not written (pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [level["max_concurrency"] or 0 for level in levels]
    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("ttft_s", "ttfp_s", "e2e_s"):
        if all(name in level["summary"]["metrics"] for level in levels):
            latency.plot(xs, [level["summary"]["metrics"][name]["median"] * 1000 for level in levels], "o-",
                         label=name.removesuffix("_s"))
    latency.set(xlabel="max concurrency (0 = none)", ylabel="median (ms)", title="latency")
    latency.legend()
    for name in ("request_throughput", "output_tokens_per_s", "audio_seconds_per_s"):
        throughput.plot(xs, [level["summary"]["throughput"][name] for level in levels], "o-", label=name)
    throughput.set(xlabel="max concurrency (0 = none)", title="throughput (per s)")
    throughput.legend()
    fig.suptitle(f"{levels[0]['workload']} / {levels[0]['model']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"plot written to {path}"
