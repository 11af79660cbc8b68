"""A client of `cleave serve` for serve_test.sh, over Python's urllib and raw sockets (no third-party
package). Each subcommand checks one side of the server and exits non-zero naming what failed:

  api BASE KEY MODEL SCORE_TOOL CHECKPOINT   completions whole and streamed, chat, echo and
      logprobs against the trainer's forward (SCORE_TOOL: tests/tools/score_tokens; - skips it,
      for a tp layout, whose sums differ from one process's by rounding), models,
      health, metrics, every bad input with its status and param, a disconnect mid-stream
  invariance BASE KEY MODEL   a request's tokens and log-probabilities alone and among 16 others
  prefix BASE KEY MODEL       a shared 1,000-token prefix is not computed again (time to first
      token and the server's prefix counter)
  queue BASE KEY MODEL        more requests than the cache holds: all answered, none corrupted
  load BASE KEY MODEL PID     32 clients, a few hundred requests with bad bodies mixed in; every
      answer complete and right; the server's RSS back within 5% of its level after warm-up
  drain BASE KEY MODEL PID    SIGTERM during a stream: the stream ends whole, new requests get 503
  answers BASE KEY MODEL FILE LANES [TOL]   12 requests at once: their tokens and
      log-probabilities written to FILE, or, where FILE exists, equal to those it holds (another
      layout's; the log-probabilities within TOL where given, for a tp layout's rounding); and each
      of the server's LANES lanes (ep ranks) computed some of them
"""
import concurrent.futures
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

BASE, KEY, MODEL = sys.argv[2], sys.argv[3], sys.argv[4]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def call(path, body=None, key=KEY, raw=None, method=None, timeout=120):
    """(status, parsed JSON or text) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(BASE + path, data=data, method=method or ("POST" if data is not None else "GET"))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def stream(path, body, timeout=120, on_first=None):
    """The data lines of a streamed answer, [DONE] included; on_first() when the first comes."""
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + KEY)
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if r.status != 200:
            fail(f"stream {path}: status {r.status}")
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(line[6:])
                if on_first and len(events) == 1:
                    on_first()
    return events


def expect_error(name, status, param, body=None, raw=None, key=KEY, path="/v1/completions", contains=None):
    got, j = call(path, body, key=key, raw=raw)
    if got != status:
        fail(f"{name}: status {got}, expected {status}: {j}")
    if not isinstance(j, dict) or "error" not in j:
        fail(f"{name}: no OpenAI error object: {j}")
    e = j["error"]
    for field in ("message", "type", "param", "code"):
        if field not in e:
            fail(f"{name}: error without {field}: {j}")
    if param is not None and e["param"] != param:
        fail(f"{name}: param {e['param']!r}, expected {param!r}: {j}")
    if contains and contains not in e["message"]:
        fail(f"{name}: message {e['message']!r} does not say {contains!r}")


def completion(prompt, **kw):
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 12}
    body.update(kw)
    status, j = call("/v1/completions", body)
    if status != 200:
        fail(f"completion {body}: {status} {j}")
    return j


def check_usage(name, j, prompt_tokens=None):
    u = j.get("usage")
    if not u or u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"]:
        fail(f"{name}: usage {u}")
    if prompt_tokens is not None and u["prompt_tokens"] != prompt_tokens:
        fail(f"{name}: prompt_tokens {u['prompt_tokens']}, expected {prompt_tokens}")


def api(score_tool, checkpoint):
    # Health, models, the key.
    status, j = call("/health", key=None)
    if status != 200 or j.get("status") != "ok":
        fail(f"/health: {status} {j}")
    expect_error("models without a key", 401, None, path="/v1/models", key=None)
    expect_error("a wrong key", 401, None, body={"model": MODEL, "prompt": "a"}, key="wrong")
    status, j = call("/v1/models")
    if status != 200 or j["data"][0]["id"] != MODEL:
        fail(f"/v1/models: {status} {j}")

    # A completion, greedy: the same twice; streamed, the same text in pieces.
    a = completion("The king", max_tokens=20)
    b = completion("The king", max_tokens=20)
    text = a["choices"][0]["text"]
    if a["object"] != "text_completion" or text != b["choices"][0]["text"] or not text:
        fail(f"greedy completions differ or are empty: {a} {b}")
    if a["choices"][0]["finish_reason"] not in ("length", "stop"):
        fail(f"finish_reason {a['choices'][0]['finish_reason']}")
    check_usage("completion", a)
    events = stream("/v1/completions", {"model": MODEL, "prompt": "The king", "temperature": 0,
                                        "max_tokens": 20, "stream": True,
                                        "stream_options": {"include_usage": True}})
    if events[-1] != "[DONE]":
        fail(f"stream does not end in [DONE]: {events[-3:]}")
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    if streamed != text:
        fail(f"streamed text {streamed!r} is not the whole answer's {text!r}")
    if chunks[-1]["choices"] or chunks[-1]["usage"]["completion_tokens"] != a["usage"]["completion_tokens"]:
        fail(f"stream's usage chunk: {chunks[-1]}")
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    if len(finals) != 1 or "usage" not in finals[0]:
        fail(f"stream's finishing chunk: {finals}")

    # Token ids as the prompt; echo; a stop string; seeded sampling repeats.
    ids = completion([5, 9, 33, 2, 7], max_tokens=5)
    check_usage("ids", ids, prompt_tokens=5)
    echoed = completion("The king", max_tokens=20, echo=True)["choices"][0]["text"]
    if not echoed.endswith(text) or len(echoed) <= len(text):
        fail(f"echo: {echoed!r} does not end in {text!r}")
    if len(text) > 4:
        stop = text[2:4]
        cut = completion("The king", max_tokens=20, stop=[stop])["choices"][0]
        if cut["text"] != text[: text.index(stop)] or cut["finish_reason"] != "stop":
            fail(f"stop {stop!r}: {cut} from {text!r}")
    s1 = completion("The king", temperature=1.0, seed=5, max_tokens=15)["choices"][0]["text"]
    s2 = completion("The king", temperature=1.0, seed=5, max_tokens=15)["choices"][0]["text"]
    if s1 != s2:
        fail(f"seeded sampling differs: {s1!r} {s2!r}")

    # Log-probabilities: the prompt's (echo) are the trainer's forward's, bit for bit (fp32).
    prompt = [5, 9, 33, 2, 7, 101, 64, 12, 40, 8]
    choice = completion(prompt, max_tokens=3, echo=True, logprobs=2)["choices"][0]
    lp = choice["logprobs"]
    # (3 new tokens, fewer where the model ends the text: its end token is not listed)
    new = len(lp["tokens"]) - len(prompt)
    if lp["token_logprobs"][0] is not None or not (new == 3 or 1 <= new < 3 and choice["finish_reason"] == "stop"):
        fail(f"echo logprobs: {choice}")
    if score_tool != "-":  # one process: the trainer's forward is the reference
        want = subprocess.run([score_tool, checkpoint, " ".join(map(str, prompt))], check=True,
                              capture_output=True, text=True).stdout.split()
        got = lp["token_logprobs"][1: len(prompt)]
        f32 = lambda x: struct.unpack("f", struct.pack("f", float(x)))[0]
        if [f32(x) for x in got] != [f32(x) for x in want]:
            fail(f"prompt log-probabilities {got} are not the trainer's {want}")
    if any(len(t) != 2 for t in lp["top_logprobs"][1:]):
        fail(f"top_logprobs: {lp['top_logprobs']}")

    # Chat: whole and streamed.
    chat = {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Who is the king?"}],
            "temperature": 0, "max_tokens": 10}
    status, c = call("/v1/chat/completions", chat)
    if status != 200 or c["object"] != "chat.completion" or c["choices"][0]["message"]["role"] != "assistant":
        fail(f"chat: {status} {c}")
    check_usage("chat", c)
    events = stream("/v1/chat/completions", dict(chat, stream=True))
    parts = [json.loads(e) for e in events[:-1]]
    said = "".join(p["choices"][0]["delta"].get("content", "") for p in parts if p["choices"])
    if said != c["choices"][0]["message"]["content"] or parts[0]["choices"][0]["delta"].get("role") != "assistant":
        fail(f"streamed chat {said!r} vs {c['choices'][0]['message']['content']!r}")
    status, c = call("/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=2))
    content = c["choices"][0]["logprobs"]["content"]
    if status != 200 or len(content) != c["usage"]["completion_tokens"] or len(content[0]["top_logprobs"]) != 2:
        fail(f"chat logprobs: {c}")

    # Bad input: status, OpenAI's error object, the field named.
    ok = {"model": MODEL, "prompt": "a", "max_tokens": 2}
    expect_error("malformed JSON", 400, None, raw=b'{"model": ')
    expect_error("unknown field", 400, "bogus", body=dict(ok, bogus=1))
    expect_error("penalty away from its default", 400, "frequency_penalty", body=dict(ok, frequency_penalty=0.5))
    expect_error("logit_bias", 400, "logit_bias", body=dict(ok, logit_bias={"5": 10}))
    expect_error("negative temperature", 400, "temperature", body=dict(ok, temperature=-1))
    expect_error("top_p 0", 400, "top_p", body=dict(ok, top_p=0))
    expect_error("top_p above 1", 400, "top_p", body=dict(ok, top_p=1.5))
    expect_error("n 2", 400, "n", body=dict(ok, n=2))
    expect_error("wrong model", 404, "model", body=dict(ok, model="gpt-4"))
    expect_error("prompt past the context", 400, "prompt", body=dict(ok, prompt=[5] * 5000))
    expect_error("max_tokens past the context", 400, "max_tokens", body=dict(ok, max_tokens=100000))
    expect_error("token id outside the vocabulary", 400, "prompt", body=dict(ok, prompt=[1, 99999]))
    expect_error("body over the limit", 413, None, raw=b'{"model": "' + b"x" * (2 << 20) + b'"}')
    expect_error("chat message role", 400, "messages", path="/v1/chat/completions",
                 body={"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]})
    expect_error("no such route", 404, None, path="/v1/engines")
    # Defaults of unimplemented fields are accepted (LangChain sends them).
    completion("a", max_tokens=2, frequency_penalty=0, presence_penalty=0, n=1, logit_bias={}, best_of=1, user="x")

    # A client that goes away mid-stream frees its blocks at once.
    body = json.dumps({"model": MODEL, "prompt": "The king", "max_tokens": 200, "stream": True,
                       "temperature": 1.0}).encode()
    host, port = BASE.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    sock.recv(4096)  # the first chunk: the request is running
    sock.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = metric_values()
        if m.get("cleave_running_requests") == 0 and m.get("cleave_kv_blocks_used") == m.get("cleave_kv_blocks_cached"):
            break
        time.sleep(0.05)
    else:
        fail(f"a disconnected stream still holds its blocks: {metric_values()}")
    # A client that gives up on a non-streamed completion (a timeout, Ctrl-C) is let go as well:
    # its request is cancelled (counted 499), not run on to its max_tokens.
    def raw_request(payload):
        body = json.dumps(payload).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " +
                     str(len(body)).encode() + b"\r\n\r\n" + body)
        return sock
    def answered(m):  # completions answered, any status
        return sum(v for k, v in m.items() if k.startswith('cleave_requests_total{endpoint="completions"'))
    before = metric_values()
    budget = 1000
    start = time.time()
    sock = raw_request({"model": MODEL, "prompt": "The king", "max_tokens": budget, "ignore_eos": True,
                        "temperature": 1.0})
    deadline = time.time() + 10
    while metric_values().get("cleave_running_requests", 0) < 1 and time.time() < deadline:
        time.sleep(0.01)
    sock.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = metric_values()
        if answered(m) > answered(before) and m.get("cleave_running_requests") == 0 and \
                m.get("cleave_kv_blocks_used") == m.get("cleave_kv_blocks_cached"):
            break
        time.sleep(0.05)
    else:
        fail(f"a non-streamed request whose client left still holds its blocks: {metric_values()}")
    after = metric_values()
    generated = after["cleave_generation_tokens_total"] - before["cleave_generation_tokens_total"]
    gone = 'cleave_requests_total{endpoint="completions",status="499"}'
    if generated >= budget or after.get(gone, 0) != before.get(gone, 0) + 1:
        fail(f"a non-streamed request whose client left ran on: {generated:.0f} of its {budget} tokens, "
             f"{after.get(gone, 0) - before.get(gone, 0):.0f} more requests counted 499")
    print(f"disconnect: a non-streamed request let go after {generated:.0f} of {budget} tokens, "
          f"{time.time() - start:.2f} s", file=sys.stderr)
    m = metric_values()
    for name in ("cleave_requests_total", "cleave_prompt_tokens_total", "cleave_generation_tokens_total",
                 "cleave_time_to_first_token_seconds_count", "cleave_queue_length"):
        if not any(k.startswith(name) for k in m):
            fail(f"/metrics lacks {name}")
    print("api: completions, streaming, chat, logprobs (the trainer's, bitwise), bad input, disconnect "
          "(streamed and not): ok")


def metric_values():
    status, text = call("/metrics", key=None)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def invariance():
    prompt = [5, 9, 33, 2, 7, 101, 64]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": 11, "logprobs": 1}
    status, alone = call("/v1/completions", body)
    others = [dict(body, prompt=[(7 * i + j) % 200 + 3 for j in range(5 + 11 * i)], seed=i) for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(17) as pool:
        futs = [pool.submit(call, "/v1/completions", b) for b in others[:8]]
        mine = pool.submit(call, "/v1/completions", body)
        futs += [pool.submit(call, "/v1/completions", b) for b in others[8:]]
        status2, among = mine.result()
        if any(f.result()[0] != 200 for f in futs):
            fail("a request among 16 failed")
    a, b = alone["choices"][0], among["choices"][0]
    if status != 200 or status2 != 200 or a["text"] != b["text"] or a["logprobs"]["token_logprobs"] != b["logprobs"]["token_logprobs"]:
        fail(f"alone and among 16 differ:\n{a}\n{b}")
    print("invariance: the same tokens and log-probabilities alone and among 16 others: ok")


def prefix():
    shared = [(13 * i) % 250 + 3 for i in range(1000)]
    def ttft(tail):
        body = {"model": MODEL, "prompt": shared + tail, "max_tokens": 1, "temperature": 0}
        t = time.time()
        status, j = call("/v1/completions", body)
        if status != 200:
            fail(f"prefix request: {status} {j}")
        return time.time() - t
    before = metric_values().get("cleave_prefix_cached_tokens_total", 0)
    cold = ttft([7, 8, 9])
    warm = min(ttft([7, 8, 10 + i]) for i in range(3))
    shared_tokens = metric_values()["cleave_prefix_cached_tokens_total"] - before
    if shared_tokens < 3 * 960:
        fail(f"the shared prefix was computed again: {shared_tokens} tokens taken from cached blocks")
    print(f"prefix: time to first token with a 1,000-token prompt {cold * 1e3:.0f} ms cold, "
          f"{warm * 1e3:.0f} ms sharing its first 960 tokens ({shared_tokens:.0f} tokens not recomputed)")


def queue():
    m = metric_values()
    blocks = int(m["cleave_kv_blocks"])
    # Each request joins with one block (a 50-token prompt) and grows to six (350 tokens): the
    # pool holds a sixth of them at once, so requests queue, and running ones are preempted for
    # the blocks they grow into. ignore_eos: the model's end-of-text token would end them early.
    body = lambda i: {"model": MODEL, "prompt": [(i * 31 + j) % 200 + 3 for j in range(50)],
                      "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    n = blocks
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        first = list(pool.map(lambda i: call("/v1/completions", body(i)), range(n)))
    again = [call("/v1/completions", body(i)) for i in range(4)]
    for i, (status, j) in enumerate(first):
        if status != 200 or j["usage"]["prompt_tokens"] != 50 or j["usage"]["completion_tokens"] != 300:
            fail(f"queued request {i}: {status} {j}")
    for i, (status, j) in enumerate(again):
        if j["choices"][0]["text"] != first[i][1]["choices"][0]["text"]:
            fail(f"request {i} under a full cache differs from alone")
    preempted = metric_values()["cleave_preemptions_total"] - m["cleave_preemptions_total"]
    if preempted < 1:
        fail("no request was preempted: the pool was never short")
    print(f"queue: {n} requests of up to 6 blocks each on a pool of {blocks}: all answered, as alone, "
          f"through {preempted:.0f} preemptions: ok")


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024


def load(pid):
    good = lambda i: {"model": MODEL, "prompt": [(i * 7 + j) % 200 + 3 for j in range(10 + i % 40)],
                      "max_tokens": 8 + i % 9, "temperature": 0.7, "seed": i, "stream": i % 3 == 0}
    bad = [(b'{"model": ', 400), (json.dumps({"model": MODEL, "prompt": "a", "n": 3}).encode(), 400),
           (json.dumps({"model": MODEL, "prompt": "a", "temperature": -2}).encode(), 400),
           (json.dumps({"model": "other", "prompt": "a"}).encode(), 404)]
    def one(i):
        if i % 5 == 4:
            raw, status = bad[i % len(bad)]
            got, j = call("/v1/completions", raw=raw)
            return got == status and "error" in j
        b = good(i)
        if b["stream"]:
            events = stream("/v1/completions", b)
            chunks = [json.loads(e) for e in events[:-1]]
            fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            return events[-1] == "[DONE]" and len(fin) == 1 and whole(fin[0], b)
        got, j = call("/v1/completions", b)
        return got == 200 and whole(j, b)
    def whole(j, b):  # max_tokens made, or fewer ended by the end-of-text token
        made, why = j["usage"]["completion_tokens"], j["choices"][0]["finish_reason"]
        return (why == "length" and made == b["max_tokens"]) or (why == "stop" and made < b["max_tokens"])
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        # The warm-up is the same mix: it brings the server's threads, its allocator's arenas
        # and its products' row counts to their working level.
        if not all(pool.map(one, range(600))):
            fail("warm-up: an answer was incomplete or wrong")
        time.sleep(0.5)
        warm = rss(pid)
        t = time.time()
        results = list(pool.map(one, range(600, 900)))
    elapsed = time.time() - t
    if not all(results):
        fail(f"{results.count(False)} of {len(results)} answers incomplete or wrong")
    time.sleep(0.5)
    after = rss(pid)
    if after > warm * 1.05:
        fail(f"RSS grew from {warm >> 20} MiB after warm-up to {after >> 20} MiB")
    print(f"load: 300 requests from 32 clients (a fifth bad) in {elapsed:.1f} s, all right; "
          f"RSS {warm >> 20} -> {after >> 20} MiB")


def drain(pid):
    # Eight long streams keep the server busy past the signal, sent once all eight are answering
    # (a request that arrives after it gets 503, as it should).
    body = {"model": MODEL, "prompt": "The king", "max_tokens": 1000, "stream": True, "temperature": 1.0,
            "seed": 1, "stop": None}
    started = threading.Semaphore(0)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, "/v1/completions", dict(body, seed=i), on_first=started.release)
                   for i in range(8)]
        for _ in range(8):
            if not started.acquire(timeout=30):
                fail("the eight streams did not all start")
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.05)
        status, j = call("/health", key=None)
        if status != 503:
            fail(f"/health while draining: {status} {j}")
        status, j = call("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2})
        if status != 503:
            fail(f"a new request while draining: {status} {j}")
        for s in streams:
            events = s.result()
            chunks = [json.loads(e) for e in events[:-1]]
            fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            if events[-1] != "[DONE]" or len(fin) != 1 or "usage" not in fin[0]:
                fail(f"a running stream did not finish whole: {events[-3:]}")
    print("drain: SIGTERM lets the running streams finish; new requests and /health get 503: ok")


def answers(path, lanes, tol):
    bodies = [{"model": MODEL, "prompt": [(11 * i + 3 * j) % 200 + 3 for j in range(4 + 9 * i)],
               "max_tokens": 16, "temperature": 0.8, "seed": 100 + i, "logprobs": 1} for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        got = list(pool.map(lambda b: call("/v1/completions", b), bodies))
    for i, (status, j) in enumerate(got):
        if status != 200:
            fail(f"request {i}: {status} {j}")
    mine = [[j["choices"][0]["text"], j["choices"][0]["logprobs"]["token_logprobs"]] for _, j in got]
    worked = {k: v for k, v in metric_values().items() if k.startswith("cleave_lane_tokens_total{")}
    if len(worked) != lanes or min(worked.values()) <= 0:
        fail(f"expected {lanes} lanes, each computing tokens: {worked}")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(mine, f)
        print(f"answers: 12 requests at once on {lanes} lane(s), kept")
        return
    with open(path) as f:
        want = json.load(f)
    for i, (a, b) in enumerate(zip(want, mine)):
        if a[0] != b[0] or any(abs(x - y) > tol for x, y in zip(a[1], b[1])) or (tol == 0 and a != b):
            fail(f"request {i} differs from the other layout's:\n{a}\n{b}")
    said = "equal" if tol == 0 else f"within {tol}"
    print(f"answers: 12 requests at once on {lanes} lanes ({worked}): the same tokens as the other "
          f"layout, log-probabilities {said}: ok")


mode = sys.argv[1]
if mode == "api":
    api(sys.argv[5], sys.argv[6])
elif mode == "invariance":
    invariance()
elif mode == "prefix":
    prefix()
elif mode == "queue":
    queue()
elif mode == "load":
    load(int(sys.argv[5]))
elif mode == "drain":
    drain(int(sys.argv[5]))
elif mode == "answers":
    answers(sys.argv[5], int(sys.argv[6]), float(sys.argv[7]) if len(sys.argv) > 7 else 0.0)
else:
    fail("unknown mode " + mode)
