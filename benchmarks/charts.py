"""The Tessera/Infinity comparison's charts (matplotlib, PNG): throughput over concurrency, p50/p99 latency."""

from __future__ import annotations

from pathlib import Path


def charts(rows: list[dict], out_dir: Path, precision: str) -> list[Path]:
    """``throughput-{precision}.png`` and ``latency-{precision}.png`` in ``out_dir`` from the comparison rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    kinds = sorted({r["texts"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(len(batches), len(kinds), figsize=(4.2 * len(kinds), 3.4 * len(batches)), squeeze=False)
    for i, batch in enumerate(batches):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for server, style in (("tessera", "o-"), ("infinity", "s--")):
                pts = sorted((r["conc"], r[f"{server} emb/s"]) for r in rows if r["texts"] == kind and r["batch"] == batch)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=server.capitalize())
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{kind} texts, {batch} per request")
            ax.set_xlabel("concurrency")
            ax.set_ylabel("embeddings/s")
            ax.grid(alpha=0.3)
            ax.legend()
    written.append(_save(plt, fig, f"Throughput, all-MiniLM-L6-v2 {precision}, 2-core CPU",
                         out_dir / f"throughput-{precision}.png"))

    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), squeeze=False)
    for j, kind in enumerate(kinds):
        ax = axes[0][j]
        cells = [r for r in rows if r["texts"] == kind]
        labels = [f"b{r['batch']}×c{r['conc']}" for r in cells]
        x = range(len(cells))
        for k, (server, offset) in enumerate((("tessera", -0.2), ("infinity", 0.2))):
            for pct, alpha in (("p99", 0.35), ("p50", 1.0)):
                ax.bar([i + offset for i in x], [r[f"{server} {pct} ms"] for r in cells], width=0.38,
                       alpha=alpha, color=f"C{k}", label=f"{server.capitalize()} {pct}")
        ax.set_yscale("log")
        ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
        ax.set_ylabel("latency ms (log)")
        ax.set_title(f"{kind} texts")
        ax.legend(fontsize=7)
    written.append(_save(plt, fig, f"Latency p50 / p99, {precision}", out_dir / f"latency-{precision}.png"))
    return written


def _save(plt, fig, title: str, path: Path) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def task_chart(result: dict, out_dir: Path) -> Path:
    """``compare-{task}-{precision}.png``: per cell, the throughput of Tessera, Infinity and the plain loop,
    and both servers' p50 latency (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    labels = [f"{r['kind']}×{r['batch']}\nc{r['conc']}" for r in rows]
    x = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(7.0, 2.2 * len(rows)), 3.8))
    def plain_rate(r: dict) -> float:  # one-client cells carry the plain loop's time per call instead
        return r.get("plain items/s") or (1000 * r["batch"] / r["plain ms/call"] if "plain ms/call" in r else 0)

    for k, (values, name) in enumerate((([r["tessera items/s"] for r in rows], "Tessera"),
                                        ([r["infinity items/s"] for r in rows], "Infinity"),
                                        ([plain_rate(r) for r in rows], "plain loop"))):
        left.bar([i + (k - 1) * 0.27 for i in x], values, width=0.26, color=f"C{k}", label=name)
    left.set_xticks(list(x), labels, fontsize=8)
    left.set_ylabel(f"{rows[0]['unit'] if len({r['unit'] for r in rows}) == 1 else 'items'}/s")
    left.set_title("throughput")
    left.legend(fontsize=7)
    for k, (key, name) in enumerate((("tessera p50 ms", "Tessera"), ("infinity p50 ms", "Infinity"))):
        right.bar([i + (k - 0.5) * 0.38 for i in x], [r[key] for r in rows], width=0.36, color=f"C{k}", label=name)
    right.set_yscale("log")
    right.set_xticks(list(x), labels, fontsize=8)
    right.set_ylabel("p50 latency ms (log)")
    right.set_title("p50 latency")
    right.legend(fontsize=7)
    return _save(plt, fig, f"{result['task']} {result['precision']}: Tessera vs Infinity 0.0.78, default configurations",
                 out_dir / f"compare-{result['task']}-{result['precision']}.png")
