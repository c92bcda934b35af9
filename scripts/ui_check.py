#!/usr/bin/env python3
"""Checks kvgate's live page (/ui) in a real headless Chromium, speaking the DevTools protocol
over --remote-debugging-pipe (standard library only).

usage: ui_check.py CHROMIUM GATEWAY_URL ADMIN_TOKEN ENDPOINT_COUNT [SCREENSHOT.png]

It opens /ui, which asks for the admin token; types it in; waits until the fleet table lists
every endpoint; then sends traffic through the gateway and requires the page to show the new
requests' decisions (and a TTFT line) within 2 s of each answer. Exits non-zero on failure.
"""
import base64
import json
import os
import subprocess
import sys
import time
import urllib.request


class Browser:
    def __init__(self, chromium):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def wire():
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", "--window-size=1400,1000", "--hide-scrollbars",
             "about:blank"],
            preexec_fn=wire, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.next_id = 0
        self.buffer = b""
        self.session = None

    def call(self, method, params=None, timeout=20):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            if time.monotonic() > deadline:
                raise TimeoutError(method)
            chunk = os.read(self.from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buffer += chunk

    def open(self, url):
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]

    def eval(self, expression):
        result = self.call("Runtime.evaluate",
                           {"expression": expression, "returnByValue": True,
                            "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression, limit, what):
        deadline = time.monotonic() + limit
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {limit} s waiting for {what}")
            time.sleep(0.05)

    def close(self):
        self.proc.kill()
        self.proc.wait()


def chat(gateway, session, text, stream):
    body = json.dumps({
        "model": "test-model", "stream": stream, "max_tokens": 8, "ignore_eos": True,
        "messages": [{"role": "system", "content": "You are a terse assistant. " * 40},
                     {"role": "user", "content": text}],
    }).encode()
    req = urllib.request.Request(f"{gateway}/v1/chat/completions", data=body, headers={
        "content-type": "application/json", "x-kvgate-session": session})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        return r.headers["x-kvgate-request-id"]


def main():
    chromium, gateway, token, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    screenshot = sys.argv[5] if len(sys.argv) > 5 else None
    b = Browser(chromium)
    try:
        b.open(f"{gateway}/ui")
        b.wait("location.pathname === '/ui' && document.readyState === 'complete'"
               " && document.getElementById('login') !== null", 20, "the page to load")
        b.wait("getComputedStyle(document.getElementById('login')).display === 'flex'", 10,
               "the page to ask for the admin token")
        b.eval(f"document.getElementById('token').value = {json.dumps(token)};"
               "document.getElementById('login').requestSubmit(); true")
        rows = b.wait(f"document.querySelectorAll('#fleet tbody tr[data-endpoint]').length >= {count}"
                      " && document.querySelectorAll('#fleet tbody tr[data-endpoint]').length",
                      10, f"{count} endpoints in the fleet table")
        assert rows == count, f"{rows} rows for {count} endpoints"
        policy = b.eval("document.getElementById('policy').textContent")
        print(f"page loaded: {rows} endpoints, policy {policy}")
        worst = 0.0
        for i in range(6):
            rid = chat(gateway, f"ui-{i % 2}", f"question {i}", stream=True)
            answered = time.monotonic()
            b.wait(f"document.querySelector('#decisions tr[data-request=\"{rid}\"]') !== null", 2.0,
                   f"request {rid}'s decision on the page within 2 s")
            worst = max(worst, time.monotonic() - answered)
        b.wait("document.querySelectorAll('#ttft polyline').length === 2", 2.0,
               "the TTFT lines within 2 s")
        labels = b.eval("[...document.querySelectorAll('#decisions .badge')].map(e => e.textContent)")
        print(f"each decision shown within {worst:.2f} s of its answer; labels {sorted(set(labels))}")
        if screenshot:
            # Concurrent sessions sharing a system prompt, so the picture has several
            # endpoints busy and decisions with their runner-ups.
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(12) as pool:
                list(pool.map(lambda i: chat(gateway, f"shot-{i % 5}", f"follow-up {i} " * (i % 7),
                                             stream=(i % 3 != 0)), range(240)))
            time.sleep(2.5)
            data = b.call("Page.captureScreenshot", {"format": "png"})["data"]
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(data))
            print(f"screenshot: {screenshot}")
    finally:
        b.close()


if __name__ == "__main__":
    main()
