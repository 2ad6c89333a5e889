"""A real S3-compatible server for the s3:// tests: moto's server on 127.0.0.1 with
authentication on (it checks every request's Signature V4), behind a small HTTP proxy
that can inject faults. Uploads a folder into a bucket, writes the environment a client
needs to ENV_FILE, and serves until killed.

  s3_server.py --dir DATA --bucket NAME --env ENV_FILE --faults FAULTS_JSON

FAULTS_JSON is read at every request. Its keys (each a count of ranged GETs, the object
reads, to affect; the file is rewritten as they are used):
  "status": [N, CODE]   answer the next N object reads with HTTP CODE
  "stall": [N, SECONDS] wait SECONDS before answering the next N object reads
  "drop": N             send the headers and half of the body, then close, N times
Every request is logged to FAULTS_JSON + ".log" (method, path, range, answer).
"""
import argparse, http.client, http.server, json, os, socket, sys, threading, time

import boto3
from moto.server import ThreadedMotoServer


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--faults", required=True)
    a = ap.parse_args()

    moto_port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{moto_port}"

    # Set-up runs before authentication is on: a user with full rights, its key, the
    # bucket and the objects (uploaded with that key).
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="setup", aws_secret_access_key="setup")
    iam.create_user(UserName="tetra")
    iam.put_user_policy(UserName="tetra", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="tetra")["AccessKey"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket=a.bucket)
    for root, _, files in os.walk(a.dir):
        for f in sorted(files):
            path = os.path.join(root, f)
            s3.upload_file(path, a.bucket, os.path.relpath(path, a.dir))
    # From here on every request must carry a valid signature of an existing key.
    http.client.HTTPConnection("127.0.0.1", moto_port).request(
        "POST", "/moto-api/reset-auth", body=b"0")

    lock = threading.Lock()
    if not os.path.exists(a.faults):
        with open(a.faults, "w") as f:
            f.write("{}")
    log = open(a.faults + ".log", "a", buffering=1)

    def take_fault(is_read):
        with lock:
            try:
                with open(a.faults) as f:
                    faults = json.load(f)
            except (OSError, ValueError):
                faults = {}
            got = None
            if is_read:
                for kind in ("status", "stall", "drop"):
                    v = faults.get(kind)
                    n = v[0] if isinstance(v, list) else v
                    if n:
                        got = (kind, v[1] if isinstance(v, list) else None)
                        if isinstance(v, list):
                            v[0] -= 1
                        else:
                            faults[kind] = n - 1
                        break
                with open(a.faults + ".tmp", "w") as f:
                    json.dump(faults, f)
                os.replace(a.faults + ".tmp", a.faults)
            return got

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            rng = self.headers.get("Range")
            fault = take_fault(self.command == "GET" and rng is not None)
            if fault and fault[0] == "stall":
                time.sleep(fault[1])
            if fault and fault[0] == "status":
                msg = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                self.send_response(fault[1])
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                log.write(f"{self.command} {self.path} {rng} -> {fault[1]} (injected)\n")
                return
            conn = http.client.HTTPConnection("127.0.0.1", moto_port, timeout=60)
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():   # as sent: the signature covers them
                conn.putheader(k, v)
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            log.write(f"{self.command} {self.path} {rng} -> {resp.status}"
                      f"{' (dropped)' if fault else ''}\n")
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault and fault[0] == "drop":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    proxy.daemon_threads = True
    with open(a.env + ".tmp", "w") as f:
        f.write(f"export AWS_ENDPOINT_URL=http://127.0.0.1:{proxy.server_address[1]}\n")
        f.write(f"export AWS_ACCESS_KEY_ID={key['AccessKeyId']}\n")
        f.write(f"export AWS_SECRET_ACCESS_KEY={key['SecretAccessKey']}\n")
        f.write("export AWS_REGION=us-east-1\n")
        f.write(f"export MOTO_ENDPOINT={endpoint}\n")
    os.replace(a.env + ".tmp", a.env)
    proxy.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
