"""core.media: the SSRF guard (stub resolver + a transport that records every connection attempt, so
nothing leaves the process), limits and decoding, and real fetches from a loopback server."""

from __future__ import annotations

import io
import ssl
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from core.errors import InvalidInput, Timeout
from core.media import MediaFetcher, MediaLimits, blocked_reason
from tests.multimodal.media_support import MediaServer, Route, audio_bytes, data_uri, png, sine

PNG = png()


class Recorder:
    """An httpx transport that records each request it is asked to send and answers from a table."""

    def __init__(self, answers: dict[str, httpx.Response] | None = None):
        self.requests: list[httpx.Request] = []
        self.answers = answers or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answers.get(request.url.path, httpx.Response(200, headers={"content-type": "image/png"},
                                                                 content=PNG))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


class StubDNS:
    def __init__(self, table: dict[str, list[str]]):
        self.table = table
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"stub DNS: no such host {host}")
        return self.table[host]


BLOCKED = {
    "metadata.test": (["169.254.169.254"], "link-local"),
    "ten.test": (["10.0.0.1"], "private"),
    "v6loop.test": (["::1"], "loopback"),
    "mapped.test": (["::ffff:127.0.0.1"], "loopback"),
    "mapped-meta.test": (["::ffff:169.254.169.254"], "link-local"),
    "mcast.test": (["224.0.0.1"], "multicast"),
    "reserved.test": (["240.0.0.1"], "reserved"),
    "zero.test": (["0.0.0.0"], "unspecified"),
    "cgnat.test": (["100.64.0.1"], "non-public"),
    "ula.test": (["fd00::1"], "private"),
    "v6link.test": (["fe80::1"], "link-local"),
    "sixtofour.test": (["2002:a00:1::"], "private"),  # 6to4 wrapping 10.0.0.1
    "mixed.test": (["93.184.216.34", "10.0.0.7"], "private"),  # one bad answer is enough
}


def _fetcher(dns: StubDNS, recorder: Recorder, **limits) -> MediaFetcher:
    return MediaFetcher(MediaLimits(**limits), resolver=dns, transport=recorder.transport())


@pytest.mark.parametrize("host", sorted(BLOCKED))
def test_blocked_address_classes_are_refused_before_connecting(host):
    addresses, label = BLOCKED[host]
    dns, recorder = StubDNS({h: a for h, (a, _) in BLOCKED.items()}), Recorder()
    with pytest.raises(InvalidInput) as err:
        _fetcher(dns, recorder).image(f"http://{host}/latest/meta-data/", index=2)
    assert err.value.status == 400
    assert err.value.message.startswith("input[2]: ")
    assert label in err.value.message
    assert dns.asked == [host]
    assert recorder.requests == []  # no connection was attempted


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:8080/x.png",
    "http://[::1]/x.png",
    "http://[::ffff:a9fe:a9fe]/x.png",
    "https://10.1.2.3/x.png",
    "http://0.0.0.0/x.png",
])
def test_ip_literals_are_checked_without_dns(url):
    dns, recorder = StubDNS({}), Recorder()
    with pytest.raises(InvalidInput, match=r"input\[0\]: refused"):
        _fetcher(dns, recorder).image(url, index=0)
    assert dns.asked == [] and recorder.requests == []


def test_public_address_connects_to_the_checked_ip_with_the_original_host_and_sni():
    dns, recorder = StubDNS({"images.example": ["93.184.216.34"]}), Recorder()
    image = _fetcher(dns, recorder).image("https://images.example:8443/a.png?x=1", index=0)
    assert image.size == (40, 30)
    (request,) = recorder.requests
    assert request.url.host == "93.184.216.34" and request.url.port == 8443
    assert request.url.path == "/a.png" and request.url.query == b"x=1"
    assert request.headers["host"] == "images.example:8443"
    assert request.extensions["sni_hostname"] == "images.example"
    assert dns.asked == ["images.example"]  # resolved once


def test_every_redirect_hop_is_rechecked():
    dns = StubDNS({"cdn.example": ["93.184.216.34"], "metadata.test": ["169.254.169.254"]})
    recorder = Recorder({"/a.png": httpx.Response(302, headers={"location": "http://metadata.test/latest/"})})
    with pytest.raises(InvalidInput, match=r"input\[1\]: .*link-local"):
        _fetcher(dns, recorder).image("http://cdn.example/a.png", index=1)
    assert [r.url.path for r in recorder.requests] == ["/a.png"]  # the second hop never connected
    assert dns.asked == ["cdn.example", "metadata.test"]


def test_redirect_to_another_scheme_and_redirect_loops_are_refused():
    dns = StubDNS({"cdn.example": ["93.184.216.34"]})
    recorder = Recorder({"/a": httpx.Response(301, headers={"location": "file:///etc/passwd"})})
    with pytest.raises(InvalidInput, match="only http and https"):
        _fetcher(dns, recorder).image("http://cdn.example/a", index=0)
    recorder = Recorder({"/loop": httpx.Response(302, headers={"location": "/loop"})})
    with pytest.raises(InvalidInput, match="more than 2 redirects"):
        _fetcher(dns, recorder, max_redirects=2).image("http://cdn.example/loop", index=0)
    assert len(recorder.requests) == 3


def test_allow_list_opens_chosen_networks_and_hosts_only():
    dns = StubDNS({"intranet.test": ["10.0.0.5"], "other.test": ["10.0.0.6"], "named.test": ["192.168.1.9"]})
    recorder = Recorder()
    fetcher = _fetcher(dns, recorder, allow=("10.0.0.5/32", "named.test"))
    fetcher.image("http://intranet.test/a.png", index=0)
    fetcher.image("http://named.test/a.png", index=0)
    assert [r.url.host for r in recorder.requests] == ["10.0.0.5", "192.168.1.9"]
    with pytest.raises(InvalidInput, match="private"):
        fetcher.image("http://other.test/a.png", index=0)
    assert len(recorder.requests) == 2


@pytest.mark.parametrize("ref, message", [
    ("file:///etc/passwd", "unsupported media reference"),
    ("ftp://example.com/a.png", "unsupported media reference"),
    ("gopher://example.com/", "unsupported media reference"),
    ("just text", "unsupported media reference"),
    ("data:image/png,notbase64", "base64"),
    ("data:image/png;base64,!!!!", "not valid base64"),
    ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain'"),
    ("data:image/png;base64,aGVsbG8=", "cannot decode the image"),
    (data_uri(PNG[: len(PNG) // 2], "image/png"), "cannot decode the image"),
])
def test_bad_references_are_400_naming_the_index(ref, message):
    recorder = Recorder()
    with pytest.raises(InvalidInput) as err:
        _fetcher(StubDNS({}), recorder).image(ref, index=4)
    assert err.value.status == 400 and err.value.message.startswith("input[4]: ")
    assert message in err.value.message
    assert recorder.requests == []


def test_urls_can_be_switched_off():
    with pytest.raises(InvalidInput, match="disabled"):
        _fetcher(StubDNS({"a.example": ["93.184.216.34"]}), Recorder(), allow_urls=False).image(
            "http://a.example/x.png", index=0)


def test_size_and_pixel_limits():
    big = png((300, 200))
    fetcher = MediaFetcher(MediaLimits(max_bytes=len(big) - 1))
    with pytest.raises(InvalidInput, match=r"input\[0\]: media exceeds"):
        fetcher.image(data_uri(big, "image/png"), index=0)
    with pytest.raises(InvalidInput, match=r"300x200 pixels"):
        MediaFetcher(MediaLimits(max_pixels=300 * 200 - 1)).image(data_uri(big, "image/png"), index=0)
    assert MediaFetcher(MediaLimits(max_pixels=300 * 200)).image(data_uri(big, "image/png"), index=0).size == (300, 200)


def test_image_modes_and_exif_orientation():
    fetcher = MediaFetcher()
    rgba = fetcher.image(data_uri(png((20, 20), (0, 0, 0, 0), mode="RGBA"), "image/png"), index=0)
    assert rgba.mode == "RGB" and rgba.getpixel((0, 0)) == (255, 255, 255)  # transparent → white
    assert rgba.getpixel((10, 10)) == (0, 0, 255)
    gray = fetcher.image(data_uri(png((20, 10), mode="L"), "image/png"), index=0)
    assert gray.mode == "RGB" and gray.size == (20, 10)
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    buf = io.BytesIO()
    image.save(buf, "JPEG", exif=exif.tobytes())
    upright = fetcher.image(data_uri(buf.getvalue(), "image/jpeg"), index=0)
    assert upright.size == (20, 40)


@pytest.mark.parametrize("fmt, mime, subtype", [("WAV", "audio/wav", "FLOAT"), ("FLAC", "audio/flac", None),
                                                 ("OGG", "audio/ogg", None)])
def test_audio_formats_stereo_and_resampling(fmt, mime, subtype):
    stereo = sine(440.0, 0.5, rate=48000, channels=2)
    samples = MediaFetcher().audio(data_uri(audio_bytes(stereo, 48000, fmt, subtype), mime), index=0,
                                   sampling_rate=16000)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.shape[0] - 8000) <= 1
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 16000 / samples.shape[0] - 440.0) < 5.0


def test_audio_limits_and_garbage():
    wav = audio_bytes(sine(440.0, 2.0), 16000)
    with pytest.raises(InvalidInput, match=r"input\[3\]: audio lasts 2.0s"):
        MediaFetcher(MediaLimits(max_audio_seconds=1.5)).audio(data_uri(wav, "audio/wav"), index=3, sampling_rate=16000)
    with pytest.raises(InvalidInput, match=r"input\[0\]: cannot decode the audio"):
        MediaFetcher().audio(data_uri(b"RIFF....WAVEjunk", "audio/wav"), index=0, sampling_rate=16000)
    with pytest.raises(InvalidInput, match="media type 'image/png'"):
        MediaFetcher().audio(data_uri(PNG, "image/png"), index=0, sampling_rate=16000)


def test_blocked_reason_table():
    import ipaddress

    assert blocked_reason(ipaddress.ip_address("93.184.216.34")) is None
    assert blocked_reason(ipaddress.ip_address("2606:4700::1111")) is None
    assert "link-local" in blocked_reason(ipaddress.ip_address("169.254.169.254"))
    assert "loopback" in blocked_reason(ipaddress.ip_address("64:ff9b::7f00:1"))  # NAT64 of 127.0.0.1


# real fetches from the loopback server (opened by the allow-list) ------------------------------------


def _loopback(**limits) -> MediaFetcher:
    return MediaFetcher(MediaLimits(allow=("127.0.0.1/32",), **limits))


def test_loopback_is_refused_without_the_allow_list(media_server):
    url = media_server.add("/guarded.png", Route(PNG, "image/png"))
    before = len(media_server.requests)
    with pytest.raises(InvalidInput, match="loopback"):
        MediaFetcher().image(url, index=0)
    assert len(media_server.requests) == before


def test_loopback_fetch_and_redirect(media_server):
    url = media_server.add("/ok.png", Route(PNG, "image/png"))
    media_server.add("/moved", Route(b"", "text/plain", 302, {"Location": "/ok.png"}))
    assert _loopback().image(url, index=0).size == (40, 30)
    assert _loopback().image(media_server.base + "/moved", index=0).size == (40, 30)
    wav_url = media_server.add("/tone.wav", Route(audio_bytes(sine(440, 0.25)), "audio/wav"))
    assert _loopback().audio(wav_url, index=0, sampling_rate=16000).shape == (4000,)


@pytest.mark.parametrize("route, message", [
    (Route(b"<html>", "text/html"), "content type 'text/html'"),
    (Route(PNG, "audio/wav"), "content type 'audio/wav'"),
    (Route(b"x" * 5000, "image/png"), "exceeds 4096 bytes (5000 declared)"),
    (Route(b"x" * 5000, "image/png", chunked=True), "exceeds 4096 bytes"),
    (Route(b"gone", "text/plain", 404), "HTTP 404"),
    (Route(b"not a png at all", "image/png"), "cannot decode the image"),
    (Route(PNG[: len(PNG) - 60], "image/png"), "cannot decode the image"),  # truncated pixel data
])
def test_loopback_bad_answers(media_server, route, message):
    url = media_server.add(f"/bad-{abs(hash(message))}", route)
    with pytest.raises(InvalidInput) as err:
        _loopback(max_bytes=4096).image(url, index=5)
    assert err.value.message.startswith("input[5]: ") and message in err.value.message


@pytest.mark.parametrize("route", [Route(PNG, "image/png", delay_s=3.0), Route(PNG, "image/png", dribble_s=0.05)])
def test_slow_servers_hit_the_time_limit(media_server, route):
    url = media_server.add(f"/slow-{route.delay_s}-{route.dribble_s}", route)
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=r"input\[0\]: fetching took longer than 0.5s"):
        _loopback(fetch_timeout_s=0.5).image(url, index=0)
    assert time.monotonic() - started < 1.5


def test_the_request_deadline_bounds_every_fetch(media_server):
    url = media_server.add("/slow-deadline.png", Route(PNG, "image/png", delay_s=3.0))
    fetcher = MediaFetcher(MediaLimits(allow=("127.0.0.1/32",), fetch_timeout_s=10.0), deadline=time.monotonic() + 0.5)
    started = time.monotonic()
    with pytest.raises(Timeout, match=r"the request's deadline passed while fetching input\[1\]"):
        fetcher.image(url, index=1)
    assert time.monotonic() - started < 1.5
    with pytest.raises(Timeout, match=r"the request's deadline passed while (fetching|preparing) input\[2\]"):
        fetcher.image(url, index=2)  # later items find the deadline already spent


TLS = Path(__file__).parent / "tls"


def test_https_connects_to_the_checked_ip_and_verifies_the_original_name():
    """TLS to 127.0.0.1 while SNI and the certificate check use the URL's host name."""
    server = MediaServer(tls=(str(TLS / "images.test.pem"), str(TLS / "images.test.key")))
    server.add("/a.png", Route(PNG, "image/png"))
    context = ssl.create_default_context(cafile=str(TLS / "images.test.pem"))
    dns = StubDNS({"images.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    fetcher = MediaFetcher(MediaLimits(allow=("127.0.0.1/32",)), resolver=dns, verify=context)
    with server.running():
        assert fetcher.image(f"https://images.test:{server.port}/a.png", index=0).size == (40, 30)
        assert server.requests == [("/a.png", f"images.test:{server.port}")]
        with pytest.raises(InvalidInput, match=r"input\[0\]: could not fetch the URL .*certificate"):
            fetcher.image(f"https://other.test:{server.port}/a.png", index=0)
    assert server.sni == ["images.test", "other.test"]
    assert len(server.requests) == 1  # the mismatching name never got a request through
