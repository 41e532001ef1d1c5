"""scripts/bench_batch_choice.py: its cases run through the batcher of this checkout and of a baseline checkout
(here the same one), and the batches it reports are the ones the limits allow. Not timed: nothing here asserts
a speed."""

from __future__ import annotations

import subprocess
import sys

from tests.infra.conftest import ROOT


def test_the_batch_choice_benchmark_reports_every_case_beside_a_baseline():
    result = subprocess.run(
        [sys.executable, "scripts/bench_batch_choice.py", "--baseline", str(ROOT), "--repeats", "3", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    rows = [line.strip("|").split("|") for line in result.stdout.splitlines() if line.startswith("| ")
            and line[2].isdigit()]
    assert len(rows) == 5, result.stdout
    for texts, limits, items, per_batch, per_item, baseline, ratio in ([c.strip() for c in row] for row in rows):
        budget, size = (int(part) for part in limits.split(","))
        chosen = int(items)
        # 12–14 tokens an item: the budget or the item limit bounds the batch, whichever binds first
        assert min(size, budget // 14) <= chosen <= min(size, budget // 12), rows
        assert float(per_batch) > 0 and float(baseline) > 0
        assert abs(float(per_item) - float(per_batch) / chosen) < 0.01 + 1e-6 * float(per_batch)
        assert float(ratio) > 0


def test_a_folder_without_a_batcher_is_refused(tmp_path):
    result = subprocess.run([sys.executable, "scripts/bench_batch_choice.py", "--baseline", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "has no core/batching.py" in result.stderr
