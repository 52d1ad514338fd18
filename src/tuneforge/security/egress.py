"""The egress policy: where the platform may connect on a tenant's behalf.

Every URL a tenant supplies (webhook endpoints, eval endpoints) passes this policy
twice. At input, `EgressPolicy.check_url` refuses anything but a public http(s)
address with a 400 that names the field. At connect time, the clients made by
`EgressPolicy.client` / `async_client` resolve the host themselves, check every
address again and connect to the checked one, so a DNS answer that changed in
between (DNS rebinding) cannot point a request at the platform's own network.

Public means: not loopback, private (RFC 1918, CGNAT 100.64/10, ULA fc00::/7),
link-local (169.254/16 with the cloud metadata address, fe80::/10), multicast,
unspecified, broadcast or reserved, and no IPv6 form that carries such an IPv4
address (IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96, 6to4). Host names are
read the way the C resolver reads them (inet_aton: `2130706433`, `0177.0.0.1`,
`0x7f.1`, `127.1` are all 127.0.0.1), because that is what the connecting library
hands them to.

The operator widens the policy with TUNEFORGE_EGRESS_ALLOW, a comma-separated
list: an IP address or CIDR permits the addresses inside it; a host name permits
exactly that host, whatever it resolves to.

    policy = EgressPolicy.from_settings(settings)
    url = policy.check_url(body.url, param="url")          # ApiError 400 when refused
    with policy.client(timeout=10.0) as client:            # EgressDenied when refused
        client.post(url, json=payload)

The clients never read proxy variables from the environment and never follow
redirects by default; callers treat a 3xx as a failure.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpcore
import httpx

from tuneforge.domain.errors import ApiError, invalid
from tuneforge.security.tls import verify_option

__all__ = ["EgressDenied", "EgressPolicy", "Resolver", "system_resolver"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# host name -> its addresses as text; raises OSError when the name does not resolve
Resolver = Callable[[str], Iterable[str]]

MAX_URL_CHARS = 2048
RESOLVE_TIMEOUT_S = 3.0
SETTING = "TUNEFORGE_EGRESS_ALLOW"
NOT_ALLOWED = "url_not_allowed"
MALFORMED = "invalid_url"

_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the last 32 bits are an IPv4 address
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: a site's own translators
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")
_HOST_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_REFUSED_CLIENT_OPTIONS = frozenset({"transport", "mounts", "proxy", "trust_env", "follow_redirects", "app"})


class EgressDenied(httpx.ConnectError):
    """A connection the egress policy refused; `reason` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"address not allowed: {reason}")
        self.reason = reason


# ---- reading hosts the way the resolver does ------------------------------------

def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address inet_aton(3) reads in `text`: 1 to 4 dot-separated parts, each
    decimal, octal (leading 0) or hex (0x); the last part fills the remaining bytes."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        if part[:2] in ("0x", "0X"):
            digits, base, alphabet = part[2:], 16, "0123456789abcdefABCDEF"
        elif len(part) > 1 and part[0] == "0":
            digits, base, alphabet = part[1:], 8, "01234567"
        else:
            digits, base, alphabet = part, 10, "0123456789"
        if not digits or any(char not in alphabet for char in digits):
            return None
        values.append(int(digits, base))
    *head, last = values
    if any(value > 255 for value in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for value in head:
        number = number * 256 + value
    return ipaddress.IPv4Address(number * 256 ** (4 - len(head)) + last)


def _literal(host: str) -> IPAddress | None:
    """The address `host` spells, if it is an address at all (IPv6 without brackets)."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return _inet_aton(host)


def _looks_numeric(host: str) -> bool:
    """A name whose last label is a number: the resolver would never look it up in DNS."""
    return _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]) is not None


def _canonical(host: str) -> str:
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.removesuffix(".")


def _is_localhost(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def _non_public(ip: IPAddress) -> str | None:
    """Why `ip` is not a public address ("a loopback address"…), or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = None
        if ip.ipv4_mapped is not None:
            embedded = ip.ipv4_mapped
        elif ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip.sixtofour is not None:
            embedded = ip.sixtofour
        if embedded is not None:
            return _non_public(embedded)
        if ip in _NAT64_LOCAL:
            return "a NAT64 address"
        if ip.teredo is not None:
            return "a Teredo tunnel address"
        if ip in _IPV4_COMPATIBLE and not (ip.is_unspecified or ip.is_loopback):
            return "an IPv4-compatible address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address):
        if ip in _SHARED:
            return "a shared (carrier-grade NAT) address"
        if ip == _BROADCAST:
            return "a broadcast address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"
    if not ip.is_global:
        return "a non-public address"
    return None


# ---- resolving -------------------------------------------------------------------

def system_resolver(timeout_s: float = RESOLVE_TIMEOUT_S) -> Resolver:
    """The host's resolver (getaddrinfo), given at most `timeout_s`: a lookup that takes
    longer raises TimeoutError (its thread is left to finish on its own)."""

    def resolve(host: str) -> list[str]:
        found: list[str] = []
        failure: list[OSError] = []
        done = threading.Event()

        def lookup() -> None:
            try:
                for *_, sockaddr in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM):
                    found.append(str(sockaddr[0]))
            except OSError as exc:
                failure.append(exc)
            except Exception as exc:  # noqa: BLE001 - e.g. UnicodeError for a bad name: it does not resolve
                failure.append(OSError(str(exc)))
            finally:
                done.set()

        threading.Thread(target=lookup, name="tuneforge-egress-resolve", daemon=True).start()
        if not done.wait(timeout_s):
            raise TimeoutError(f"resolving took longer than {timeout_s:g} s")
        if failure:
            raise failure[0]
        return found

    return resolve


def _resolved(resolver: Resolver, host: str) -> list[IPAddress]:
    """The addresses `resolver` gives for `host`, without duplicates; OSError when none."""
    addresses: list[IPAddress] = []
    for text in resolver(host):
        ip = ipaddress.ip_address(str(text).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise OSError(f"{host} has no address")
    return addresses


# ---- the policy ------------------------------------------------------------------

@dataclass(frozen=True)
class EgressPolicy:
    """Public addresses, plus what the operator allow-lists.

    `allow_networks`: addresses inside these are permitted whatever their kind.
    `allow_hosts`: these exact host names (lower case, no trailing dot) are permitted
    whatever they resolve to. `resolver`: host name -> addresses (default: the system's,
    bounded by `resolve_timeout_s`); tests pass their own.
    """

    allow_networks: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()
    resolver: Resolver | None = field(default=None, compare=False, repr=False)
    resolve_timeout_s: float = RESOLVE_TIMEOUT_S

    @classmethod
    def parse(cls, text: str | None, *, resolver: Resolver | None = None,
              resolve_timeout_s: float = RESOLVE_TIMEOUT_S) -> EgressPolicy:
        """The policy an allow-list such as `127.0.0.1,10.0.0.0/8,hooks.internal` describes
        (empty: public addresses only). ValueError names an entry that is none of IP, CIDR
        or host name."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in (text or "").split(","):
            entry = _canonical(raw.strip())
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            labels = entry.split(".")
            if "/" in entry or ":" in entry or _looks_numeric(entry) or \
                    not all(_HOST_LABEL.fullmatch(label) for label in labels):
                raise ValueError(f"{SETTING}: {raw.strip()!r} is neither an IP address, a CIDR nor a host name")
            hosts.add(entry)
        return cls(tuple(networks), frozenset(hosts), resolver, resolve_timeout_s)

    @classmethod
    def from_settings(cls, settings: Any, *, resolver: Resolver | None = None) -> EgressPolicy:
        """The platform's policy: `settings.egress_allow` (TUNEFORGE_EGRESS_ALLOW)."""
        return cls.parse(getattr(settings, "egress_allow", ""), resolver=resolver)

    # ---- decisions -----------------------------------------------------------
    def _resolve(self, host: str) -> list[IPAddress]:
        return _resolved(self.resolver or system_resolver(self.resolve_timeout_s), host)

    def refusal(self, ip: IPAddress) -> str | None:
        """Why the platform may not connect to `ip`, or None when it may."""
        if any(ip in network for network in self.allow_networks if network.version == ip.version):
            return None
        return _non_public(ip)

    def check_url(self, url: Any, *, param: str) -> str:
        """`url` (stripped) when the platform may send to it; otherwise an ApiError 400 with
        `param`: code `invalid_url` for a malformed URL, `url_not_allowed` for one the policy
        refuses. A host name is resolved now and refused if any address is not allowed; a
        name that does not resolve now is accepted (the client checks again at connect time)."""
        if not isinstance(url, str) or not url.strip():
            raise invalid(f"{param} must be an http:// or https:// URL", param=param, code=MALFORMED)
        url = url.strip()
        if len(url) > MAX_URL_CHARS:
            raise invalid(f"{param} is longer than {MAX_URL_CHARS} characters", param=param, code=MALFORMED)
        if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url):
            raise invalid(f"{param} must not contain spaces or control characters", param=param, code=MALFORMED)
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("http", "https"):
            raise invalid(f"{param} must be an http:// or https:// URL with a host; got {url!r}", param=param,
                          code=MALFORMED)
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if "\\" in authority:
            raise invalid(f"{param} has a backslash in its host part", param=param, code=MALFORMED)
        if "@" in authority:
            raise invalid(f"{param} must not carry credentials (user:password@); put them in headers the "
                          "receiver checks, or in the path", param=param, code=NOT_ALLOWED)
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            # httpx refuses some spellings the resolver reads (0177.0.0.1): say what they name
            host = re.sub(r":[0-9]*$", "", authority) if not authority.startswith("[") else authority
            ip = _literal(_canonical(host))
            reason = self.refusal(ip) if ip is not None else None
            if reason:
                raise self._refused(param, f"names {reason} ({host})") from None
            raise invalid(f"{param} is not a valid URL: {url!r}", param=param, code=MALFORMED) from None
        if parsed.port is not None and not 1 <= parsed.port <= 65535:
            raise invalid(f"{param} has an invalid port: {url!r}", param=param, code=MALFORMED)
        host = parsed.raw_host.decode("ascii")
        if not _canonical(host):
            raise invalid(f"{param} must be an http:// or https:// URL with a host; got {url!r}", param=param,
                          code=MALFORMED)
        self._check_host(host, param)
        return url

    def _check_host(self, given: str, param: str) -> None:
        host = _canonical(given)
        if host in self.allow_hosts:
            return
        ip = _literal(host)
        if ip is not None:
            reason = self.refusal(ip)
            if reason:
                raise self._refused(param, f"names {reason} ({given})")
            return
        if "%" in host:
            raise invalid(f"{param} host must be written without percent-encoding", param=param, code=NOT_ALLOWED)
        if ":" in host:
            raise invalid(f"{param} has an invalid IPv6 address: {given!r}", param=param, code=MALFORMED)
        if _is_localhost(host):
            raise self._refused(param, f"names the local host ({given})")
        if _looks_numeric(host):
            raise invalid(f"{param} host {given!r} is neither a valid IP address nor a host name", param=param,
                          code=MALFORMED)
        try:
            addresses = self._resolve(host)
        except (OSError, ValueError):
            return  # not resolvable now: the connection checks whatever it resolves to then
        for address in addresses:
            reason = self.refusal(address)
            if reason:  # the answer is our resolver's: it is not repeated to the tenant
                raise self._refused(param, f"host {given} resolves to {reason}")

    @staticmethod
    def _refused(param: str, what: str) -> ApiError:
        return invalid(f"{param} {what}; only public addresses are allowed unless the operator allow-lists "
                       f"them in {SETTING}", param=param, code=NOT_ALLOWED)

    def addresses_for(self, host: str) -> list[str]:
        """The addresses to connect to for `host`, each checked; EgressDenied when any is
        refused, httpx.ConnectError when the name does not resolve. The clients call this
        for every new connection."""
        name = _canonical(host)
        permitted = name in self.allow_hosts
        literal = _literal(name)
        if literal is not None:
            addresses = [literal]
        elif not permitted and ("%" in name or ":" in name):
            raise EgressDenied(f"{host} is not a host name")
        elif not permitted and _is_localhost(name):
            raise EgressDenied(f"{host} is the local host")
        else:
            try:
                addresses = self._resolve(name)
            except (OSError, ValueError) as exc:
                raise httpx.ConnectError(f"{host} did not resolve") from exc
        if not permitted:
            for address in addresses:
                reason = self.refusal(address)
                if reason:
                    raise EgressDenied(f"{host} resolves to {reason}")
        # an IPv4-mapped address is connected to as the IPv4 address it carries
        return [str(getattr(address, "ipv4_mapped", None) or address) for address in addresses]

    # ---- clients -------------------------------------------------------------
    def client(self, *, timeout: float | httpx.Timeout = 10.0, verify: bool | Any = True,
               **options: Any) -> httpx.Client:
        """An httpx.Client whose every connection passes this policy. `options` go to
        httpx.Client (headers, base_url…), except those that would route around the policy
        (transport, mounts, proxy, trust_env, follow_redirects)."""
        _refuse_options(options)
        return httpx.Client(transport=_GuardedTransport(self, verify=verify_option(verify)), timeout=timeout,
                            trust_env=False, follow_redirects=False, **options)

    def async_client(self, *, timeout: float | httpx.Timeout = 10.0, verify: bool | Any = True,
                     **options: Any) -> httpx.AsyncClient:
        """The asynchronous twin of `client`."""
        _refuse_options(options)
        return httpx.AsyncClient(transport=_AsyncGuardedTransport(self, verify=verify_option(verify)), timeout=timeout,
                                 trust_env=False, follow_redirects=False, **options)


def _refuse_options(options: dict[str, Any]) -> None:
    refused = sorted(_REFUSED_CLIENT_OPTIONS & set(options))
    if refused:
        raise TypeError(f"an egress-checked client takes no {', '.join(refused)}")


# ---- connect-time checks: a network backend that connects only to checked addresses ----

def _connect_each(addresses: Sequence[str], connect: Callable[[str], Any]) -> Any:
    last: Exception | None = None
    for address in addresses:
        try:
            return connect(address)
        except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
            last = exc
    assert last is not None
    raise last


class _GuardedBackend(httpcore.NetworkBackend):
    """Resolves and checks the host itself, then connects to the checked address; TLS
    (started later by httpcore) still names and verifies the URL's host."""

    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        addresses = self._policy.addresses_for(host)
        return _connect_each(addresses, lambda address: self._inner.connect_tcp(
            address, port, timeout=timeout, local_address=local_address, socket_options=socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise EgressDenied("unix sockets are not allowed")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncGuardedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        addresses = await anyio.to_thread.run_sync(self._policy.addresses_for, host)
        last: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                     socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise EgressDenied("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport (request and error mapping) over a pool with the guarded backend."""

    def __init__(self, policy: EgressPolicy, *, verify: Any = True) -> None:
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=verify,
                                                                                               trust_env=False)
        super().__init__(verify=context, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=_LIMITS.max_connections, max_keepalive_connections=_LIMITS.max_keepalive_connections,
            keepalive_expiry=_LIMITS.keepalive_expiry, network_backend=_GuardedBackend(policy))


class _AsyncGuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, policy: EgressPolicy, *, verify: Any = True) -> None:
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=verify,
                                                                                               trust_env=False)
        super().__init__(verify=context, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=_LIMITS.max_connections, max_keepalive_connections=_LIMITS.max_keepalive_connections,
            keepalive_expiry=_LIMITS.keepalive_expiry, network_backend=_AsyncGuardedBackend(policy))

