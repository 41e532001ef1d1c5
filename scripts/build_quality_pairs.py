"""Write core/quality/builtin_pairs.jsonl.gz, the built-in retrieval set, from this Python's standard library.

    .venv/bin/python scripts/build_quality_pairs.py            # write it
    .venv/bin/python scripts/build_quality_pairs.py --check    # exit 1 when the shipped file differs

Run it with Python 3.11 (the version the shipped set was made from: another version's library has other
docstrings). What a pair is, and the splits: core/quality/data.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.quality.data import PAIRS_FILE, docstring_pairs  # noqa: E402


def encoded(pairs: list[dict]) -> str:
    return "".join(json.dumps(pair, ensure_ascii=False, sort_keys=True) + "\n" for pair in pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    args = parser.parse_args()
    text = encoded(docstring_pairs(Path(sysconfig.get_paths()["stdlib"])))
    if args.check:
        shipped = gzip.decompress(PAIRS_FILE.read_bytes()).decode("utf-8")
        print("same" if shipped == text else f"{PAIRS_FILE} differs from this Python's standard library")
        return 0 if shipped == text else 1
    PAIRS_FILE.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"{text.count(chr(10))} pairs -> {PAIRS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
