"""Images and audio from ``data:`` URIs or ``http(s)`` URLs, fetched safely and decoded with limits.

Safety of URL fetching (SSRF guard), per hop of a redirect chain:

1. only ``http`` / ``https``;
2. the host name is resolved once (``resolver``, injectable) and *every* address it resolves to is
   checked: private, loopback, link-local (cloud metadata 169.254.169.254), multicast, reserved,
   unspecified, shared (CGNAT) and any other non-global range is refused, also when it hides inside an
   IPv6 address (IPv4-mapped ``::ffff:a.b.c.d``, 6to4, Teredo, NAT64); the ``allow`` list opens chosen
   host names or networks;
3. the connection goes to the checked address itself (the URL's host is replaced by the IP; the
   ``Host`` header and the TLS SNI / certificate name stay the original name), so a second DNS answer
   cannot swap the address between check and connect;
4. redirects are not followed by the client: each ``Location`` is checked like a new URL;
5. size (bytes read), pixel count, audio duration and wall-clock time are limited; the content type
   must be an image / audio type. A fetch's time limit covers connect, headers and body together and
   never outlives the request's deadline; ``prefetch`` runs a request's fetches on the event loop, so a
   slow server holds no preparation thread.

Budgets per request (not only per item): decoded pixels and audio seconds, charged from each item's
header before it is decoded; items are decoded, preprocessed and released one at a time.

An image is also bounded by its shape, from its header, before it is decoded: its aspect ratio (at most
:data:`MAX_ASPECT_RATIO`), and the pixels the model's own preprocessing would resize it to (``resized``: a
processor that scales the shortest side to 224 makes a 50000x1 image 224 x 11.2M), within ``max_pixels``.
Audio is bounded by the samples it decodes to (frames × channels, :data:`AUDIO_SAMPLES_PER_SECOND` per second of
``max_audio_seconds``), from its header too.

Every refusal or decode failure is an ``InvalidInput`` (400) naming ``input[i]``. Limits come from
``Settings`` through :meth:`MediaLimits.from_settings`; nothing here reads the environment.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from core.errors import InvalidInput, Timeout, TooLarge, require

#: resolver(host, port) -> the IP addresses (strings) the host name resolves to
Resolver = Callable[[str, int], Sequence[str]]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

IMAGE_TYPES = frozenset({"image/"})
AUDIO_TYPES = frozenset({"audio/", "application/ogg", "application/x-flac"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

#: sample rates a real recording has (telephony to studio); anything else is refused before decoding
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1_000, 384_000
#: the largest up/down factor of a polyphase resampling (44.1 kHz → 48 kHz is 160/147)
MAX_RESAMPLE_FACTOR = 1_000
#: the longest side of an image over its shortest (Qwen2-VL's processor refuses past 200 too): a strip of 86
#: bytes (50000x1) made half a gigabyte of pixels once a processor scaled its one-pixel side up
MAX_ASPECT_RATIO = 200

#: decoded audio samples (frames × channels) per second of the longest clip allowed: stereo at 48 kHz. A silent
#: FLAC of 300 s at 384 kHz weighs 400 KB and decodes to 115M samples (0.5 GB as float32, more downmixed and
#: resampled); every audio model here listens at 48 kHz or less
AUDIO_SAMPLES_PER_SECOND = 96_000

#: (width, height) of an image → (width, height) the model's preprocessing resizes it to
Resized = Callable[[int, int], tuple[int, int]]


def system_resolver(host: str, port: int) -> list[str]:
    """All addresses of ``host`` from the system resolver (one lookup)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 25_000_000
    max_audio_seconds: float = 300.0
    #: budgets of one request across its items (decoded pixels; seconds of audio)
    max_request_pixels: int = 200_000_000
    max_request_audio_seconds: float = 1_200.0
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3
    allow_urls: bool = True
    #: host names (exact, case-insensitive) or networks (CIDR, or a single IP) opened despite the guard
    allow: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Any) -> "MediaLimits":
        return cls(
            max_bytes=settings.media_max_bytes,
            max_pixels=settings.media_max_pixels,
            max_audio_seconds=settings.media_max_audio_seconds,
            max_request_pixels=settings.media_max_request_pixels,
            max_request_audio_seconds=settings.media_max_request_audio_seconds,
            fetch_timeout_s=settings.media_fetch_timeout_s,
            max_redirects=settings.media_max_redirects,
            allow_urls=settings.media_allow_urls,
            allow=tuple(settings.media_allow),
        )


def _where(index: int) -> str:
    return f"input[{index}]"


def _refuse(index: int, message: str) -> InvalidInput:
    return InvalidInput(f"{_where(index)}: {message}", param="input", code="invalid_media")


def blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be fetched from (None: a public address)."""
    embedded: list[IPAddress] = []
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            embedded.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            embedded.append(ip.sixtofour)
        if ip.teredo is not None:
            embedded.extend(ip.teredo)
        if ip in ipaddress.ip_network("64:ff9b::/96"):  # NAT64 well-known prefix
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    for candidate in [*embedded, ip]:  # an embedded IPv4 address names the real target
        for attr, label in (
            ("is_unspecified", "unspecified"),
            ("is_loopback", "loopback"),
            ("is_link_local", "link-local"),
            ("is_multicast", "multicast"),
            ("is_private", "private"),
            ("is_reserved", "reserved"),
        ):
            if getattr(candidate, attr):
                return f"{label} address {candidate}"
        if not candidate.is_global:
            return f"non-public address {candidate}"
    return None


@dataclass
class _AllowList:
    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Sequence[str]) -> "_AllowList":
        hosts, networks = set(), []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                hosts.add(entry.strip().lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def opens(self, host: str, ip: IPAddress) -> bool:
        return host.lower().rstrip(".") in self.hosts or any(ip in net for net in self.networks)


@dataclass
class Fetched:
    data: bytes
    content_type: str


def _type_ok(content_type: str, accepted: frozenset[str]) -> bool:
    ctype = content_type.split(";", 1)[0].strip().lower()
    return any(ctype.startswith(a) if a.endswith("/") else ctype == a for a in accepted)


@dataclass
class MediaFetcher:
    """Loads media references (data URIs, URLs) into bytes and decodes them; one per request is fine."""

    limits: MediaLimits = field(default_factory=MediaLimits)
    resolver: Resolver = system_resolver
    #: an ``httpx`` transport (tests); default: httpx's own connection to the checked address
    transport: Any = None
    #: the request's deadline (``time.monotonic()`` clock): no fetch runs past it
    deadline: float | None = None
    #: TLS verification for https: True (system/certifi CAs) or an ``ssl.SSLContext`` (own CAs, tests)
    verify: Any = True

    def __post_init__(self) -> None:
        self._allow = _AllowList.parse(self.limits.allow)
        self._fetched: dict[int, bytes] = {}  # input index -> body fetched by ``prefetch``
        self._spent: dict[str, float] = {}  # budget → what this request's items used of it so far

    # bytes -------------------------------------------------------------------------------------
    def load(self, ref: Any, *, index: int, accepted: frozenset[str]) -> bytes:
        if not isinstance(ref, str) or not ref:
            raise _refuse(index, "expected a data: URI or an http(s) URL string")
        head = ref[:16].lower()
        if head.startswith("data:"):
            return self._data_uri(ref, index=index, accepted=accepted)
        if head.startswith(("http://", "https://")):
            if not self.limits.allow_urls:
                raise _refuse(index, "fetching URLs is disabled on this server; send a data: URI")
            fetched = self._fetched.pop(index, None)
            if fetched is not None:
                return fetched
            return self.fetch(ref, index=index, accepted=accepted).data
        scheme = ref.split(":", 1)[0][:20] if ":" in ref else ""
        raise _refuse(index, f"unsupported media reference (scheme {scheme!r}); use a data: URI or http(s) URL")

    def _data_uri(self, ref: str, *, index: int, accepted: frozenset[str]) -> bytes:
        meta, sep, payload = ref[5:].partition(",")
        if not sep:
            raise _refuse(index, "malformed data: URI (no ',')")
        parts = [p.strip() for p in meta.split(";")]
        media_type = parts[0].lower() if parts and parts[0] else "text/plain"
        if not _type_ok(media_type, accepted):
            raise _refuse(index, f"data: URI media type {media_type!r} is not accepted here")
        if "base64" not in (p.lower() for p in parts[1:]):
            raise _refuse(index, "data: URI must be base64-encoded (';base64,')")
        if len(payload) > (self.limits.max_bytes + 2) // 3 * 4 + 4:
            raise _refuse(index, f"media exceeds {self.limits.max_bytes} bytes")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _refuse(index, f"data: URI is not valid base64 ({exc})") from None
        if len(data) > self.limits.max_bytes:
            raise _refuse(index, f"media exceeds {self.limits.max_bytes} bytes")
        return data

    def check_host(self, host: str, port: int, *, index: int) -> IPAddress:
        """Resolve ``host`` once; refuse unless every address is public or opened; return the one to use."""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            try:
                answers = list(self.resolver(host, port))
            except (OSError, UnicodeError) as exc:
                raise _refuse(index, f"cannot resolve host {host!r} ({exc})") from None
            try:
                addresses = [ipaddress.ip_address(a) for a in answers]
            except ValueError as exc:
                raise _refuse(index, f"host {host!r} resolved to an invalid address ({exc})") from None
            if not addresses:
                raise _refuse(index, f"host {host!r} has no address")
        for ip in addresses:
            reason = blocked_reason(ip)
            if reason is not None and not self._allow.opens(host, ip):
                raise _refuse(index, f"refused to fetch from {host!r}: it resolves to {reason}, which is blocked")
        return addresses[0]

    def fetch(self, url: str, *, index: int, accepted: frozenset[str]) -> Fetched:
        """Fetch one URL from a thread without an event loop (the blocking form of :meth:`afetch`)."""
        return asyncio.run(self.afetch(url, index=index, accepted=accepted))

    async def prefetch(self, refs: Sequence[Any], *, accepted: frozenset[str]) -> None:
        """Fetch every http(s) reference of a request at once, on the caller's event loop, before the
        request takes a preparation thread: a slow server then holds no thread that others need, and
        each fetch is bounded in wall-clock time (connect, headers and body together) by the fetch
        limit and the request's deadline. :meth:`load` then uses the fetched bytes."""
        urls = [(i, ref) for i, ref in enumerate(refs)
                if isinstance(ref, str) and ref[:8].lower().startswith(("http://", "https://"))]
        if not urls or not self.limits.allow_urls:
            return
        async def one(i: int, url: str) -> None:
            self._fetched[i] = (await self.afetch(url, index=i, accepted=accepted)).data

        tasks = [asyncio.ensure_future(one(i, url)) for i, url in urls]
        try:  # every fetch is bounded in time: wait for all, then report the first input that failed
            await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def afetch(self, url: str, *, index: int, accepted: frozenset[str]) -> Fetched:
        """One URL, redirects re-checked hop by hop; the whole exchange ends by the fetch limit or the
        request's deadline, whichever comes first (a server that sends its headers a byte at a time
        is cut off like one that never answers)."""
        budget = self.limits.fetch_timeout_s
        if self.deadline is not None:
            budget = min(budget, self.deadline - time.monotonic())
        if budget <= 0:
            raise self._too_slow(index)
        httpx = require("httpx", "media")
        try:
            async with asyncio.timeout(budget):
                return await self._afetch(httpx, url, index=index, accepted=accepted)
        except TimeoutError:
            raise self._too_slow(index) from None
        except httpx.TimeoutException:
            raise self._too_slow(index) from None
        except httpx.HTTPError as exc:
            raise _refuse(index, f"could not fetch the URL ({type(exc).__name__}: {exc})") from None

    async def _afetch(self, httpx, url: str, *, index: int, accepted: frozenset[str]) -> Fetched:
        limits = self.limits
        try:
            current = httpx.URL(url)
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise _refuse(index, f"invalid URL ({exc})") from None
        async with httpx.AsyncClient(transport=self.transport, trust_env=False, follow_redirects=False,
                                     verify=self.verify, timeout=None) as client:
            for _hop in range(limits.max_redirects + 1):
                if current.scheme not in ("http", "https"):
                    raise _refuse(index, f"only http and https URLs are fetched, not {current.scheme!r}")
                host = current.raw_host.decode("ascii")
                if not host:
                    raise _refuse(index, "URL has no host")
                port = current.port or (443 if current.scheme == "https" else 80)
                ip = await self._acheck_host(host, port, index=index)
                target = current.copy_with(host=str(ip))
                extensions: dict[str, Any] = {}
                if current.scheme == "https":
                    extensions["sni_hostname"] = host
                headers = {"Host": current.netloc.decode("ascii"), "Accept-Encoding": "identity",
                           "User-Agent": "tessera-media/1"}
                fetched = await self._get(client, target, headers, extensions, index=index, accepted=accepted)
                if isinstance(fetched, Fetched):
                    return fetched
                try:
                    current = current.join(fetched)
                except (httpx.InvalidURL, ValueError) as exc:
                    raise _refuse(index, f"invalid redirect location ({exc})") from None
        raise _refuse(index, f"more than {limits.max_redirects} redirects")

    async def _acheck_host(self, host: str, port: int, *, index: int) -> IPAddress:
        try:
            ipaddress.ip_address(host)
        except ValueError:  # a name: the resolver may block, so it runs off the loop (still under the timeout)
            return await asyncio.to_thread(self.check_host, host, port, index=index)
        return self.check_host(host, port, index=index)

    def _too_slow(self, index: int) -> InvalidInput | Timeout:
        """The fetch limit (the URL's fault: 400) or the request's own deadline (504, like any deadline)."""
        if self.deadline is not None and time.monotonic() >= self.deadline - 0.01:
            return Timeout(f"the request's deadline passed while fetching {_where(index)}")
        return _refuse(index, f"fetching took longer than {self.limits.fetch_timeout_s:g}s")

    async def _get(self, client, target, headers, extensions, *, index: int,
                   accepted: frozenset[str]) -> Fetched | str:
        """One hop: a ``Fetched`` body, or the redirect ``Location`` to check next."""
        limits = self.limits
        request = client.build_request("GET", target, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.status_code in _REDIRECTS:
                location = response.headers.get("location")
                if not location:
                    raise _refuse(index, f"redirect ({response.status_code}) without a Location")
                return location
            if response.status_code != 200:
                raise _refuse(index, f"the URL answered HTTP {response.status_code}")
            ctype = response.headers.get("content-type", "")
            if not _type_ok(ctype, accepted):
                raise _refuse(index, f"the URL's content type {ctype or 'none'!r} is not accepted here")
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                raise _refuse(index, f"media exceeds {limits.max_bytes} bytes ({declared} declared)")
            body = bytearray()
            async for chunk in response.aiter_bytes():  # as the network delivers (a chunk_size would buffer)
                body += chunk
                if len(body) > limits.max_bytes:
                    raise _refuse(index, f"media exceeds {limits.max_bytes} bytes")
            return Fetched(bytes(body), ctype)
        finally:
            await response.aclose()

    # decoding ----------------------------------------------------------------------------------
    def image(self, ref: Any, *, index: int, resized: Resized | None = None):
        """An RGB ``PIL.Image`` (EXIF orientation applied; alpha composed over white). Its pixels count
        toward the request's budget (``max_request_pixels``), checked from the header before decoding, as are
        its aspect ratio and the size ``resized`` (the model's preprocessing) makes of it."""
        self.check_deadline(index)
        data = self.load(ref, index=index, accepted=IMAGE_TYPES)
        return decode_image(data, self.limits, index=index, charge=self._charge_pixels, resized=resized)

    def audio(self, ref: Any, *, index: int, sampling_rate: int) -> np.ndarray:
        """Mono float32 samples at ``sampling_rate``; their duration counts toward the request's budget
        (``max_request_audio_seconds``), checked from the header before decoding."""
        self.check_deadline(index)
        data = self.load(ref, index=index, accepted=AUDIO_TYPES)
        return decode_audio(data, self.limits, index=index, sampling_rate=sampling_rate, charge=self._charge_audio)

    def check_deadline(self, index: int) -> None:
        """Work for a request whose deadline passed stops at the next item."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Timeout(f"the request's deadline passed while preparing {_where(index)}")

    def _charge_pixels(self, pixels: int, index: int) -> None:
        self._charge("pixels", pixels, self.limits.max_request_pixels, index,
                     f"the request's images hold more than {self.limits.max_request_pixels} pixels in all "
                     "(media_max_request_pixels); send fewer or smaller images per request")

    def _charge_audio(self, seconds: float, index: int) -> None:
        self._charge("audio", seconds, self.limits.max_request_audio_seconds, index,
                     f"the request's audio lasts more than {self.limits.max_request_audio_seconds:g}s in all "
                     "(media_max_request_audio_seconds); send fewer or shorter clips per request")

    def _charge(self, budget: str, amount: float, limit: float, index: int, refusal: str) -> None:
        """Add an item's share to one of the request's budgets, or refuse the item (413) past it."""
        spent = self._spent.get(budget, 0) + amount
        if spent > limit:
            raise TooLarge(f"{_where(index)}: {refusal}", param="input", code="media_budget_exceeded")
        self._spent[budget] = spent


def decode_image(data: bytes, limits: MediaLimits, *, index: int, charge: Callable[[int, int], None] | None = None,
                 resized: Resized | None = None):
    Image = require("PIL.Image", "media")
    ImageOps = require("PIL.ImageOps", "media")
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > limits.max_pixels:
            raise _refuse(index, f"image has {width}x{height} pixels; the limit is {limits.max_pixels}")
        check_image_shape(width, height, limits, index=index, resized=resized)
        if charge is not None:
            charge(width * height, index)
        image.load()
        image = ImageOps.exif_transpose(image)
    except Image.DecompressionBombError:
        raise _refuse(index, f"image exceeds the pixel limit {limits.max_pixels}") from None
    except (OSError, SyntaxError, ValueError) as exc:  # PIL's decode errors (UnidentifiedImageError is an OSError)
        raise _refuse(index, f"cannot decode the image ({exc})") from None
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


def check_image_shape(width: int, height: int, limits: MediaLimits, *, index: int,
                      resized: Resized | None = None) -> None:
    """Refuse (400) an image of ``width`` x ``height`` whose aspect ratio passes :data:`MAX_ASPECT_RATIO`, or
    that the model's preprocessing (``resized``) would make larger than ``max_pixels``: from the header,
    before any pixel is decoded or resized."""
    if width <= 0 or height <= 0:
        raise _refuse(index, f"image has {width}x{height} pixels")
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise _refuse(index, f"image is {width}x{height} pixels, an aspect ratio of {ratio:.0f}:1; at most "
                             f"{MAX_ASPECT_RATIO}:1 is accepted")
    if resized is not None:
        new_width, new_height = resized(width, height)
        if new_width * new_height > limits.max_pixels:
            raise _refuse(index, f"image is {width}x{height} pixels, which the model's preprocessing resizes to "
                                 f"{new_width}x{new_height} ({new_width * new_height} pixels); the limit is "
                                 f"{limits.max_pixels}")


def processor_resize(size: Any) -> Resized | None:
    """The (width, height) a transformers image processor's resize makes of an image, from its ``size``
    (a dict or a ``SizeDict``): a fixed ``height`` and ``width``; the shortest edge scaled to ``shortest_edge``
    (the long one capped by ``longest_edge`` when given); the longest edge scaled to ``longest_edge``; or within
    ``max_height`` x ``max_width``. None when ``size`` is none of these (the processor sizes images its own
    way, e.g. a patch budget, bounded by the processor itself)."""
    def value(key: str) -> int | None:
        found = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
        return int(found) if found else None

    if size is None:
        return None
    height, width = value("height"), value("width")
    shortest, longest = value("shortest_edge"), value("longest_edge")
    max_height, max_width = value("max_height"), value("max_width")
    if height and width:
        return lambda w, h: (width, height)
    if shortest:
        def by_shortest(w: int, h: int) -> tuple[int, int]:
            short, long = min(w, h), max(w, h)
            new_short, new_long = shortest, int(shortest * long / short)
            if longest and new_long > longest:
                new_short, new_long = int(longest * new_short / new_long), longest
            return (new_short, new_long) if w <= h else (new_long, new_short)
        return by_shortest
    if longest:
        return lambda w, h: (max(1, round(w * longest / max(w, h))), max(1, round(h * longest / max(w, h))))
    if max_height and max_width:
        return lambda w, h: (max(1, round(w * min(max_height / h, max_width / w))),
                             max(1, round(h * min(max_height / h, max_width / w))))
    return None


def decode_audio(data: bytes, limits: MediaLimits, *, index: int, sampling_rate: int,
                 charge: Callable[[float, int], None] | None = None) -> np.ndarray:
    sf = require("soundfile", "media")
    try:
        info = sf.info(io.BytesIO(data))
        if info.samplerate <= 0 or info.frames <= 0:
            raise _refuse(index, "the audio is empty")
        if not MIN_SAMPLE_RATE <= info.samplerate <= MAX_SAMPLE_RATE:
            raise _refuse(index, f"the audio's sample rate {info.samplerate} Hz is implausible; "
                                 f"accepted: {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
        seconds = info.frames / info.samplerate
        if seconds > limits.max_audio_seconds:
            raise _refuse(index, f"audio lasts {seconds:.1f}s; the limit is {limits.max_audio_seconds:g}s")
        samples = info.frames * max(1, info.channels)
        most = int(limits.max_audio_seconds * AUDIO_SAMPLES_PER_SECOND)
        if samples > most:
            raise _refuse(index, f"audio holds {samples} samples ({info.channels} channels at {info.samplerate} Hz "
                                 f"for {seconds:.1f}s); at most {most} are decoded (stereo at 48 kHz for "
                                 f"{limits.max_audio_seconds:g}s): send it downmixed, at a lower rate or shorter")
        if charge is not None:
            charge(seconds, index)
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise _refuse(index, f"cannot decode the audio ({exc})") from None
    if samples.shape[0] == 0:
        raise _refuse(index, "the audio is empty")
    mono = samples.mean(axis=1).astype(np.float32)
    return resample(mono, rate, sampling_rate)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Polyphase resampling (scipy) when available, else linear interpolation."""
    if rate == target:
        return samples
    try:
        from scipy.signal import resample_poly
    except ImportError:
        n = int(round(samples.shape[0] * target / rate))
        positions = np.arange(n, dtype=np.float64) * rate / target
        return np.interp(positions, np.arange(samples.shape[0]), samples).astype(np.float32)
    from fractions import Fraction

    # polyphase cost grows with the reduced up/down factors (1,000,003 Hz → 48 kHz would need a filter of
    # millions of taps): odd rates use the nearest ratio with small factors (an error under 0.03%)
    ratio = Fraction(target, rate)
    if max(ratio.numerator, ratio.denominator) > MAX_RESAMPLE_FACTOR:
        ratio = ratio.limit_denominator(MAX_RESAMPLE_FACTOR)
    return resample_poly(samples, ratio.numerator, ratio.denominator).astype(np.float32)
