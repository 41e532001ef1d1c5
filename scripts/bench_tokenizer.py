#!/usr/bin/env python
"""What tokenizing a text costs Tessera: through the folder's tokenizer, through its plain-text twin
(``core.tokenization.ascii_twin``), and from the memo of words' pieces (``core.word_pieces``, the default):
``TextTokenizer.encode`` on the default model's tokenizer (all-MiniLM-L6-v2, truncating at its limit), in calls
of 1 and of 32 texts, on plain short texts (the benchmarks' texts, printable ASCII: the twin and the memo take
them), on the same texts with an accented word in each (the folder's tokenizer takes them either way: what a text
the others cannot take costs now), and on plain texts of words the memo does not hold, with the memo full (its
worst case: each text is cut into words, then sent to the twin).

    .venv/bin/python scripts/bench_tokenizer.py
    .venv/bin/python scripts/bench_tokenizer.py --seconds 2 --repeats 7

Prints, per case, the best of ``--repeats`` interleaved repeats of CPU µs per text (this process, all threads).
"""

from __future__ import annotations

import argparse
import random
import string
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
    from core import word_pieces
    from core.config import default_model_path
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer

    folder = default_model_path()
    max_length = read_model_info(folder).max_length
    tokenizers = {"folder's tokenizer": TextTokenizer(folder, max_length, twin=False),
                  "the twin": TextTokenizer(folder, max_length, memo=False),
                  "the memo": TextTokenizer(folder, max_length)}
    full = TextTokenizer(folder, max_length)
    rng = random.Random(0)
    while len(full._memo._words) < word_pieces.CAPACITY:  # fill it with words the texts below never hold
        full.encode([" ".join("".join(rng.choices(string.ascii_lowercase, k=12)) for _ in range(64))])
    plain = make_texts("short", 2048)
    accented = [text + " café" for text in plain]
    unknown = [" ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(10))
               for _ in range(2048)]
    print(f"tokenizer: {folder}, truncating at {max_length} tokens; best of {args.repeats} × {args.seconds} s")
    print("| texts | per call | µs CPU per text: the folder's tokenizer | the twin | the memo | memo ÷ twin |")
    print("|---|---|---|---|---|---|")
    for name, texts in (("plain (ASCII)", plain), ("one accented word each", accented),
                        ("plain, words the full memo does not hold", unknown)):
        cases = dict(tokenizers, **({"the memo": full} if texts is unknown else {}))
        for batch in (1, 32):
            chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
            runs: dict[str, list[float]] = {label: [] for label in cases}
            for _ in range(args.repeats):  # interleaved, so a change in the machine's pace hits all
                for label, tokenizer in cases.items():
                    runs[label].append(cpu_per_text(tokenizer, chunks, args.seconds))
            best = [min(values) for values in runs.values()]
            print(f"| {name} | {batch} | {best[0]:.1f} | {best[1]:.1f} | {best[2]:.1f} | {best[2] / best[1]:.2f} |")


if __name__ == "__main__":
    main()
