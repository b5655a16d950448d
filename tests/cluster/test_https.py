"""Issue 32 item 7: a cluster with TLS configured serves its HTTP API, event stream and
dashboard over HTTPS only, with the certificates of its msgpack API (``raftsched certs``).

A plain HTTP request fails; the node's certificate chain verifies with the cluster's CA
(and with no other); the bearer token is still required; Server-Sent Events stream over
TLS; ``http-token --url`` and the dashboard's member links say https. The dashboard
loads in headless Chromium, which accepts exactly the nodes' keys (their SPKI pins: the
chain itself is verified with the CA above) and shows a bounded job's end and ``done``.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftsched.core.durations import format_timestamp
from raftsched.wire.certs import create_ca, create_node
from tests.support.browser import UI_S, headless_chrome, texts
from tests.support.harness import ROOT, Cluster, wait_until
from tests.support.httputil import EventStream, http_cluster, request, tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "https-test-secret-0123456789abcdef"
TOK = tokens(SECRET)
IDS = ("n1", "n2", "n3")


@pytest.fixture(scope="module")
def certs() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="rs-https-certs-") as tmp:
        create_ca(tmp)
        for nid in IDS:
            create_node(tmp, nid)
        create_ca(os.path.join(tmp, "other"), name="someone else's CA")
        yield tmp


@pytest.fixture(scope="module")
def cluster(certs: str) -> Iterator[Cluster]:
    with http_cluster("rs-https-", SECRET, certs_dir=certs) as c:
        yield c


def _ca(certs: str) -> str:
    return os.path.join(certs, "ca.crt")


def _peer_certificate(addr: str, ca: str) -> x509.Certificate:
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_the_api_answers_only_over_tls_with_a_chain_the_ca_verifies(
        cluster: Cluster, certs: str) -> None:
    ca = _ca(certs)
    for nid in IDS:
        addr = cluster.http[nid]
        # Plain HTTP: the handshake fails, no answer (and no token read off the wire).
        with pytest.raises((http.client.HTTPException, OSError)):
            request(addr, "GET", "/api/v1/status", TOK["read"], timeout=10)
        status, doc, _ = request(addr, "GET", "/openapi.json", ca=ca)
        assert status == 200 and doc["openapi"].startswith("3."), doc
        # The chain: the node's own certificate, signed by the cluster's CA, naming the
        # address dialled (create_default_context checked the host name as well).
        cert = _peer_certificate(addr, ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == nid
        with open(ca, "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        assert cert.issuer == ca_cert.subject
        ca_key = ca_cert.public_key()
        assert isinstance(ca_key, ec.EllipticCurvePublicKey)
        ca_key.verify(cert.signature, cert.tbs_certificate_bytes,
                      ec.ECDSA(cert.signature_hash_algorithm))  # raises if not the CA's
        # Another CA does not vouch for it.
        with pytest.raises(ssl.SSLCertVerificationError):
            request(addr, "GET", "/openapi.json", ca=os.path.join(certs, "other", "ca.crt"))

    addr = cluster.http["n2"]
    # The bearer token is still required, and a read-only one still may not write.
    status, body, _ = request(addr, "GET", "/api/v1/status", ca=ca)
    assert status == 401 and body["error"]["code"] == "unauthenticated", body
    status, body, _ = request(addr, "GET", "/api/v1/status", TOK["read"], ca=ca)
    assert status == 200 and body["http_scheme"] == "https", body
    spec = {"schedule": {"every": "1h"}, "command": ["true"]}
    status, body, _ = request(addr, "PUT", "/api/v1/jobs/tls-ro", TOK["read"], spec, ca=ca)
    assert status == 403, body
    status, body, _ = request(addr, "PUT", "/api/v1/jobs/tls-ok", TOK["admin"], spec, ca=ca)
    assert status == 201, body
    status, body, _ = request(addr, "DELETE", "/api/v1/jobs/tls-ok", TOK["admin"], ca=ca)
    assert status == 200, body


def test_events_stream_over_tls_while_a_bounded_job_runs_to_its_end(
        cluster: Cluster, certs: str) -> None:
    ca = _ca(certs)
    addr = cluster.http["n3"]
    stream = EventStream(addr, TOK["read"], ca=ca)
    try:
        assert stream.status == 200
        stream.wait_for(lambda e: e["event"] == "stream.open", 10, "stream.open")
        start = (int(time.time()) + 2) * 1000
        end = start + 2000
        spec = {"schedule": {"every": "1s"}, "command": ["true"],
                "start": format_timestamp(start), "end": format_timestamp(end)}
        status, body, _ = request(addr, "PUT", "/api/v1/jobs/tls-window", TOK["admin"], spec,
                                  ca=ca)
        assert status == 201, body
        ended = stream.wait_for(lambda e: e.get("event") == "run.ended"
                                and e.get("job_id") == "tls-window", 60, "a run of the job")
        assert start <= int(ended["run_id"].rpartition("@")[2]) <= end
    finally:
        stream.close()

    def done() -> bool:
        return bool(request(addr, "GET", "/api/v1/jobs/tls-window", TOK["read"],
                            ca=ca)[1]["done"])

    wait_until(done, 60, "the bounded job done after its end")


def test_http_token_url_names_https(cluster: Cluster, certs: str) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RS_TEST_SECRET=SECRET)
    out = subprocess.run(
        [sys.executable, "-m", "raftsched", "http-token", "--url", "--addr", cluster.api["n1"],
         "--secret-env", "RS_TEST_SECRET", "--tls-ca", _ca(certs)],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"https://{cluster.http['n1']}/#token="), out.stdout


# ------------------------------------------------------------------ the dashboard

def _spki_pin(cert_path: str) -> str:
    """Chromium's pin of a certificate's key: base64 of the SHA-256 of its SPKI."""
    with open(cert_path, "rb") as f:
        key = x509.load_pem_x509_certificate(f.read()).public_key()
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.fixture(scope="module")
def browser(certs: str) -> Iterator[Any]:
    pins = ",".join(_spki_pin(os.path.join(certs, f"{nid}.crt")) for nid in IDS)
    # Not --ignore-certificate-errors: only the nodes' own keys are accepted (a page
    # served with any other certificate is still a privacy error).
    with headless_chrome(extra_args=[f"--ignore-certificate-errors-spki-list={pins}"]) \
            as driver:
        yield driver


def test_the_dashboard_over_https_shows_a_bounded_job_and_done(
        cluster: Cluster, certs: str, browser: Any) -> None:
    ca = _ca(certs)
    addr = cluster.http["n1"]
    end = (int(time.time()) - 60) * 1000
    ended = {"schedule": {"every": "1s"}, "command": ["true"],
             "start": format_timestamp(end - 3_600_000), "end": format_timestamp(end)}
    ahead = dict(ended, start=format_timestamp(end + 86_400_000),
                 end=format_timestamp(end + 2 * 86_400_000))
    for job, spec in (("ui-ended", ended), ("ui-ahead", ahead)):
        status, body, _ = request(addr, "PUT", f"/api/v1/jobs/{job}", TOK["admin"], spec, ca=ca)
        assert status in (200, 201), body

    base = f"https://{addr}/"
    browser.get(base + f"#token={TOK['admin']}")
    assert browser.execute_script("return location.protocol") == "https:"
    wait_until(lambda: texts(browser, "#health") == ["ok"], UI_S, "the overview's health ok")
    wait_until(lambda: texts(browser, '#jobs tr[data-job="ui-ended"] .next') == ["done"],
               UI_S, "the ended job shown done")
    [words] = texts(browser, '#jobs tr[data-job="ui-ended"] .schedule')
    assert words.endswith(f"until {format_timestamp(end)}"), words
    [ahead_words] = texts(browser, '#jobs tr[data-job="ui-ahead"] .schedule')
    assert f"from {ahead['start']}, until {ahead['end']}" in ahead_words, ahead_words
    assert texts(browser, '#jobs tr[data-job="ui-ahead"] .next') != ["done"]
    # The live feed is an event stream over TLS too.
    wait_until(lambda: texts(browser, "#feed-state") == ["live"], UI_S, "the feed live")
    links = browser.execute_script(
        "return [...document.querySelectorAll('#members a')].map(a => a.href)")
    assert links and all(link.startswith("https://") for link in links), links
    browser.get(base + "#/jobs/ui-ended")
    wait_until(lambda: "done" in " ".join(texts(browser, "#job-desc")), UI_S,
               "the job page saying done")
    assert browser.find_element("id", "job-title").get_attribute("data-done") == "yes"
