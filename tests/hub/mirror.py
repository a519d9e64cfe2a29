#!/usr/bin/env python3
"""mirror.py — a Hugging Face-compatible mirror for the setup tests (no internet needed).

  mirror.py build ROOT PORT SLOWPORT   build ROOT/www (the hub's URL layout) from models/kimi-mini and a
                                       repo with an unsupported architecture, and ROOT/nginx.conf: nginx
                                       serves it on 127.0.0.1:PORT (Range, X-Linked-Size, ETag = sha256 of
                                       LFS files, the listing API) and throttled on SLOWPORT
  mirror.py proxy PORT UPSTREAM_PORT   a fault proxy in front of nginx: http://127.0.0.1:PORT/MODE/... is
                                       UPSTREAM/... with MODE's fault on .safetensors requests:
                                       ok, drop (the first 3 ranged answers end halfway), e500, e404, auth,
                                       redirect (302 to nginx with X-Linked-Size / X-Linked-Etag, as the hub)
                                       (401 without "Bearer good"), norange (Range ignored: 200 whole file),
                                       corrupt (one byte of model-00001 flipped), corruptsmall (the first
                                       byte of tokenizer_config.json flipped: a git file, checked by blob id)
Repos: test/kimi-mini (listing API), test/kimi-mini-noapi (no listing: the index is the listing),
test/llama (model_type llama: unsupported).
"""
import hashlib, http.client, http.server, json, os, shutil, socketserver, sys, threading

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def git_blob_sha1(path):
    data = open(path, "rb").read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def build(root, port, slow_port):
    www = os.path.join(root, "www")
    shutil.rmtree(www, ignore_errors=True)
    os.makedirs(www)
    locs = []
    repos = {"test/kimi-mini": (os.path.join(SRC, "models", "kimi-mini"), True),
             "test/kimi-mini-noapi": (os.path.join(SRC, "models", "kimi-mini"), False)}
    llama = os.path.join(root, "llama-src")
    os.makedirs(llama, exist_ok=True)
    cfg = json.load(open(os.path.join(SRC, "models", "kimi-mini", "config.json")))
    cfg["model_type"] = "llama"
    cfg["architectures"] = ["LlamaForCausalLM"]
    json.dump(cfg, open(os.path.join(llama, "config.json"), "w"))
    with open(os.path.join(llama, "model.safetensors"), "wb") as f:
        f.write(b"\0" * 4096)
    repos["test/llama"] = (llama, True)
    for extra in filter(None, os.environ.get("DF_MIRROR_EXTRA", "").split(",")):  # REPO=DIR, for benchmarks
        name, d = extra.split("=", 1)
        repos[name] = (d, True)
    for repo, (src, api) in repos.items():
        d = os.path.join(www, repo, "resolve", "main")
        os.makedirs(d)
        siblings = []
        for name in sorted(os.listdir(src)):
            p = os.path.join(src, name)
            os.symlink(p, os.path.join(d, name))
            size = os.path.getsize(p)
            sib = {"rfilename": name, "size": size}
            if name.endswith(".safetensors"):
                h = sha256(p)
                sib["lfs"] = {"sha256": h, "size": size, "pointerSize": 134}
                locs.append('    location = /%s/resolve/main/%s { etag off; add_header X-Linked-Size %d; '
                            'add_header X-Linked-Etag "\\"%s\\""; add_header ETag "\\"%s\\""; }' % (repo, name, size, h, h))
            else:
                sib["blobId"] = git_blob_sha1(p)
                locs.append('    location = /%s/resolve/main/%s { etag off; add_header ETag "\\"%s\\""; }'
                            % (repo, name, sib["blobId"]))
            siblings.append(sib)
        if api:
            a = os.path.join(www, "api", "models", repo)
            os.makedirs(os.path.join(a, "revision"))
            info = {"id": repo, "sha": "0" * 40, "siblings": siblings}
            json.dump(info, open(os.path.join(a, "revision", "main.json"), "w"))
            json.dump({"id": repo}, open(os.path.join(a, "info.json"), "w"))
    user = "user root;\n" if os.geteuid() == 0 else ""
    server = """    root %s;
    default_type application/octet-stream;
    location ~ ^/api/models/([^/]+)/([^/]+)/revision/([^/]+)$ { default_type application/json; try_files /api/models/$1/$2/revision/$3.json =404; }
    location ~ ^/api/models/([^/]+)/([^/]+)$ { default_type application/json; try_files /api/models/$1/$2/info.json =404; }
%s
""" % (www, "\n".join(locs))
    conf = """%sworker_processes 2;
pid %s/nginx.pid;
error_log %s/error.log;
daemon on;
events { worker_connections 256; }
http {
  log_format dl '$server_port $request_method $uri $status $body_bytes_sent';
  access_log %s/access.log dl;
  sendfile on;
  client_body_temp_path %s/tmp; proxy_temp_path %s/tmp; fastcgi_temp_path %s/tmp; uwsgi_temp_path %s/tmp; scgi_temp_path %s/tmp;
  server { listen 127.0.0.1:%d;
%s  }
  server { listen 127.0.0.1:%d; limit_rate 1m;
%s  }
}
""" % (user, root, root, root, root, root, root, root, root, port, server, slow_port, server)
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
    open(os.path.join(root, "nginx.conf"), "w").write(conf)


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = 0
    drops = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def handle_req(self, head):
        parts = self.path.split("/", 2)
        mode, rest = (parts[1], "/" + parts[2]) if len(parts) == 3 else ("ok", self.path)
        weights = ".safetensors" in rest and "index.json" not in rest
        if weights and mode == "e500":
            return self.plain(500, b"internal error\n", head)
        if weights and mode == "e404":
            return self.plain(404, b"Entry not found\n", head)
        if mode == "auth" and self.headers.get("Authorization") != "Bearer good":
            return self.plain(401, b"Invalid credentials\n", head)
        if weights and mode == "redirect":
            # as the hub does for LFS files: 302 to the storage backend, with X-Linked-Size / X-Linked-Etag
            c = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
            c.request("HEAD", rest)
            r = c.getresponse()
            r.read()
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:%d%s" % (self.upstream, rest))
            for k in ("X-Linked-Size", "X-Linked-Etag"):
                if r.getheader(k):
                    self.send_header(k, r.getheader(k))
            self.send_header("ETag", '"0123456789abcdef0123456789abcdef01234567"')  # the pointer file's git id
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            return
        hdrs = {}
        if self.headers.get("Range") and not (mode == "norange" and weights):
            hdrs["Range"] = self.headers["Range"]
        c = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        c.request("HEAD" if head else "GET", rest, headers=hdrs)
        r = c.getresponse()
        body = b"" if head else r.read()
        drop = False
        if weights and not head and mode == "drop" and r.status == 206:
            with Proxy.lock:
                if Proxy.drops < 3:
                    Proxy.drops += 1
                    drop = True
        if weights and not head and mode == "corrupt" and r.status == 206 and "model-00001" in rest:
            a = int(r.getheader("Content-Range").split()[1].split("-")[0])
            off = 4096
            if a <= off < a + len(body):
                b = bytearray(body)
                b[off - a] ^= 0x01
                body = bytes(b)
        if mode == "corruptsmall" and not head and rest.endswith("/tokenizer_config.json") and body:
            body = bytes([body[0] ^ 0x01]) + body[1:]
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "keep-alive", "server", "date"):
                self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        if drop:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)
        self.close_connection = True

    def plain(self, status, body, head):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(body)
        self.close_connection = True

    def do_GET(self):
        self.handle_req(False)

    def do_HEAD(self):
        self.handle_req(True)


def proxy(port, upstream):
    Proxy.upstream = upstream
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    srv.daemon_threads = True
    srv.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "proxy":
        proxy(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(__doc__)
