"""Helper of scripts/capture-vllm-fixtures.sh: HTTP captures and the KV-event subscriber.

usage: capture_vllm_fixtures.py http BASE_URL OUT_DIR
       capture_vllm_fixtures.py subscribe BIND_ENDPOINT OUT_DIR
"""
import json
import signal
import sys
import urllib.error
import urllib.request


def post(url, body, stream=False):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def get(url):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def http(base, out):
    # A prompt of several 32-token blocks, sent twice so the second is a prefix-cache hit.
    prompt = " ".join(["the load balancer routes each request to the engine with the prefix cache"] * 12)
    chat = {"model": "tiny", "messages": [{"role": "system", "content": prompt},
                                          {"role": "user", "content": "hello"}],
            "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    comp = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "ignore_eos": True, "temperature": 0}

    def save(name, text):
        with open(f"{out}/{name}", "w") as f:
            f.write(text)

    status, _, body = post(f"{base}/v1/chat/completions", chat)
    assert status == 200, body
    status, _, body = post(f"{base}/v1/chat/completions", chat)
    save("chat-completion.json", json.dumps(json.loads(body), indent=2) + "\n")
    _, _, body = post(f"{base}/v1/chat/completions",
                      dict(chat, stream=True, stream_options={"include_usage": True}))
    save("chat-completion-stream.txt", body)
    _, _, body = post(f"{base}/v1/completions", comp)
    save("completion.json", json.dumps(json.loads(body), indent=2) + "\n")
    _, _, body = post(f"{base}/v1/completions",
                      dict(comp, stream=True, stream_options={"include_usage": True}))
    save("completion-stream.txt", body)
    save("models.json", json.dumps(json.loads(get(f"{base}/v1/models")), indent=2) + "\n")

    errors = {
        "error-unknown-model.json": dict(chat, model="no-such-model"),
        "error-context-length.json": dict(chat, max_tokens=100000),
        "error-bad-temperature.json": dict(chat, temperature=-1),
    }
    for name, body in errors.items():
        status, _, text = post(f"{base}/v1/chat/completions", body)
        save(name, json.dumps({"status": status, "body": json.loads(text)}, indent=2) + "\n")
    status, _, text = post(f"{base}/v1/chat/completions", b"{not json")
    save("error-bad-json.json", json.dumps({"status": status, "body": json.loads(text)}, indent=2) + "\n")

    # Fill the small KV pool with distinct prompts so idle cached blocks get evicted.
    for i in range(30):
        post(f"{base}/v1/completions",
             dict(comp, prompt=f"{i} " + " ".join(["queue latency metric token"] * 80), max_tokens=2))
    save("metrics.txt", get(f"{base}/metrics"))


def write_events_json(batches, path):
    """A JSON array with one batch per line: readable and diff-friendly."""
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(b) for b in batches) + "\n]\n")


def subscribe(endpoint, out):
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.bind(endpoint)
    sock.setsockopt(zmq.RCVTIMEO, 200)
    frames = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        try:
            frames.append(sock.recv_multipart())
        except zmq.Again:
            continue
    decoded = []
    for parts in frames:
        topic, seq, payload = parts[0], int.from_bytes(parts[1], "big"), parts[-1]
        decoded.append({"topic": topic.decode(), "seq": seq, "nparts": len(parts),
                        "payload": msgpack.unpackb(payload, raw=False, strict_map_key=False)})
    write_events_json(decoded, f"{out}/kv-events.json")
    # The first few raw messages, length-prefixed frames, for byte-level tests.
    with open(f"{out}/kv-events.bin", "wb") as f:
        for parts in frames[:4]:
            f.write(len(parts).to_bytes(4, "big"))
            for p in parts:
                f.write(len(p).to_bytes(4, "big"))
                f.write(p)


if __name__ == "__main__":
    {"http": http, "subscribe": subscribe}[sys.argv[1]](sys.argv[2], sys.argv[3])
