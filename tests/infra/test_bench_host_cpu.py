"""scripts/bench_host_cpu.py (benchmarks/host_cpu.py): the server's whole process tree's CPU, children that
exited included, and a quick real run against Tessera whose figures are all there and add up. Not timed:
nothing here asserts a speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

from benchmarks.host_cpu import NEAR_FREE, dimension, near_free_model, tree_cpu, tree_pids
from benchmarks.server import process_cpu
from tests.infra.conftest import ROOT

BURN = 0.4  # CPU seconds each child spends

# a parent that, on "go", runs one child to its end (and reaps it), starts a second that stays alive after
# its work, and says "done" once both have burnt their CPU; it spends almost none itself
PARENT = textwrap.dedent(f"""
    import subprocess, sys
    burn = "import time\\nwhile time.process_time() < {BURN}: pass\\n"
    sys.stdin.readline()
    subprocess.run([sys.executable, "-c", burn], check=True)
    alive = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True)\\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    alive.stdout.readline()
    print(alive.pid, flush=True)
    sys.stdin.readline()
    alive.stdin.close()
    alive.wait()
""")


def test_tree_cpu_counts_live_children_and_those_that_exited():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before, own_before = tree_cpu(parent.pid), process_cpu(parent.pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        alive_pid = int(parent.stdout.readline())  # the first child has exited, the second has burnt its CPU
        assert alive_pid in tree_pids(parent.pid)
        spent, own = tree_cpu(parent.pid) - before, process_cpu(parent.pid) - own_before
        assert spent >= 2 * BURN - 0.05, spent  # both children: the reaped one through the parent's cutime
        assert own < BURN, own  # the parent alone did not spend it
        parent.stdin.write("stop\n")
        parent.stdin.close()
        assert parent.wait(timeout=60) == 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert tree_cpu(parent.pid) is None  # gone


def test_near_free_model_has_the_shape_and_minilms_tokenizer():
    folder = near_free_model()
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in NEAR_FREE} == NEAR_FREE
    assert dimension(folder) == 32
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 32 and pooling["pooling_mode_mean_tokens"]
    assert (folder / "tokenizer.json").exists() and (folder / "model.safetensors").exists()


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_run_against_tessera_prints_figures_that_add_up(tmp_path):
    out = tmp_path / "host-cpu.json"
    proc = subprocess.run(
        [sys.executable, "scripts/bench_host_cpu.py", "--quick", "--servers", "tessera", "--models", "near-free",
         "--concurrency", "8", "--json", str(out)],
        cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "load generator runs in its own process and is NOT counted" in proc.stdout
    assert "µs CPU per embedding" in proc.stdout and "floor: tokenizer" in proc.stdout
    result = json.loads(out.read_text())
    cells = result["cells"]
    assert sorted(c["batch"] for c in cells) == [1, 32]
    for c in cells:
        assert (c["model"], c["server"], c["conc"]) == ("near-free", "tessera", 8)
        assert c["errors"] == 0 and c["requests"] > 0
        assert c["embeddings"] == c["requests"] * c["batch"]
        for key in ("server cpu s", "us/emb", "us/req", "emb/s", "cores", "loadgen cores", "seconds"):
            assert _positive(c[key]), (key, c)
        assert math.isclose(c["us/emb"], 1e6 * c["server cpu s"] / c["embeddings"], rel_tol=1e-9)
        assert math.isclose(c["cores"], c["server cpu s"] / c["seconds"], rel_tol=1e-9)
        assert math.isclose(c["emb/s"], c["embeddings"] / c["seconds"], rel_tol=1e-9)
        assert c["cores"] <= result["cpus"] * 1.1  # a process tree cannot use more than the machine has
        # the batches it formed, from its /metrics around the cell: at least the cell's embeddings in them
        # (the load generator's warm-up requests too), never more items a batch than texts in flight
        assert c["batches"] >= 1 and c["items/batch"] * c["batches"] >= c["embeddings"]
        assert 1 <= c["items/batch"] <= 8 * c["batch"] and c["padded/batch"] >= c["items/batch"]
    assert [(m["batch"], m["embeddings"], m["items/batch"]) for m in result["medians"]] == [
        (c["batch"], c["embeddings"], c["items/batch"]) for c in cells]
    assert "items a batch" in proc.stdout and "items per batch" in proc.stdout
    assert len(result["floors"]) == 2
    for floor in result["floors"]:
        assert _positive(floor["tokenizer us/text"]) and _positive(floor["response us/emb"])


def test_a_baseline_server_runs_the_code_of_its_own_checkout(tmp_path):
    """``start_server(root=...)`` (the script's ``--baseline``): the server imports ``core`` from that
    checkout, not from this one, though this one is on PYTHONPATH."""
    import httpx

    from benchmarks.loopback import free_port
    from benchmarks.server import start_server, stop_server, wait_ready

    _checkout_answering(tmp_path, "__file__")
    port = free_port()
    proc = start_server([], port, None, {}, output=subprocess.DEVNULL, root=tmp_path)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout=120)
        assert httpx.get(f"http://127.0.0.1:{port}/ready").text == str(tmp_path / "core" / "dev.py")
    finally:
        stop_server(proc)


def test_the_baseline_takes_its_own_model_options(tmp_path):
    """``--baseline-option`` (``start(baseline_options=...)``): the baseline server's model spec carries those
    options instead of ``--tessera-option``'s, so one checkout can be measured against itself with another
    setting; without them both take ``--tessera-option``'s."""
    import httpx

    from benchmarks.host_cpu import start
    from benchmarks.loopback import free_port
    from benchmarks.server import stop_server, wait_ready

    _checkout_answering(tmp_path, 'os.environ["TESSERA_MODELS"]')

    def spec(baseline_options):
        port = free_port()
        proc, health = start("baseline", tmp_path, port, None, {}, subprocess.DEVNULL, {"ort_spin": "run"},
                             tmp_path, baseline_options)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc, timeout=120, path=health)
            (model,) = json.loads(httpx.get(f"http://127.0.0.1:{port}{health}").text)
            return model
        finally:
            stop_server(proc)

    assert spec({"ort_spin": True})["ort_spin"] is True
    assert spec(None)["ort_spin"] == "run"


def test_batch_counts_read_every_models_series_and_nothing_else():
    """``batch_counts`` sums the batch counters of every model in a server's /metrics (Prometheus's text
    format) and answers None where a server has none, or answers nothing."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from benchmarks.host_cpu import batch_counts, batch_shape

    pages = {
        "/a/metrics": "\n".join([
            "# HELP tessera_batch_size items per batch", "# TYPE tessera_batch_size histogram",
            'tessera_batch_size_bucket{le="1.0",model="a"} 2.0', 'tessera_batch_size_count{model="a"} 4.0',
            'tessera_batch_size_sum{model="a"} 40.0', 'tessera_batch_size_count{model="b"} 1.0',
            'tessera_batch_size_sum{model="b"} 3.0', 'tessera_batch_size_created{model="a"} 1.7e9',
            'tessera_batch_padded_tokens_sum{model="a"} 500.0', 'tessera_batch_tokens_sum{model="a"} 450.0']),
        "/b/metrics": "# HELP something_else x\nsomething_else 1.0",
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        counts = batch_counts(f"{url}/a")
        assert counts == {"batches": 5.0, "items": 43.0, "padded tokens": 500.0}
        assert batch_counts(f"{url}/b") is None and batch_counts(f"{url}/missing") is None
        later = {"batches": 9.0, "items": 83.0, "padded tokens": 900.0}
        assert batch_shape(counts, later) == {"batches": 4, "items/batch": 10.0, "padded/batch": 100.0}
        assert batch_shape(counts, counts)["items/batch"] is None and batch_shape(None, later)["batches"] is None
    finally:
        server.shutdown()
        server.server_close()


def test_the_bare_asgi_floor_answers_what_the_load_generator_verifies():
    """The bare app (``--servers ...,bare``) answers an embeddings request with vectors the load generator
    accepts (count, order, dimension), and refuses a body that is not one."""
    import httpx

    from benchmarks.bare_asgi import start_bare
    from benchmarks.load import verify
    from benchmarks.loopback import free_port
    from benchmarks.server import stop_server, wait_ready

    port = free_port()
    proc = start_bare(32, port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, timeout=120, path="/health")
        r = httpx.post(url + "/embeddings", json={"input": ["a", "b", "c"], "model": "bench",
                                                  "encoding_format": "base64"})
        assert verify(r.status_code, r.content, 3, 32)
        assert not verify(r.status_code, r.content, 3, 384)
        one = httpx.post(url + "/embeddings", json={"input": "a", "model": "bench"})
        assert verify(one.status_code, one.content, 1, 32)
        assert httpx.post(url + "/embeddings", content=b"not json").status_code == 400
    finally:
        stop_server(proc)


def _checkout_answering(root, value: str) -> None:
    """A checkout at ``root`` whose ``core.dev:app`` answers every request with ``value`` (a Python expression
    evaluated in that module, which imports ``os``), so a test sees which code and settings a server ran with."""
    (root / "core").mkdir()
    (root / "core" / "__init__.py").write_text("")
    (root / "core" / "dev.py").write_text(textwrap.dedent(f"""
        import os

        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            await send({{"type": "http.response.start", "status": 200, "headers": []}})
            await send({{"type": "http.response.body", "body": {value}.encode()}})
    """))
