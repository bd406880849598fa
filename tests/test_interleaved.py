"""benchmarks/interleaved.py against two stand-in servers that log every prompt they get:
within a turn both servers get the same prompts, and no turn repeats an earlier turn's (a
server that keeps whole prompts cached would answer a repeat from its cache)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A server that answers /health and streams three tokens for any completion, appending each
# prompt to the file named by its second argument.
STAND_IN = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(sys.argv[2], "a") as log:
            log.write(json.dumps(payload["prompt"]) + "\\n")
        events = [{"choices": [{"index": 0, "text": t}]} for t in ("a", "b", "c")]
        events.append({"choices": [], "usage": {"completion_tokens": 3}})
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\\n\\n" for e in events)
        body += b"data: [DONE]\\n\\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_every_turn_sends_new_prompts_the_same_to_every_server(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    servers = [f"{name}={sys.executable} {script} {{port}} {tmp_path / name}.log"
               for name in ("first", "second")]
    subprocess.run([sys.executable, "benchmarks/interleaved.py", str(tmp_path / "out"), *servers,
                    "--turns", "2", "--", "--users", "3", "--max-tokens", "3"],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    turns = {}
    for name in ("first", "second"):
        lines = (tmp_path / f"{name}.log").read_text().splitlines()
        # bench.py's own warm-up request (not measured) opens each of its runs
        prompts = [json.loads(line) for line in lines
                   if not json.loads(line).startswith("Warmup request")]
        assert len(prompts) == 1 + 2 * 3  # interleaved.py's warm-up, then two turns of three
        # (the users of a turn arrive in any order; the turns one after the other)
        turns[name] = [set(prompts[:1]), set(prompts[1:4]), set(prompts[4:7])]
    assert turns["first"] == turns["second"]
    warm_up, one, two = turns["first"]
    assert len(one) == 3 and len(two) == 3
    assert not one & two and not warm_up & (one | two)


def test_bench_flags_may_not_set_the_prompt_numbers(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/interleaved.py", str(tmp_path),
                           f"one={sys.executable} -c pass {{port}}", "--", "--first-serial", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--first-serial is set per turn" in done.stderr
