"""A scripted HTTP server for the shared retry cases
(clients/testdata/retry_cases.json): each request is answered with the next
step of a script, and every request is kept for the checks."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

CASES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "retry_cases.json")


def load_cases() -> Dict[str, Any]:
    with open(CASES_PATH, encoding="utf-8") as f:
        return json.load(f)


class Seen:
    def __init__(self, method: str, path: str, key: Optional[str], body: bytes, auth: Optional[str]) -> None:
        self.method, self.path, self.key, self.body, self.auth = method, path, key, body, auth


class ScriptedServer:
    """Serves script on 127.0.0.1 until close()."""

    def __init__(self, script: List[Dict[str, Any]], success_body: Any = None) -> None:
        self.script = list(script)
        self.success_body = success_body
        self.seen: List[Seen] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # ends every hanging request
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with outer.lock:
                    outer.seen.append(Seen(self.command, self.path, self.headers.get("Idempotency-Key"), body, self.headers.get("Authorization")))
                    step = outer.script.pop(0) if outer.script else {"status": 500, "body": {"type": "script-exhausted", "title": "no more steps"}}
                if step.get("drop"):
                    self.close_connection = True
                    return  # no answer at all: the connection closes
                if step.get("hang"):
                    outer.release.wait(30)
                    self.close_connection = True
                    return
                status = int(step["status"])
                payload = step.get("body")
                if payload is None and 200 <= status < 300:
                    payload = outer.success_body
                raw = json.dumps(payload).encode("utf-8") if payload is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", step.get("content_type", "application/json"))
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (step.get("headers") or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
