"""A real HTTP server on 127.0.0.1 answering the few Hugging Face Hub endpoints timm's ``push_to_hf_hub`` calls
(create the repo, look for a README, validate its metadata, pre-upload, commit), keeping what is committed and
serving it back at ``/ORG/NAME/resolve/REV/FILE`` (what ``hf_hub_download`` fetches; one repo per server). A
stand-in for the hub in tests that cannot reach it: ``HF_ENDPOINT=server.url`` in the pushing process. ``status=401``
answers every request as the hub answers a bad token. Uploads go the "regular" way (contents in the commit), never
LFS / Xet: the protocol beyond that is not imitated."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeHub:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.created: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}  # committed path -> bytes
        self.readme_metadata: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _file(self, data: bytes) -> None:  # a committed file, as the hub's resolve endpoint serves it
                import hashlib

                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", "1" * 40)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                hub.requests.append((self.command, self.path))
                body = self._body() if self.command == "POST" else b""
                if hub.status != 200:
                    self._reply(hub.status, {"error": "Invalid credentials in Authorization header"},
                                {"X-Error-Message": "Invalid credentials in Authorization header"})
                    return
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    hub.created.append(payload)
                    repo = f"{payload['organization']}/{payload['name']}"
                    self._reply(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo, "id": repo})
                elif path == "/api/validate-yaml":  # the README's metadata block
                    hub.readme_metadata.append(json.loads(body)["content"])
                    self._reply(200, {"errors": [], "warnings": []})
                elif "/resolve/" in path and path.split("/resolve/", 1)[1].split("/", 1)[-1] in hub.files:
                    self._file(hub.files[path.split("/resolve/", 1)[1].split("/", 1)[-1]])
                elif "/resolve/" in path:
                    self._reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound",
                                                                    "X-Error-Message": "Entry not found"})
                elif "/preupload/" in path:
                    files = json.loads(body)["files"]
                    self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                for f in files]})
                elif "/commit/" in path:
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item.get("key") == "file":
                            value = item["value"]
                            hub.files[value["path"]] = base64.b64decode(value["content"])
                    repo = path.split("/api/models/", 1)[1].rsplit("/commit/", 1)[0]
                    self._reply(200, {"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{'1' * 40}",
                                      "commitOid": "1" * 40, "pullRequestUrl": None})
                else:
                    self._reply(404, {"error": f"fake hub: no route for {self.command} {path}"})

            do_GET = do_POST = do_HEAD = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
