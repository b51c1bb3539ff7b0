"""Talk to the keyop agent over its Unix socket with the Python standard library only."""
import http.client
import json
import os
import socket
from urllib.parse import quote, urlencode

DEFAULT_SOCKET = os.environ.get("KEYOP_SOCKET", "./keyop-data/keyop.sock")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX: the host name is only used for the Host header."""

    def __init__(self, path=DEFAULT_SOCKET, timeout=30):
        super().__init__("keyop", timeout=timeout)
        self.socket_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


class KeyopError(Exception):
    """An error answered by the agent: {"error": {"code", "message"}}."""

    def __init__(self, status, code, message):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


def call(conn, method, path, body=None, content_type="application/json"):
    headers = {"Content-Type": content_type} if body is not None else {}
    conn.request(method, path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    parsed = json.loads(data) if data else None
    if resp.status >= 400:
        err = (parsed or {}).get("error", {})
        raise KeyopError(resp.status, err.get("code"), err.get("message"))
    return parsed


def publish(conn, channel, type_, payload, correlation_id=None):
    """Returns {"id", "channel", "seq", "ts"} once the agent has stored the message durably."""
    msg = {"type": type_, "payload": payload}
    if correlation_id:
        msg["correlation_id"] = correlation_id
    return call(conn, "POST", f"/v1/channels/{quote(channel, safe='')}/messages", json.dumps(msg))


def ack(conn, channel, subscriber, seq):
    path = f"/v1/channels/{quote(channel, safe='')}/subscribers/{quote(subscriber, safe='')}/ack"
    return call(conn, "POST", path, json.dumps({"seq": seq}))


def stream(path_socket, channel, subscriber, start="latest", max_inflight=10, queue=False, key=None, ack_wait_ms=None):
    """Yields envelopes (dicts) from the NDJSON stream; ack each one with ack().

    queue=True joins the subscriber's queue group: every stream on the same
    subscriber gets its share, each message is acked by itself, and what this
    stream had not acked when it closed (or within ack_wait_ms) goes to another.
    """
    conn = UnixHTTPConnection(path_socket, timeout=None)
    params = {"subscriber": subscriber, "from": start, "max_inflight": max_inflight}
    if queue:
        params["queue"] = "true"
        if key is not None:
            params["key"] = key
        if ack_wait_ms is not None:
            params["ack_wait_ms"] = ack_wait_ms
    query = urlencode(params)
    conn.request("GET", f"/v1/channels/{quote(channel, safe='')}/stream?{query}")
    resp = conn.getresponse()
    if resp.status != 200:
        err = json.loads(resp.read()).get("error", {})
        raise KeyopError(resp.status, err.get("code"), err.get("message"))
    try:
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.strip()
            if line:  # empty lines are keep-alives
                yield json.loads(line)
    finally:
        conn.close()


def request(conn, channel, type_, payload, timeout_ms=5000, durable=False):
    """Sends a request and returns the reply's envelope; KeyopError no_responders (503) or timeout (504) otherwise."""
    query = urlencode({"timeout_ms": timeout_ms, "durable": "true" if durable else "false"})
    body = json.dumps({"type": type_, "payload": payload})
    return call(conn, "POST", f"/v1/channels/{quote(channel, safe='')}/requests?{query}", body)


def reply(conn, request_msg, type_, payload):
    """Answers a request (an envelope with reply_to): the reply goes to its requester only and is not stored."""
    msg = {"type": type_, "payload": payload, "correlation_id": request_msg["id"]}
    if "correlation_data" in request_msg:  # an MQTT 5 requester's: echoed so it can match the reply
        msg["correlation_data"] = request_msg["correlation_data"]
    return call(conn, "POST", f"/v1/channels/{quote(request_msg['reply_to'], safe='')}/messages", json.dumps(msg))
