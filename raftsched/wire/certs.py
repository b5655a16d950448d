"""Certificates for TLS on the API port: a private CA and node certificates signed by it
(``raftsched certs create-ca`` / ``create-node``, as Nomad and CockroachDB do), and the
``ssl`` contexts built from them.

Keys are ECDSA P-256; private keys are written with mode 0600 and never overwritten.
A node certificate names the hosts clients dial it by (subject alternative names:
IP addresses and DNS names); clients check the name they dialled against it.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftsched.core.errors import ConfigError

CA_CERT, CA_KEY = "ca.crt", "ca.key"
CA_DAYS = 3650
NODE_DAYS = 825  # what browsers still accept; renew with create-node --force
#: Names every node certificate carries unless told otherwise: loopback clients.
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def _write(path: str, data: bytes, mode: int, force: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise ConfigError("certs", f"{path} exists; not overwriting it "
                                   f"(remove it, or --force)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def create_ca(directory: str, *, name: str = "raftsched CA", force: bool = False
              ) -> tuple[str, str]:
    """Write ``ca.crt`` and ``ca.key`` (0600) into ``directory``; their paths."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = os.path.join(directory, CA_KEY), os.path.join(directory, CA_CERT)
    _write(key_path, _key_pem(key), 0o600, force)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
    return cert_path, key_path


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def create_node(directory: str, node_id: str, hosts: list[str] | tuple[str, ...] = (),
                *, force: bool = False) -> tuple[str, str]:
    """Write ``<node_id>.crt`` and ``<node_id>.key`` (0600), signed by the CA in
    ``directory``, valid for ``hosts`` plus loopback; their paths."""
    try:
        with open(os.path.join(directory, CA_KEY), "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), None)
        with open(os.path.join(directory, CA_CERT), "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError) as exc:
        raise ConfigError("certs", f"{directory}: no usable CA ({exc}); run "
                                   f"`raftsched certs create-ca --dir {directory}` first") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError("certs", f"{directory}/{CA_KEY} is not an EC key made by raftsched")
    names = list(dict.fromkeys([*hosts, *DEFAULT_HOSTS]))
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=NODE_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_path = os.path.join(directory, f"{node_id}.key")
    cert_path = os.path.join(directory, f"{node_id}.crt")
    _write(key_path, _key_pem(key), 0o600, force)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
    return cert_path, key_path


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """TLS 1.2+ server context of a node; ConfigError naming the file that is wrong."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise ConfigError("cluster.tls_cert", f"{exc.filename}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("cluster.tls_cert", f"{cert} / {key}: cannot load: {exc}") from None
    return ctx
