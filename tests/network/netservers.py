"""Real servers on loopback for the network tests, reached by name through a hosts file.

* an HTTP server answering ``hello <Host> <path>`` and serving a one-package index (PEP 503)
  with a real wheel under ``/simple/``;
* an HTTPS server with a certificate for ``secure.test`` made here (``cryptography``);
* a UDP echo server (what a sandboxed process must not reach).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import io
import socket
import ssl
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NAMES = ("good.test", "bad.test", "ask.test", "secure.test", "pypi.test", "rebind.test")
WHEEL = "tinypkg-1.0-py3-none-any.whl"


def make_wheel() -> bytes:
    files = {
        "tinypkg/__init__.py": b"VALUE = 1\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: execgate-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return out.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    wheel = make_wheel()

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/simple/tinypkg":
            body = f'<html><body><a href="/files/{WHEEL}">{WHEEL}</a></body></html>'.encode()
            kind = "text/html"
        elif self.path == f"/files/{WHEEL}":
            body, kind = self.wheel, "application/octet-stream"
        else:
            body = f"hello {self.headers.get('Host')} {self.path}\n".encode()
            kind = "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` (also its own CA): (cert file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class Servers:
    http_port: int
    https_port: int
    udp_port: int
    hosts_file: Path
    ca_file: Path
    _stop: list[object]

    def close(self) -> None:
        for item in self._stop:
            if isinstance(item, http.server.HTTPServer):
                item.shutdown()
                item.server_close()
            elif isinstance(item, socket.socket):
                item.close()


def _serve(server: http.server.HTTPServer) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


def start_servers(directory: Path) -> Servers:
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    _serve(plain)
    cert, key = make_certificate(directory, "secure.test")
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    _serve(secure)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                data, peer = udp.recvfrom(2048)
                udp.sendto(data, peer)
            except OSError:
                return

    threading.Thread(target=echo, daemon=True).start()
    hosts = directory / "hosts"
    hosts.write_text("# test names\n127.0.0.1 " + " ".join(NAMES) + "\n")
    for path in (directory, hosts, cert):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Servers(
        http_port=plain.server_address[1],
        https_port=secure.server_address[1],
        udp_port=udp.getsockname()[1],
        hosts_file=hosts,
        ca_file=cert,
        _stop=[plain, secure, udp],
    )
