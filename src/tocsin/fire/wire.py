"""After the gate, only bytes: one thread writes every request due in a millisecond, then
reads the answers.

A webhook's request (its head and body) or an AWS call (serialized and signed by botocore)
is made whole before its gate, on a connection already open, its TLS handshake done
(`Connection`). Its sender hands it here (`WIRE.send`) and waits. This process's one
writer thread sleeps to each due millisecond (`tocsin.gate`), writes every request due
then, in due order, without blocking on any one socket, and reads the answers afterwards:
one epoll over the sockets, each answer's time bounded (`Sent.answer_within_s`). A thread
a send, woken at the gate and building its request there, cost each webhook about a
millisecond of a core, where a 256 MB Lambda has a seventh of one.

A connection is watched from the moment its request is handed here: one the peer closes
while it waits is seen then, before the gate (`Sent.dropped`: its sender connects again),
and a TLS 1.3 server's session tickets are read then too. At the gate, each request is one
write (two, head then body, when the body is larger than SMALL_BODY: a large body is never
joined into a copy, so 500 bodies of 200 KB are held once).
"""

import contextlib
import heapq
import itertools
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import h11

from tocsin import clock, gate

APPROACH_MS = 30  # the writer stops reading answers this long before a gate, and sleeps to it
SMALL_BODY = 4096  # a body this small goes out in one write with its head, copied once ahead
TLS_RECORD = 16 * 1024  # a TLS write: one record, taken whole or not at all
READ_BYTES = 64 * 1024
TICKETS_WAIT_S = 0.05  # a TLS 1.3 server's session tickets follow its handshake at once
READ, WRITE = select.EPOLLIN | select.EPOLLRDHUP, select.EPOLLOUT


class Connection:
    """An open connection to one address (TCP, and TLS with its handshake done), and the
    HTTP/1.1 state of its requests (h11's, as the client)."""

    def __init__(self, sock: socket.socket, host: str):
        self.sock, self.host = sock, host  # host: the Host header its requests carry
        self.http = h11.Connection(h11.CLIENT)

    @classmethod
    def open(
        cls,
        address: tuple[str, int],
        host: str,
        timeout_s: float,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> "Connection":
        """Connect to `address` and, with `tls`, do the handshake for `server_hostname`
        (its certificate verified); then the socket no longer blocks."""
        sock = socket.create_connection(address, timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=server_hostname)
            sock.setblocking(False)
            if isinstance(sock, ssl.SSLSocket) and sock.version() == "TLSv1.3":
                _read_session_tickets(sock)
        except BaseException:
            sock.close()
            raise
        return cls(sock, host)

    def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[bytes, bytes]:
        """A request as it is written: its head, and its body (the same object, or with a
        small one, nothing: the head then carries it)."""
        framed = any(name.lower() == "content-length" for name, _ in headers)
        length = [] if framed else [("Content-Length", str(len(body)))]
        all_headers = [("Host", self.host), *headers, *length]
        head = self.http.send(h11.Request(method=method, target=target, headers=all_headers))
        pieces = self.http.send_with_data_passthrough(h11.Data(data=body)) if body else []
        self.http.send(h11.EndOfMessage())
        body = pieces[0] if pieces else b""
        if len(body) <= SMALL_BODY:
            return (head or b"") + body, b""
        return head or b"", body

    def reusable(self) -> bool:
        """Its last request and answer are over, and both sides keep it open."""
        return self.http.our_state is h11.DONE and self.http.their_state is h11.DONE

    def again(self) -> "Connection":
        """Ready for its next request (`reusable` first)."""
        self.http.start_next_cycle()
        return self

    def dropped(self) -> bool:
        """Whether the peer closed it (or sent what no request asked for) while it waited;
        TLS's own records (a session ticket) are read and leave it open."""
        try:
            if not _readable(self.sock, 0):
                return False
            self.sock.recv(1)  # an end (b""), a reset, or bytes out of turn
        except (ssl.SSLWantReadError, BlockingIOError):
            return False
        except (OSError, ValueError):
            pass
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _readable(sock: socket.socket, wait_s: float) -> bool:
    """Whether `sock` has something to read (or an end), waiting up to `wait_s` (a poll: a
    Lambda's file descriptors run past select's 1,024)."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(wait_s * 1000))


def _read_session_tickets(sock: ssl.SSLSocket) -> None:
    """Read the session tickets a TLS 1.3 server sends just after the handshake (they carry
    no application data), so that a connection waiting for its gate is quiet."""
    while _readable(sock, TICKETS_WAIT_S):
        try:
            if not sock.recv(READ_BYTES):
                return  # closed: the wire sees it
        except ssl.SSLWantReadError:
            continue
        except OSError:
            return


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""


@dataclass(eq=False)
class Sent:
    """A request to write at `fires_ms`, and what came of it: written at `written_ms` and
    answered (`answer`: its head, and its body if `whole_answer`); or its `failure` (the
    connection's, or no answer within `answer_within_s`); or not written, for its
    connection was `dropped`, or it missed its millisecond by more than `slack_ms` (by
    `missed_ms`)."""

    connection: Connection
    head: bytes
    body: bytes
    fires_ms: int
    answer_within_s: float
    whole_answer: bool = True
    slack_ms: int | None = None  # how late it may go; None: however late
    written_ms: int = field(default=0, init=False)
    answer: Answer | None = field(default=None, init=False)
    failure: str = field(default="", init=False)
    timed_out: bool = field(default=False, init=False)
    dropped: bool = field(default=False, init=False)
    missed_ms: int = field(default=0, init=False)  # how late its gate let it go, if too late
    stopped: BaseException | None = field(default=None, init=False)  # the runtime's stop
    _buffers: list[memoryview] = field(default_factory=list, init=False)
    _deadline: float = field(default=0.0, init=False)
    _status: int = field(default=0, init=False)
    _headers: list[tuple[bytes, bytes]] = field(default_factory=list, init=False)
    _body: list[bytes] = field(default_factory=list, init=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False)


class Wire:
    """The process's one writer of prepared requests, started at its first `send`."""

    def __init__(self) -> None:
        self._due: list[tuple[int, int, Sent]] = []  # a heap: by fires_ms, then by order
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._sleeps_until: int | None = None  # the gate the writer waits for, if any
        self._thread: threading.Thread | None = None
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self._wake_read.fileno(), select.EPOLLIN)
        self._watched: dict[int, Sent] = {}  # by socket: from its handing over to its end
        self._in_flight: set[Sent] = set()  # written, not yet answered

    def send(self, sent: Sent) -> Sent:
        """Write `sent` at its millisecond (at once if that is past); return once it is
        answered, failed, or not written."""
        fd = sent.connection.sock.fileno()
        with self._lock:
            self._watched[fd] = sent
            self._epoll.register(fd, READ)
            heapq.heappush(self._due, (sent.fires_ms, next(self._order), sent))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wire", daemon=True)
                self._thread.start()
            wake = self._sleeps_until is None or sent.fires_ms < self._sleeps_until
        if wake:
            self._wake_write.send(b"\0")
        sent._done.wait()
        return sent

    def _run(self) -> None:
        while True:
            with self._lock:
                next_ms = self._due[0][0] if self._due else None
                self._sleeps_until = next_ms
            if next_ms is not None and next_ms - clock.now_ms() <= APPROACH_MS:
                self._release(next_ms)
                continue
            for fd, events in self._epoll.poll(self._timeout_s(next_ms)):
                if fd == self._wake_read.fileno():
                    with contextlib.suppress(BlockingIOError):
                        while self._wake_read.recv(4096):
                            pass
                elif sent := self._watched.get(fd):
                    self._serve(sent, events)
            self._expire()

    def _timeout_s(self, next_ms: int | None) -> float:
        """How long the poll may wait (-1: until woken): until the next gate's approach, or
        the nearest answer's time limit."""
        waits = [d._deadline - time.monotonic() for d in self._in_flight]
        if next_ms is not None:
            waits.append((next_ms - APPROACH_MS - clock.now_ms()) / 1000)
        return max(min(waits), 0) if waits else -1

    def _release(self, due_ms: int) -> None:
        """Sleep to the gate at `due_ms`, then write every request due by then, in order."""
        try:
            let_go_ms = gate.wait_until(due_ms)
        except Exception as stopped:  # the embedded runtime's stop (RuntimeStopped)
            for sent in self._take_due(due_ms):
                sent.stopped = stopped
                self._end(sent)
            return
        due = self._take_due(let_go_ms)
        if gate.WATCH:
            gate.WATCH.let_go()
        written = sum(self._start(sent, let_go_ms) for sent in due)
        if gate.WATCH and written:
            gate.WATCH.written(written)

    def _take_due(self, by_ms: int) -> list[Sent]:
        """The requests due by `by_ms` and still waiting (not dropped meanwhile), in order."""
        with self._lock:
            due = []
            while self._due and self._due[0][0] <= by_ms:
                sent = heapq.heappop(self._due)[2]
                if not sent._done.is_set():
                    due.append(sent)
            return due

    def _start(self, sent: Sent, now_ms: int) -> int:
        """Write what its socket takes of `sent` now: 1 if that is all of it (the rest goes
        as the socket takes it)."""
        if sent.slack_ms is not None and now_ms > sent.fires_ms + sent.slack_ms:
            sent.missed_ms = now_ms - sent.fires_ms
            self._end(sent)
            return 0
        sent.written_ms = now_ms
        sent._buffers = [memoryview(b) for b in (sent.head, sent.body) if b]
        sent._deadline = time.monotonic() + sent.answer_within_s
        self._in_flight.add(sent)
        whole = self._push(sent)
        if not whole and sent in self._in_flight:
            self._epoll.modify(sent.connection.sock.fileno(), READ | WRITE)
        return int(whole)

    def _push(self, sent: Sent) -> bool:
        """Write what the socket takes now: whether all of `sent` is written."""
        sock = sent.connection.sock
        tls = isinstance(sock, ssl.SSLSocket)
        while sent._buffers:
            buffer = sent._buffers[0]
            try:
                count = sock.send(buffer[:TLS_RECORD] if tls else buffer)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                return False
            except OSError as error:
                self._end(sent, failure=f"{type(error).__name__} while writing")
                return False
            rest = buffer[count:]
            if rest:
                sent._buffers[0] = rest
            else:
                sent._buffers.pop(0)
        return True

    def _serve(self, sent: Sent, events: int) -> None:
        if not sent.written_ms:  # waiting for its gate: a close, or a TLS record
            if sent.connection.dropped():
                sent.dropped = True
                self._end(sent)
            return
        if events & WRITE and sent._buffers and self._push(sent):
            self._epoll.modify(sent.connection.sock.fileno(), READ)
            if gate.WATCH:
                gate.WATCH.written(1)
        if events & READ and sent in self._in_flight:
            self._read(sent)

    def _read(self, sent: Sent) -> None:
        """Take what came of the answer; end `sent` once it is whole (or its head, if that
        is all it needs), or the connection failed."""
        http = sent.connection.http
        while sent in self._in_flight:
            try:
                data = sent.connection.sock.recv(READ_BYTES)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            except OSError as error:
                self._end(sent, failure=f"{type(error).__name__} while reading")
                return
            if not data and not sent._status:
                self._end(sent, failure="the connection closed before its answer")
                return
            http.receive_data(data)
            self._parse(sent)
            if not data:
                if sent in self._in_flight:
                    self._end(sent, failure="the connection closed during its answer")
                return

    def _parse(self, sent: Sent) -> None:
        http = sent.connection.http
        while sent in self._in_flight:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as error:
                self._end(sent, failure=f"a malformed answer ({error})")
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                sent._status, sent._headers = event.status_code, list(event.headers)
                if not sent.whole_answer:
                    self._end(sent, answered=True)
            elif isinstance(event, h11.Data):
                sent._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._end(sent, answered=True)

    def _expire(self) -> None:
        now = time.monotonic()
        for sent in [d for d in self._in_flight if d._deadline <= now]:
            sent.timed_out = True
            self._end(sent, failure=f"no answer within {sent.answer_within_s:g} s")

    def _end(self, sent: Sent, answered: bool = False, failure: str = "") -> None:
        """No more of `sent`: its answer, or its failure (its connection closed), or it
        was not written."""
        self._in_flight.discard(sent)
        with self._lock:
            fd = sent.connection.sock.fileno()
            if self._watched.get(fd) is sent:
                del self._watched[fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)
        if answered:
            sent.answer = Answer(sent._status, sent._headers, b"".join(sent._body))
        elif failure:
            sent.failure = failure
            sent.connection.close()
        sent._done.set()


WIRE = Wire()


class Turn(Protocol):
    """When a task's request may be written, and its writing: its due millisecond, or its
    flow's slot and lease (`tocsin.fire.sends`)."""

    @property
    def fires_ms(self) -> int:
        """When it is planned to go (its due time, or its flow's slot)."""

    def send(self, sent: Sent) -> Sent:
        """Write `sent` (by the wire) at its turn; once answered, failed or not written."""

    def at_gate(self) -> None:
        """Sleep until its turn: what fails with nothing written fails no earlier."""


class _Now:
    """The turn of a request sent outside the fire path: at once."""

    fires_ms = 0

    def send(self, sent: Sent) -> Sent:
        sent.fires_ms = clock.now_ms()
        return WIRE.send(sent)

    def at_gate(self) -> None:
        pass


NOW: Turn = _Now()
