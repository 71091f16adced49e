"""Publish KV-cache events into a kvfast shared-memory segment.

Standard library only (mmap, struct, os), Python 3.9+. This module is an
implementation of the cross-language contract in docs/shm-layout.md; the Go
publisher in package shm is the other. Both must stay byte-for-byte equal.

Usage::

    pub = KvfastPublisher("/dev/shm/kvfast", worker_id=1, model="llama-3-8b",
                          block_size=16, endpoint="http://127.0.0.1:8001")
    pub.stored(block_hashes=[h1, h2], token_ids=tokens32, parent_hash=None)
    pub.removed([h1])
    pub.load(running=3, waiting=0, kv_used_blocks=120, kv_total_blocks=9000)
    pub.heartbeat()          # at least once per router grace period
    pub.close()

Event methods never block: when the ring is full the record is dropped,
False is returned, and the router sees the sequence gap and resyncs.

Memory ordering: the commit protocol needs the record bytes to become
visible before the head word. CPython gives no fence, so this module relies
on x86-64's total store order; the words other processes poll (head, seq,
heartbeat, state) are written through a native 'Q' memoryview, which is a
single aligned 8-byte store. On weakly ordered CPUs (arm64) use the Go
publisher.
"""

import errno
import mmap
import os
import platform
import struct
import sys
import threading
import time
import urllib.parse

LAYOUT_VERSION = 2
MAGIC = b"KVFASTSG"

HEADER_SIZE = 4096
HEADER_SUM_OFF = 248
CONTROL_OFF = 4096
CONTROL_SIZE = 4096
MAX_WORKERS = 64
SLOT_SIZE = 512
REGISTRY_OFF = CONTROL_OFF + CONTROL_SIZE
LOAD_PAGE_SIZE = 128
LOAD_OFF = REGISTRY_OFF + MAX_WORKERS * SLOT_SIZE
RINGS_OFF = LOAD_OFF + MAX_WORKERS * LOAD_PAGE_SIZE
RING_CONTROL_SIZE = 256
MIN_RING, MAX_RING = 4 << 10, 1 << 30
PAGE = 4096
BINDING_BUCKET = 256

CONTROL_RETIRED = 128

# registry slot fields
S_STATE, S_GEN, S_PID, S_WORKER_ID, S_DP_RANK, S_BLOCK_SIZE = 0, 8, 12, 16, 24, 28
S_KV_CAPACITY, S_HEARTBEAT, S_REGISTERED, S_MODEL_LEN, S_ENDPT_LEN = 32, 40, 48, 56, 58
S_MODEL, S_ENDPOINT = 64, 256
S_ROLE = 60
ROLES = {"both": 0, "prefill": 1, "decode": 2, "encode": 3}
MAX_MODEL_LEN, MAX_ENDPOINT_LEN = S_ENDPOINT - S_MODEL, SLOT_SIZE - S_ENDPOINT
FREE, CLAIMING, LIVE, DOWN, CLOSED = 0, 1, 2, 3, 4
# A slot a router reserved for an engine it was configured with (--worker):
# it is that engine's index slot, and a publisher never claims it.
RESERVED = 5
# How recent a holder's heartbeat must be for its worker id to be refused
# to another process (shm/registry.go's liveHeartbeat).
LIVE_HEARTBEAT_NS = 5 * 1000 * 1000 * 1000

# ring control fields
C_HEAD, C_DROPPED, C_PUBLISHED, C_TAIL = 0, 8, 16, 128

# load page fields
L_SEQ, L_RUNNING, L_WAITING, L_KV_USED, L_KV_TOTAL, L_UPDATED, L_GEN = 0, 8, 16, 24, 32, 40, 48

# records
STORED, REMOVED, CLEARED, PAD = 1, 2, 3, 0xFF
FLAG_PARENT = 1
RECORD_HEAD = 24
STORED_HEAD = 32
_HEAD = struct.Struct("<IBBHQII")

U64 = (1 << 64) - 1


class SegmentError(Exception):
    """The segment is missing, of another layout version, or corrupt."""


class SlotLost(Exception):
    """Another registration of the same worker id and DP rank took the slot."""


class WorkerLive(SegmentError):
    """Another engine, alive and heartbeating, holds this worker id and DP
    rank: two engines were given one id."""


class _HolderPresumed(Exception):
    """A registration of this worker id and rank heartbeated recently and
    its process may be alive: watched by __init__ (shm/registry.go)."""

    def __init__(self, slot, holder, beat, endpoint):
        super().__init__(slot, holder, beat, endpoint)
        self.slot, self.holder, self.beat, self.endpoint = slot, holder, beat, endpoint


# The registrations this process holds, (st_dev, st_ino, slot) ->
# generation: one of them is taken over at once by a new registration of
# this process, whatever pid the slot records (another PID namespace's
# pid may equal this process's).
_registrations = {}
_registrations_lock = threading.Lock()

# POSIX record locks belong to the process, not the descriptor: two
# publishers of one process (threads, each with its own descriptor) would
# both hold the registry lock at once and could claim one slot, and one's
# unlock would drop the other's. This serialises them in the process.
_registry_process_lock = threading.RLock()

HOLDER_WATCH_POLL_S = 0.05


class Retired(Exception):
    """The router recreated the segment; register again."""


def check_endpoint(endpoint):
    """Raise ValueError unless endpoint is what the router routes to:
    http://host:port or host:port, port 1 to 65535, no credentials, path
    or query (the router refuses such a registration, and only its log
    would say so)."""
    if not endpoint:
        raise ValueError("no endpoint: the router needs the engine's HTTP address (http://host:port) to route to it")
    # Only the scheme, host and port are ever quoted: credentials, a path
    # or a query may hold a secret.
    shown = _shown_endpoint(endpoint)
    rest = endpoint
    if "://" in endpoint:
        u = urllib.parse.urlsplit(endpoint)
        if u.username is not None:
            raise ValueError("endpoint %r holds credentials, which the router does not send: give the engines' key to the router (--engine-api-key-file)"
                             % shown)
        if u.scheme != "http" or u.path not in ("", "/") or u.query or u.fragment:
            raise ValueError("endpoint %r: want http://host:port, without a path, query or fragment" % shown)
        rest = u.netloc
    host, sep, port = rest.rpartition(":")
    # ASCII digits only: str.isdigit also takes "４５" and "٤٥", which int()
    # reads and the router's Go parser refuses.
    if not sep or not host or any(c in host + port for c in "@/?#") or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 1 << 16:
        raise ValueError("endpoint %r: want a host and a port from 1 to 65535 (http://host:port, without credentials, a path or a query)" % shown)
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        # "::1:8001" does not say where the address ends; Go's
        # net.SplitHostPort, which the router uses, refuses it.
        raise ValueError("endpoint %r: write an IPv6 address in brackets, http://[%s]:%s" % (shown, host, port))


def _shown_endpoint(endpoint):
    """endpoint as an error may quote it: its scheme, host and port, with
    credentials replaced and any path, query or fragment cut off."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        scheme, rest = "", endpoint
    for cut in "/?#":
        rest = rest.split(cut)[0]
    if "@" in rest:
        rest = "REDACTED@" + rest.rsplit("@", 1)[-1]
    return scheme + sep + rest


def check_uint(name, value, bits):
    """Raise ValueError unless value is an int (not a bool) that fits an
    unsigned field of bits bits: checked before anything is written, so
    that a bad value cannot leave a registry slot or load page half
    written."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise ValueError("%s %r: want an integer from 0 to %d" % (name, value, (1 << bits) - 1))


# The ring's commit protocol relies on x86-64's total store order (module
# docstring); a weakly ordered CPU could publish a commit before the bytes
# it commits.
STORE_ORDERED_MACHINES = ("x86_64", "amd64", "x64")


def _fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & U64
    return h


def _align(n, a):
    return (n + a - 1) & ~(a - 1)


class KvfastPublisher:
    """One engine rank's publisher: a registry slot, its ring, its load page.

    Methods are serialised by an internal lock, so a heartbeat thread may
    run beside the thread that publishes events.
    """

    def __init__(self, path, worker_id, model, block_size, dp_rank=0,
                 kv_capacity_blocks=0, endpoint="", role="both", displaced=False):
        """displaced: this engine lost its slot to another registration of
        its worker id (SlotLost) and registers again. A holder whose
        process cannot be seen is then watched like a visible one rather
        than taken for dead: in another PID namespace it is most likely
        the engine that displaced this one, and taking its slot back would
        start a tug of war at every heartbeat."""
        if sys.byteorder != "little":
            raise SegmentError("kvfast segments are little-endian; this host is not")
        if platform.machine().lower() not in STORE_ORDERED_MACHINES:
            raise SegmentError("this publisher's commit protocol needs x86-64's store ordering, and this host is %s: "
                               "use the Go publisher (shm.Register) here" % platform.machine())
        model_b, endpoint_b = model.encode(), endpoint.encode()
        check_uint("worker_id", worker_id, 64)
        check_uint("dp_rank", dp_rank, 32)
        check_uint("kv_capacity_blocks", kv_capacity_blocks, 64)
        check_uint("block_size", block_size, 32)
        if not 0 < block_size <= 1 << 15:
            raise ValueError("block size %d out of range" % block_size)
        if len(model_b) > MAX_MODEL_LEN or len(endpoint_b) > MAX_ENDPOINT_LEN:
            raise ValueError("model or endpoint too long")
        if role not in ROLES:
            raise ValueError("role %r: want both, prefill, decode or encode" % role)
        check_endpoint(endpoint)
        self._role = ROLES[role]
        self._displaced = displaced
        self._lock = threading.Lock()
        self._closed = False
        self._path = path
        try:
            self._fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no kvfast segment here: start the router first "
                                    "(kvfast serve creates it; its --segment names the path)", path) from None
        self._mm = None
        try:
            self._attach(path)
            self.block_size = block_size
            self._max_blocks = (self._max_record - STORED_HEAD - 8) // (8 + 4 * block_size)
            self._max_hashes = (self._max_record - RECORD_HEAD) // 8
            if self._max_blocks < 1:
                # Before registering: a worker that can publish no block
                # must not go live.
                raise ValueError("one block of %d tokens does not fit the segment's ring; the router's --ring-bytes "
                                 "must be larger" % block_size)
            self._cfg = (worker_id, dp_rank, model_b, block_size, kv_capacity_blocks, endpoint_b)
            if self._q[(CONTROL_OFF + CONTROL_RETIRED) // 8]:
                # Retired, yet still at its path (a stray write, a router
                # that died recreating it): a registration here would be
                # retired at its first heartbeat, for ever.
                raise Retired("the segment is marked retired and no new segment took its path: "
                              "restart the router with --recreate-segment")
            self._claim_watching()
        except BaseException:
            # A refused registration (a live holder, a full registry) must
            # not leak the descriptor: callers retry, once a second.
            for view in (getattr(self, "_q", None), getattr(self, "_i", None)):
                if view is not None:
                    view.release()
            if self._mm is not None:
                self._mm.close()
            os.close(self._fd)
            raise

    # -- segment -------------------------------------------------------

    def _attach(self, path):
        size = os.fstat(self._fd).st_size
        hdr = os.pread(self._fd, HEADER_SIZE, 0)
        # The magic before the size, as the router checks: a short file of
        # someone's data is not a truncated segment that the router may
        # recreate over.
        if hdr and hdr[0:8] != MAGIC:
            raise SegmentError("%s: not a kvfast segment (it does not begin with %r): check the path; "
                               "the router will not overwrite it, even with --recreate-segment" % (path, MAGIC.decode()))
        if size < HEADER_SIZE or len(hdr) < HEADER_SIZE:
            raise SegmentError("%s: file is %d bytes, shorter than the header (truncated?); "
                               "delete it or start the router with --recreate-segment" % (path, size))
        version = struct.unpack_from("<I", hdr, 8)[0]
        if version != LAYOUT_VERSION:
            raise SegmentError("%s: layout version %d, this publisher writes %d; "
                               "upgrade the publisher or recreate the segment" % (path, version, LAYOUT_VERSION))
        if struct.unpack_from("<Q", hdr, HEADER_SUM_OFF)[0] != _fnv1a64(hdr[:HEADER_SUM_OFF]):
            raise SegmentError("%s: header checksum mismatch (corrupt)" % path)
        ring_bytes, = struct.unpack_from("<Q", hdr, 112)
        if ring_bytes < MIN_RING or ring_bytes > MAX_RING or ring_bytes & (ring_bytes - 1):
            raise SegmentError("%s: ring size %d invalid" % (path, ring_bytes))
        stride = RING_CONTROL_SIZE + ring_bytes
        index_off = _align(RINGS_OFF + MAX_WORKERS * stride, PAGE)
        index_size, = struct.unpack_from("<Q", hdr, 128)
        # The routers' sticky-session table follows the index; a publisher
        # never touches it, but the file size depends on it.
        bindings_off = _align(index_off + index_size, PAGE)
        bindings_size, = struct.unpack_from("<Q", hdr, 176)
        n = bindings_size // BINDING_BUCKET
        if n == 0 or bindings_size % BINDING_BUCKET or n & (n - 1):
            raise SegmentError("%s: bindings region size %d invalid" % (path, bindings_size))
        file_size = _align(bindings_off + bindings_size, PAGE)
        expect = [
            ("<I", 12, HEADER_SIZE), ("<Q", 16, file_size), ("<I", 40, MAX_WORKERS),
            ("<I", 44, SLOT_SIZE), ("<Q", 48, CONTROL_OFF), ("<Q", 56, CONTROL_SIZE),
            ("<Q", 64, REGISTRY_OFF), ("<Q", 80, LOAD_OFF), ("<Q", 96, RINGS_OFF),
            ("<Q", 104, stride), ("<Q", 120, index_off), ("<I", 160, LOAD_PAGE_SIZE),
            ("<I", 164, RING_CONTROL_SIZE), ("<Q", 168, bindings_off),
        ]
        for fmt, off, want in expect:
            if struct.unpack_from(fmt, hdr, off)[0] != want:
                raise SegmentError("%s: header field at %d disagrees with the layout (corrupt)" % (path, off))
        if size < file_size:
            raise SegmentError("%s: file is %d bytes, header says %d (truncated)" % (path, size, file_size))
        self._mm = mmap.mmap(self._fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._q = memoryview(self._mm).cast("Q")  # native 8-byte words
        self._i = memoryview(self._mm).cast("I")  # native 4-byte words
        self._ring_bytes = ring_bytes
        self._stride = stride
        self._max_record = ring_bytes // 4

    def _lock_registry(self):
        _registry_process_lock.acquire()
        try:
            os.lseek(self._fd, REGISTRY_OFF, os.SEEK_SET)
            os.lockf(self._fd, os.F_LOCK, 1)
        except BaseException:
            _registry_process_lock.release()
            raise

    def _unlock_registry(self):
        try:
            os.lseek(self._fd, REGISTRY_OFF, os.SEEK_SET)
            os.lockf(self._fd, os.F_ULOCK, 1)
        finally:
            _registry_process_lock.release()

    @staticmethod
    def _next_state(word, state):
        return ((((word >> 8) + 1) << 8) | state) & U64

    def _reg_key(self, slot):
        st = os.fstat(self._fd)
        return (st.st_dev, st.st_ino, slot)

    def _remember(self):
        with _registrations_lock:
            _registrations[self._reg_key(self.slot)] = self.generation

    def _forget(self):
        with _registrations_lock:
            key = self._reg_key(self.slot)
            if _registrations.get(key) == self.generation:
                del _registrations[key]

    def _claim_watching(self):
        """_claim, waiting out a holder of the worker id presumed alive: if
        its heartbeat moves while watched, another engine runs under this
        worker id and rank (WorkerLive); if it stands still until
        LIVE_HEARTBEAT_NS has passed since its last beat, or for that long
        while watched (a heartbeat ahead of this clock never ages), the
        holder died and its slot is taken over."""
        first = stood = None
        since = 0.0
        while True:
            try:
                self._claim(stood)
                self._remember()
                return
            except _HolderPresumed as h:
                if first is None:
                    first, since = h, time.monotonic()
                elif (h.slot, h.beat) != (first.slot, first.beat):
                    worker_id, dp_rank = self._cfg[0], self._cfg[1]
                    raise WorkerLive("worker %d rank %d is held by process %d (endpoint %r), heartbeating: "
                                     "give each engine its own worker id, or stop that one first"
                                     % (worker_id, dp_rank, h.holder, h.endpoint))
                if time.monotonic() - since > LIVE_HEARTBEAT_NS / 1e9:
                    # Stood still for as long as a stale one would have
                    # aged (one ahead of this clock never does): take it.
                    stood = first
                    continue
            time.sleep(HOLDER_WATCH_POLL_S)

    def _claim(self, stood=None):
        worker_id, dp_rank, model_b, block_size, kv_cap, endpoint_b = self._cfg
        q, i = self._q, self._i
        self._lock_registry()
        try:
            def state(n):
                return q[(REGISTRY_OFF + n * SLOT_SIZE) // 8] & 0xFF

            pick = -1
            for want in (
                lambda n, st: st not in (FREE, RESERVED) and q[(REGISTRY_OFF + n * SLOT_SIZE + S_WORKER_ID) // 8] == worker_id
                and i[(REGISTRY_OFF + n * SLOT_SIZE + S_DP_RANK) // 4] == dp_rank,
                lambda n, st: st == FREE,
                lambda n, st: st in (CLOSED, CLAIMING),
                lambda n, st: st == DOWN,
            ):
                for n in range(MAX_WORKERS):
                    if want(n, state(n)):
                        pick = n
                        break
                if pick >= 0:
                    break
            if pick < 0:
                raise SegmentError("every worker slot is taken")
            off = REGISTRY_OFF + pick * SLOT_SIZE
            presumed = self._holder_presumed(pick, off)
            if presumed is not None and (stood is None or (stood.slot, stood.beat) != (presumed.slot, presumed.beat)):
                raise presumed
            word = self._next_state(q[off // 8], CLAIMING)
            q[off // 8] = word
            gen = (i[(off + S_GEN) // 4] + 1) & 0xFFFFFFFF or 1
            now = time.monotonic_ns()
            i[(off + S_GEN) // 4] = gen
            i[(off + S_PID) // 4] = os.getpid() & 0xFFFFFFFF
            q[(off + S_WORKER_ID) // 8] = worker_id
            i[(off + S_DP_RANK) // 4] = dp_rank
            i[(off + S_BLOCK_SIZE) // 4] = block_size
            q[(off + S_KV_CAPACITY) // 8] = kv_cap
            i[(off + S_ROLE) // 4] = self._role
            q[(off + S_HEARTBEAT) // 8] = now
            q[(off + S_REGISTERED) // 8] = now
            struct.pack_into("<HH", self._mm, off + S_MODEL_LEN, len(model_b), len(endpoint_b))
            self._mm[off + S_MODEL:off + SLOT_SIZE] = bytes(SLOT_SIZE - S_MODEL)
            self._mm[off + S_MODEL:off + S_MODEL + len(model_b)] = model_b
            self._mm[off + S_ENDPOINT:off + S_ENDPOINT + len(endpoint_b)] = endpoint_b
            q[off // 8] = self._next_state(word, LIVE)
        finally:
            self._unlock_registry()
        self.slot, self.generation, self.seq = pick, gen, 0
        self._slot_off = off
        ring = RINGS_OFF + pick * self._stride
        self._head_w = (ring + C_HEAD) // 8
        self._tail_w = (ring + C_TAIL) // 8
        self._dropped_w = (ring + C_DROPPED) // 8
        self._published_w = (ring + C_PUBLISHED) // 8
        self._data = ring + RING_CONTROL_SIZE
        h, t = q[self._head_w], q[self._tail_w]
        if h < t or h - t > self._ring_bytes or h % 8:
            h = t & ~7
            q[self._head_w] = h
        self._pos, self._tail_cache = h, t
        self.dropped = q[self._dropped_w]

    def _holder_presumed(self, pick, off):
        """The registration in the slot at off, as a _HolderPresumed when it
        heartbeated within LIVE_HEARTBEAT_NS and its process may be alive;
        None when it may be taken over: not live, this process's own,
        stale, or its process gone from this PID namespace (an engine in
        another namespace cannot be told from a dead one)."""
        if self._q[off // 8] & 0xFF != LIVE:
            return None
        with _registrations_lock:
            if _registrations.get(self._reg_key(pick)) == self._i[(off + S_GEN) // 4]:
                return None
        beat = self._q[(off + S_HEARTBEAT) // 8]
        if time.monotonic_ns() - beat > LIVE_HEARTBEAT_NS:
            return None
        holder = self._i[(off + S_PID) // 4]
        if holder:
            try:
                os.kill(holder, 0)
            except ProcessLookupError:
                if not self._displaced:
                    return None
            except (OSError, OverflowError):
                pass  # alive, another user's; or a pid no process here has (another namespace's, or scribbled)
        n = struct.unpack_from("<H", self._mm, off + S_ENDPT_LEN)[0]
        endpoint = bytes(self._mm[off + S_ENDPOINT:off + S_ENDPOINT + min(n, SLOT_SIZE - S_ENDPOINT)])
        return _HolderPresumed(pick, holder, beat, endpoint.decode("utf-8", "replace"))

    def _lost(self):
        """Raise SlotLost when another registration took the slot: its
        publisher writes the ring now, and two writers would interleave
        records the router must then discard with the worker's blocks."""
        if self._i[(self._slot_off + S_GEN) // 4] != self.generation:
            raise SlotLost("slot %d was registered again by another publisher" % self.slot)

    # -- ring ----------------------------------------------------------

    def _reserve(self, n):
        size = self._ring_bytes
        off = self._pos & (size - 1)
        pad = size - off if off + n > size else 0
        need = pad + n
        if size - (self._pos - self._tail_cache) < need:
            t = self._q[self._tail_w]
            if t > self._pos or self._pos - t > size:
                return None
            self._tail_cache = t
            if size - (self._pos - t) < need:
                return None
        if pad:
            struct.pack_into("<IB", self._mm, self._data + off, pad, PAD)
            off = 0
        return off, pad

    def _drop(self):
        self.seq += 1
        self.dropped += 1
        self._q[self._dropped_w] = self.dropped
        return False

    def _commit(self, pad, n):
        self._pos += pad + n
        self._q[self._head_w] = self._pos  # the commit point
        self._q[self._published_w] = self._q[self._published_w] + 1

    def _header(self, at, size, kind, flags, bs, count):
        self.seq += 1
        _HEAD.pack_into(self._mm, at, size, kind, flags, bs, self.seq, self.generation, count)

    def _write_stored(self, parent, hashes, tokens, n):
        """Write one Stored record of n blocks; hashes and tokens are
        packed already, so nothing here can fail after the header takes a
        sequence number (a number spent on no record reads as a gap, and
        the router drops the worker's whole view)."""
        size = STORED_HEAD + 8 * n + _align(len(tokens), 8)
        r = self._reserve(size)
        if r is None:
            return self._drop()
        off, pad = r
        at = self._data + off
        self._header(at, size, STORED, 0 if parent is None else FLAG_PARENT, self.block_size, n)
        struct.pack_into("<Q", self._mm, at + 24, 0 if parent is None else parent)
        self._mm[at + STORED_HEAD:at + STORED_HEAD + len(hashes)] = hashes
        tok = at + STORED_HEAD + len(hashes)
        end = tok + len(tokens)
        self._mm[tok:end] = tokens
        if end < at + size:
            self._mm[end:at + size] = bytes(at + size - end)
        self._commit(pad, size)
        return True

    # -- public API ----------------------------------------------------

    def stored(self, block_hashes, token_ids, parent_hash=None):
        """Publish that the engine cached these full blocks.

        block_hashes are the engine's 64-bit block hashes, token_ids the
        blocks' tokens (block_size per block, in order), parent_hash the
        engine hash of the first block's parent or None at a sequence
        start. Returns False if any record was dropped; raises SlotLost when
        another registration took the slot (as removed and cleared do).
        """
        bs, n = self.block_size, len(block_hashes)
        if len(token_ids) != n * bs:
            raise ValueError("%d blocks need %d tokens, got %d" % (n, n * bs, len(token_ids)))
        # Packed before any record is begun: a bad value raises here,
        # having written nothing.
        try:
            hashes = struct.pack("<%dQ" % n, *[h & U64 for h in block_hashes])
            tokens = struct.pack("<%dI" % len(token_ids), *token_ids)
            parent = None if parent_hash is None else parent_hash & U64
        except (struct.error, TypeError) as e:
            raise ValueError("cannot publish stored blocks: hashes must be integers and token ids integers "
                             "in [0, 2**32) (%s)" % e) from None
        with self._lock:
            self._check()
            self._lost()
            ok = True
            i = 0
            while i < n:
                k = min(n - i, self._max_blocks)
                ok = self._write_stored(parent, hashes[8 * i:8 * (i + k)], tokens[4 * bs * i:4 * bs * (i + k)], k) and ok
                parent = struct.unpack_from("<Q", hashes, 8 * (i + k - 1))[0]
                i += k
            return ok

    def removed(self, block_hashes):
        """Publish that the engine evicted these blocks."""
        try:
            hashes = [h & U64 for h in block_hashes]
        except TypeError as e:
            raise ValueError("cannot publish removed blocks: hashes must be integers (%s)" % e) from None
        with self._lock:
            self._check()
            self._lost()
            ok = True
            while hashes:
                chunk, hashes = hashes[:self._max_hashes], hashes[self._max_hashes:]
                size = RECORD_HEAD + 8 * len(chunk)
                r = self._reserve(size)
                if r is None:
                    ok = self._drop() and ok
                    continue
                off, pad = r
                at = self._data + off
                self._header(at, size, REMOVED, 0, 0, len(chunk))
                struct.pack_into("<%dQ" % len(chunk), self._mm, at + RECORD_HEAD, *chunk)
                self._commit(pad, size)
            return ok

    def cleared(self):
        """Publish that the engine dropped its whole cache."""
        with self._lock:
            self._check()
            self._lost()
            r = self._reserve(RECORD_HEAD)
            if r is None:
                return self._drop()
            off, pad = r
            self._header(self._data + off, RECORD_HEAD, CLEARED, 0, 0, 0)
            self._commit(pad, RECORD_HEAD)
            return True

    def load(self, running, waiting, kv_used_blocks, kv_total_blocks):
        """Publish the engine's load (seqlock write); nothing once another
        registration took the slot, whose publisher writes its page."""
        for name, v in (("running", running), ("waiting", waiting), ("kv_used_blocks", kv_used_blocks),
                        ("kv_total_blocks", kv_total_blocks)):
            check_uint(name, v, 64)  # before the seqlock write: a half-written page would stay
        with self._lock:
            self._check()
            if self._i[(self._slot_off + S_GEN) // 4] != self.generation:
                return
            page = LOAD_OFF + self.slot * LOAD_PAGE_SIZE
            q, w = self._q, (LOAD_OFF + self.slot * LOAD_PAGE_SIZE + L_SEQ) // 8
            v = q[w]
            if v & 1:
                v += 1
            q[w] = v + 1
            q[(page + L_RUNNING) // 8] = running
            q[(page + L_WAITING) // 8] = waiting
            q[(page + L_KV_USED) // 8] = kv_used_blocks
            q[(page + L_KV_TOTAL) // 8] = kv_total_blocks
            q[(page + L_UPDATED) // 8] = time.monotonic_ns()
            self._i[(page + L_GEN) // 4] = self.generation
            q[w] = v + 2

    def heartbeat(self):
        """Tell the router the engine is alive.

        If the router already marked the worker down (the engine was
        paused past the grace), the registration is revived as it was,
        generation and sequence numbers kept: the router keeps a down
        worker's blocks, and applies its events, for a while.
        Raises SlotLost or Retired when the publisher must register anew.
        """
        with self._lock:
            self._check()
            off = self._slot_off
            if self._q[(CONTROL_OFF + CONTROL_RETIRED) // 8]:
                raise Retired("the router recreated the segment")
            if self._replaced():
                raise Retired("the segment file was deleted or replaced")
            if self._i[(off + S_GEN) // 4] != self.generation:
                raise SlotLost("slot %d was registered again by another publisher" % self.slot)
            st = self._q[off // 8] & 0xFF
            if st == LIVE:
                self._q[(off + S_HEARTBEAT) // 8] = time.monotonic_ns()
                return
            if st != DOWN:
                raise SlotLost("slot %d is no longer live" % self.slot)
            self._lock_registry()
            try:
                word = self._q[off // 8]
                if word & 0xFF != DOWN or self._i[(off + S_GEN) // 4] != self.generation:
                    raise SlotLost("slot %d changed while reviving" % self.slot)
                self._q[(off + S_HEARTBEAT) // 8] = time.monotonic_ns()
                self._q[off // 8] = self._next_state(word, LIVE)
            finally:
                self._unlock_registry()

    def close(self, mark_closed=True):
        """Release the slot (the router drops this worker's blocks)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._forget()
            if mark_closed:
                off = self._slot_off
                self._lock_registry()
                try:
                    word = self._q[off // 8]
                    if word & 0xFF in (LIVE, DOWN) and self._i[(off + S_GEN) // 4] == self.generation:
                        self._q[off // 8] = self._next_state(word, CLOSED)
                finally:
                    self._unlock_registry()
            self._q.release()
            self._i.release()
            self._mm.close()
            os.close(self._fd)

    def _check(self):
        if self._closed:
            raise ValueError("publisher is closed")

    def _replaced(self):
        """Whether the path no longer names the mapped file: it was deleted
        (as the router's refusals advise) or another file took its name, so
        a router opening the path will never see this registration."""
        mine = os.fstat(self._fd)
        try:
            named = os.stat(self._path)
        except FileNotFoundError:
            return True
        return (mine.st_dev, mine.st_ino) != (named.st_dev, named.st_ino)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
