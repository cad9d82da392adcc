#!/usr/bin/env python3
"""Differential harness: the same requests to weft and to a real peer.

Starts weft and the peer (the real Orion, built from ../shared/peers/orion,
the real QuantumLeap, built from ../shared/peers/quantumleap, or a server
given with --peer-url), runs every case of the case
files against both, and compares what each answered: the status, the
headers that matter, and the body, after normalising only what must differ
(dates, generated ids, correlators). Notifications a case asks for are
caught by one local listener per server and compared the same way.

    python3 tests/peers/diff.py orion                  # build what is missing, run, report
    python3 tests/peers/diff.py orion --filter upsert  # only cases whose name matches
    python3 tests/peers/diff.py orion --weft-url http://127.0.0.1:8080 --peer-url http://127.0.0.1:1026
    python3 tests/peers/diff.py quantumleap            # weft's QuantumLeap listener against QuantumLeap
    python3 tests/peers/diff.py quantumleap --prefix /ql   # the same API under /ql of weft's listener

QuantumLeap answers are compared byte for byte (after dates): its JSON is
indented with sorted keys, and weft's QuantumLeap listener answers the same
way. Under `--prefix /ql` (weft's own listener, compact JSON) bodies are
compared as JSON values.

A case file (tests/peers/<peer>/*.json) is a JSON array of cases:

    {"name": "...", "manual": "the manual section it is written from",
     "steps": [
       {"POST": "/v2/entities", "body": {...}},            # JSON body
       {"PUT": "/v2/entities/E/attrs/A/value", "text": "5"},  # text/plain body
       {"GET": "/v2/entities/E", "headers": {"Accept": "text/plain"}},
       {"notifications": 2}   # wait (up to 5 s) for 2 on each, compare, clear
     ]}

Each case runs in a tenant of its own (`Fiware-Service`), unless a step
sets the header itself. `$LISTENER` in a path or body is the URL of the
server's own notification listener; `$ID` is the id of the last resource
a `Location` header named (a subscription or a registration).

Output: one line per case (agree / DIFFER), the differences, and a JSON
report (default target/peers/<peer>-diff.json).
"""

import argparse
import difflib
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import OrderedDict

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADERS_COMPARED = ["content-type", "location", "fiware-total-count", "allow"]
DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, path, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            status, _, _ = request(url, "GET", path, {}, None)
            if status < 500:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}{path} did not answer in {seconds} s")


def request(base, method, path, headers, body):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        headers[":reason"] = resp.reason
        return resp.status, headers, data
    finally:
        conn.close()


class Listener:
    """Records every request sent to it (notifications) and answers 200."""

    def __init__(self):
        self.received = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with outer.lock:
                    outer.received.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_PATCH = do_GET = do_DELETE = _record

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, n, seconds=5):
        deadline = time.time() + seconds
        while time.time() < deadline:
            with self.lock:
                if len(self.received) >= n:
                    break
            time.sleep(0.05)
        time.sleep(0.3)  # more than asked for would show as a difference
        with self.lock:
            got, self.received = self.received, []
        return got


class Target:
    """One server under comparison, with its listener and the ids it made."""

    def __init__(self, name, url, prefix=""):
        self.name = name
        self.url = url
        self.prefix = prefix
        self.listener = Listener()
        self.ids = []

    def substitute(self, text):
        text = text.replace("$LISTENER", self.listener.url)
        if self.ids:
            text = text.replace("$ID", self.ids[-1])
        return text


def parse_json(data):
    try:
        return json.loads(data, object_pairs_hook=OrderedDict)
    except (ValueError, UnicodeDecodeError):
        return None


def normalise(value, target):
    """Dates, the ids the server generated and its listener's URL made alike."""
    if isinstance(value, OrderedDict):
        return OrderedDict((k, normalise(v, target)) for k, v in value.items())
    if isinstance(value, list):
        return [normalise(v, target) for v in value]
    if isinstance(value, str):
        out = value.replace(target.listener.url, "<listener>")
        for i, ident in enumerate(target.ids):
            out = out.replace(ident, f"<id{i}>")
        return DATE.sub("<date>", out)
    return value


def unordered(value):
    if isinstance(value, dict):
        return {k: unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unordered(v) for v in value]
    return value


def compare_bodies(a, b, ta, tb):
    """None when alike; else what differs ("order" when only key order does)."""
    ja, jb = parse_json(a), parse_json(b)
    if BYTE_EXACT:
        na = DATE.sub("<date>", a.decode("utf-8", "replace").replace(ta.url, "<server>"))
        nb = DATE.sub("<date>", b.decode("utf-8", "replace").replace(tb.url, "<server>"))
        if na == nb:
            return None
        if ja is not None and jb is not None and normalise(ja, ta) == normalise(jb, tb):
            return ("format", na, nb)
        return ("body", na, nb)
    if ja is None or jb is None:
        na = DATE.sub("<date>", a.decode("utf-8", "replace").replace(ta.url + ta.prefix, "<server>"))
        nb = DATE.sub("<date>", b.decode("utf-8", "replace").replace(tb.url + tb.prefix, "<server>"))
        return None if na == nb else ("text", na, nb)
    na, nb = normalise(ja, ta), normalise(jb, tb)
    if json.dumps(na) == json.dumps(nb):
        return None
    if unordered(na) == unordered(nb):
        # Under a prefix (weft's own listener, compact JSON) key order is
        # not part of the comparison.
        return None if ta.prefix else ("order", na, nb)
    return ("body", na, nb)


def header_value(name, headers, target):
    v = headers.get(name)
    if v is None:
        return None
    if name == "location":
        v = v.replace(target.url + target.prefix, "<server>")
        for i, ident in enumerate(target.ids):
            v = v.replace(ident, f"<id{i}>")
    if name == "content-type":
        v = v.split(";")[0].strip()
    return v


def run_step(step, targets, tenant):
    method = next((m for m in METHODS if m in step), None)
    if "notifications" in step:
        n = step["notifications"]
        got = [t.listener.take(n) for t in targets]
        # Notifications of different subscriptions come in any order.
        for g, t in zip(got, targets):
            g.sort(key=lambda r: (r["path"], json.dumps(
                normalise(parse_json(r["body"]), t) if parse_json(r["body"]) is not None
                else r["body"].decode("utf-8", "replace"))))
        diffs = []
        if len(got[0]) != len(got[1]):
            diffs.append(("count", [len(g) for g in got]))
        for i, (a, b) in enumerate(zip(got[0], got[1])):
            d = compare_bodies(a["body"], b["body"], targets[0], targets[1])
            if d:
                diffs.append((f"notification {i}",) + d)
            for h in step.get("notification_headers", []):
                va = normalise(a["headers"].get(h), targets[0])
                vb = normalise(b["headers"].get(h), targets[1])
                if va != vb:
                    diffs.append((f"notification {i} header {h}", va, vb))
        return f"notifications {n}", diffs
    path = step[method]
    answers = []
    for t in targets:
        headers = {"Fiware-Service": tenant}
        headers.update(step.get("headers", {}))
        headers = {k: t.substitute(v) for k, v in headers.items() if v is not None}
        body = None
        if "body" in step:
            body = t.substitute(json.dumps(step["body"])).encode()
            headers.setdefault("Content-Type", "application/json")
        elif "text" in step:
            body = t.substitute(step["text"]).encode()
            headers.setdefault("Content-Type", "text/plain")
        elif "raw" in step:
            body = t.substitute(step["raw"]).encode()
        try:
            status, rh, data = request(t.url, method, t.prefix + t.substitute(path), headers, body)
        except OSError as e:
            # No answer is an answer too (Orion closes the connection on
            # some bodies); the next step finds out whether it still runs.
            status, rh, data = 0, {}, f"no answer: {e}".encode()
        loc = rh.get("location", "")
        m = re.search(r"/v2/(?:subscriptions|registrations)/([^/?]+)", loc)
        if m and m.group(1) not in t.ids:
            t.ids.append(m.group(1))
        answers.append((status, rh, data))
    (sa, ha, ba), (sb, hb, bb) = answers
    diffs = []
    if sa != sb:
        diffs.append(("status", sa, sb))
    elif BYTE_EXACT and ha.get(":reason") != hb.get(":reason"):
        diffs.append(("reason", ha.get(":reason"), hb.get(":reason")))
    for h in HEADERS_COMPARED:
        va, vb = header_value(h, ha, targets[0]), header_value(h, hb, targets[1])
        if va != vb:
            diffs.append((f"header {h}", va, vb))
    d = compare_bodies(ba, bb, targets[0], targets[1])
    if d:
        diffs.append(d)
    return f"{method} {path}", diffs


RUN = "%04x" % (os.getpid() % 65536)

# Bodies compared as text, not as JSON values (QuantumLeap's own listener).
BYTE_EXACT = False


def run_case(n, case, targets):
    tenant = f"diff{RUN}_{n}"
    for t in targets:
        t.ids = []
        t.listener.take(0, 0)
    out = []
    for i, step in enumerate(case["steps"]):
        label, diffs = run_step(step, targets, tenant)
        if diffs:
            out.append({"step": i + 1, "request": label, "differences": diffs})
    return out


def start_weft(args, tmp):
    """weft, built and started; the URL of the listener under comparison."""
    if args.weft_url:
        return None, args.weft_url
    subprocess.run(["cargo", "build", "--locked", "-p", "weft"], cwd=ROOT, check=True)
    port = free_port()
    env = dict(os.environ, WEFT_AUTH="off", WEFT_NGSI__MULTISERVICE="true",
               WEFT_NOTIFICATIONS__ID_HEADER="false")
    ql_port = free_port()
    env["WEFT_HISTORY__QUANTUMLEAP_LISTEN"] = f"127.0.0.1:{ql_port}"
    log = open(os.path.join(tmp, "weft.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(ROOT, "target", "debug", "weft"), "serve",
         "--listen", f"127.0.0.1:{port}", "--data", os.path.join(tmp, "weft-data")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(url, "/version")
    if args.peer == "quantumleap" and not args.prefix:
        url = f"http://127.0.0.1:{ql_port}"
    return proc, url


class Orion:
    """The real Orion, started (and restarted after a crash) by its run.sh."""

    def __init__(self, args):
        self.peers = os.path.abspath(os.path.join(ROOT, args.peers, "orion"))
        self.out = os.path.join(ROOT, "target", "peers", "orion")
        if not os.path.exists(os.path.join(self.out, "bin", "contextBroker")):
            subprocess.run([os.path.join(self.peers, "build.sh"), self.out], cwd=ROOT, check=True)
        self.env = dict(os.environ, OUT=self.out, ORION_ARGS="-multiservice")
        self.url = None
        self.restarts = 0
        self.start()

    def start(self):
        # A broker that died leaves its pid file, and a new one refuses to start.
        stale = os.path.join(self.out, "run", "logs", "contextBroker.pid")
        if os.path.exists(stale):
            os.remove(stale)
        port, db, pg = free_port(), free_port(), 54300 + os.getpid() % 90
        subprocess.run([os.path.join(self.peers, "run.sh"), "start", str(port), str(db), str(pg)],
                       cwd=ROOT, env=self.env, check=True)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        subprocess.run([os.path.join(self.peers, "run.sh"), "stop"], cwd=ROOT, env=self.env)

    def restart(self):
        self.restarts += 1
        self.stop()
        self.start()


class QuantumLeap:
    """The real QuantumLeap 1.0.0 on TimescaleDB, started by its run.sh."""

    def __init__(self, args):
        self.peers = os.path.abspath(os.path.join(ROOT, args.peers, "quantumleap"))
        self.out = os.path.join(ROOT, "target", "peers", "quantumleap")
        if not os.path.exists(os.path.join(self.out, "venv")):
            subprocess.run([os.path.join(self.peers, "build.sh"), self.out], cwd=ROOT, check=True)
        self.env = dict(os.environ, OUT=self.out, RUN_DIR=os.path.join(self.out, "run-diff"))
        port, pg, redis = free_port(), 54300 + (os.getpid() + 45) % 90, free_port()
        subprocess.run([os.path.join(self.peers, "run.sh"), "start", str(port), str(pg), str(redis)],
                       cwd=ROOT, env=self.env, check=True)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        subprocess.run([os.path.join(self.peers, "run.sh"), "stop"], cwd=ROOT, env=self.env)


def describe(what, targets):
    """One difference, readable: multi-line texts as a unified diff."""
    kind, rest = what[0], what[1:]
    if len(rest) == 2 and all(isinstance(x, str) and "\n" in x for x in rest):
        lines = difflib.unified_diff(rest[0].splitlines(), rest[1].splitlines(),
                                     targets[0].name, targets[1].name, lineterm="", n=1)
        return kind + "\n        " + "\n        ".join(list(lines)[2:])[:2000]
    return " | ".join(json.dumps(x) if not isinstance(x, str) else x for x in what)[:600]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("peer", choices=["orion", "quantumleap"])
    p.add_argument("--prefix", default="", help="prefix of weft's paths (/ql: QuantumLeap's API on weft's own listener)")
    p.add_argument("--cases", help="a case file or a folder of them (default tests/peers/<peer>)")
    p.add_argument("--filter", help="only cases whose name matches this regex")
    p.add_argument("--weft-url", help="a running weft (auth off, multiservice on) instead of one started here")
    p.add_argument("--peer-url", help="a running peer instead of one started here")
    p.add_argument("--peers", default="../shared/peers", help="where the peers' build scripts are")
    p.add_argument("--report", help="JSON report (default target/peers/<peer>-diff.json)")
    p.add_argument("--min-agree", type=int, default=0,
                   help="exit 1 when fewer cases agree (a floor for CI)")
    args = p.parse_args()

    cases_path = args.cases or os.path.join(ROOT, "tests", "peers", args.peer)
    files = sorted(
        os.path.join(cases_path, f) for f in os.listdir(cases_path) if f.endswith(".json")
    ) if os.path.isdir(cases_path) else [cases_path]
    cases = []
    for f in files:
        for c in json.load(open(f), object_pairs_hook=OrderedDict):
            c["file"] = os.path.relpath(f, ROOT)
            cases.append(c)
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c["name"])]

    global BYTE_EXACT
    BYTE_EXACT = args.peer == "quantumleap" and not args.prefix
    tmp = tempfile.mkdtemp(prefix="peer-diff-")
    weft, weft_url = start_weft(args, tmp)
    peer = None if args.peer_url else (Orion if args.peer == "orion" else QuantumLeap)(args)
    targets = [Target("weft", weft_url, args.prefix), Target(args.peer, args.peer_url or peer.url)]
    results = []
    try:
        for n, case in enumerate(cases, 1):
            diffs = run_case(n, case, targets)
            if isinstance(peer, Orion) and any("no answer" in json.dumps(d) for d in diffs):
                # It died on something this case sent: the next case
                # gets a fresh one (its data are gone with it).
                peer.restart()
                targets[1].url = peer.url
            results.append({"name": case["name"], "file": case["file"],
                            "manual": case.get("manual"), "agree": not diffs,
                            "differences": diffs})
            print(("agree   " if not diffs else "DIFFER  ") + case["name"])
            for d in diffs:
                print(f"    step {d['step']} {d['request']}")
                for what in d["differences"]:
                    print("      " + describe(what, targets))
    finally:
        if weft:
            os.killpg(weft.pid, signal.SIGTERM)
            weft.wait()
        if peer:
            peer.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    agree = sum(r["agree"] for r in results)
    print(f"\n{agree} of {len(results)} cases agree between weft and {args.peer}")
    report = args.report or os.path.join(ROOT, "target", "peers", f"{args.peer}-diff.json")
    os.makedirs(os.path.dirname(report), exist_ok=True)
    with open(report, "w") as f:
        json.dump({"peer": args.peer, "cases": len(results), "agree": agree,
                   "results": results}, f, indent=2)
    if agree < args.min_agree:
        print(f"fewer than {args.min_agree} cases agree")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
