#!/usr/bin/env python
"""What tokenizing a text costs Tessera, with and without the tokenizer's plain-text twin
(``core.tokenization.ascii_twin``): ``TextTokenizer.encode`` on the default model's tokenizer
(all-MiniLM-L6-v2, truncating at its limit), in calls of 1 and of 32 texts, on plain short texts (the
benchmarks' texts, printable ASCII: the twin takes them) and on the same texts with an accented word in each
(the folder's tokenizer takes them either way: what a text the twin cannot take costs now).

    .venv/bin/python scripts/bench_tokenizer.py
    .venv/bin/python scripts/bench_tokenizer.py --seconds 2 --repeats 7

Prints, per case, the best of ``--repeats`` interleaved repeats of CPU µs per text (this process, all threads).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def cpu_per_text(tokenizer, chunks: list[list[str]], seconds: float) -> float:
    """CPU µs per text of ``tokenizer.encode`` over ``chunks`` in turn for ``seconds`` of wall time."""
    tokenizer.encode(chunks[0])
    calls, texts, cpu0, stop = 0, 0, time.process_time(), time.perf_counter() + seconds
    while time.perf_counter() < stop or calls == 0:
        chunk = chunks[calls % len(chunks)]
        tokenizer.encode(chunk)
        calls += 1
        texts += len(chunk)
    return 1e6 * (time.process_time() - cpu0) / texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1.0, help="wall time per repeat of a case")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    from benchmarks.texts import make_texts
    from core.config import default_model_path
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer

    folder = default_model_path()
    max_length = read_model_info(folder).max_length
    with_twin = TextTokenizer(folder, max_length)
    without = TextTokenizer(folder, max_length, twin=False)
    plain = make_texts("short", 2048)
    accented = [text + " café" for text in plain]
    print(f"tokenizer: {folder}, truncating at {max_length} tokens; best of {args.repeats} × {args.seconds} s")
    print("| texts | per call | µs CPU per text, folder's tokenizer | with the twin | with ÷ without |")
    print("|---|---|---|---|---|")
    for name, texts in (("plain (ASCII)", plain), ("one accented word each", accented)):
        for batch in (1, 32):
            chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
            runs: dict[str, list[float]] = {"without": [], "with": []}
            for _ in range(args.repeats):  # the two interleaved, so a change in the machine's pace hits both
                runs["without"].append(cpu_per_text(without, chunks, args.seconds))
                runs["with"].append(cpu_per_text(with_twin, chunks, args.seconds))
            best = {label: min(values) for label, values in runs.items()}
            print(f"| {name} | {batch} | {best['without']:.1f} | {best['with']:.1f} | "
                  f"{best['with'] / best['without']:.2f} |")


if __name__ == "__main__":
    main()
