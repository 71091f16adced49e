"""Tests of the vLLM adapter on its own, without vLLM or a router:

    cd publishers/python && python3 -B -m unittest -v test_kvfast_vllm

The Go suite runs both publishers against the Go consumer (go test ./feed/,
testdata/py_*.py); these cover what needs no consumer: an engine that
starts before its router. The segment is formatted here as a router would
(docs/shm-layout.md: header, then an empty registry), which is all a
publisher reads.
"""

import os
import struct
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvfast_publisher  # noqa: E402
import kvfast_vllm  # noqa: E402

PAGE = 4096


def _align(n, a=PAGE):
    return (n + a - 1) // a * a


def _fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def format_segment(path, ring_bytes=4096, index_bytes=PAGE, bindings_bytes=256):
    """Create a layout-2 segment at path as the router does: formatted in a
    temporary file, header last, then renamed into place."""
    stride = 256 + ring_bytes
    index_off = _align(49152 + 64 * stride)
    bindings_off = _align(index_off + index_bytes)
    size = _align(bindings_off + bindings_bytes)
    hdr = bytearray(PAGE)
    hdr[0:8] = b"KVFASTSG"
    for fmt, off, v in [("<I", 8, 2), ("<I", 12, 4096), ("<Q", 16, size), ("<Q", 24, 0x1234),
                        ("<Q", 32, time.time_ns()), ("<I", 40, 64), ("<I", 44, 512),
                        ("<Q", 48, 4096), ("<Q", 56, 4096), ("<Q", 64, 8192), ("<Q", 72, 32768),
                        ("<Q", 80, 40960), ("<Q", 88, 8192), ("<Q", 96, 49152), ("<Q", 104, stride),
                        ("<Q", 112, ring_bytes), ("<Q", 120, index_off), ("<Q", 128, index_bytes),
                        ("<I", 160, 128), ("<I", 164, 256), ("<Q", 168, bindings_off),
                        ("<Q", 176, bindings_bytes)]:
        struct.pack_into(fmt, hdr, off, v)
    struct.pack_into("<Q", hdr, 248, _fnv1a64(hdr[:248]))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.truncate(size)
        f.write(hdr)
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def slot_state(path, slot):
    """The state and worker id a registry slot holds."""
    with open(path, "rb") as f:
        f.seek(kvfast_publisher.REGISTRY_OFF + slot * kvfast_publisher.SLOT_SIZE)
        word, = struct.unpack("<Q", f.read(8))
        f.seek(kvfast_publisher.REGISTRY_OFF + slot * kvfast_publisher.SLOT_SIZE + kvfast_publisher.S_WORKER_ID)
        worker, = struct.unpack("<Q", f.read(8))
    return word & 0xFF, worker


class BlockStored:
    """A stand-in for vllm.distributed.kv_events.BlockStored: the adapter
    dispatches on the class name."""

    def __init__(self, block_hashes, token_ids, block_size=4, parent_block_hash=None):
        self.block_hashes, self.token_ids, self.block_size = block_hashes, token_ids, block_size
        self.parent_block_hash, self.lora_id, self.medium = parent_block_hash, None, "GPU"


class BlockRemoved:
    def __init__(self, block_hashes):
        self.block_hashes, self.medium = block_hashes, "GPU"


class KVEventBatch:
    def __init__(self, events):
        self.ts, self.events = 0.0, events


def wait_for(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class EngineBeforeRouterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "kvfast")
        env = dict(KVFAST_WORKER_ID="7", KVFAST_MODEL="test-model", KVFAST_BLOCK_SIZE="4",
                   KVFAST_ENDPOINT="http://127.0.0.1:8007", KVFAST_HEARTBEAT_S="0.02")
        self.saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.dir.cleanup()

    def test_registers_once_the_segment_appears(self):
        # The engine starts first: constructing the publisher must not
        # raise (vLLM would stop the engine), and publishing before the
        # segment exists drops and counts the batch, without raising.
        pub = kvfast_vllm.KvfastEventPublisher(data_parallel_rank=0, endpoint=self.path, enable_kv_cache_events=True)
        slot = None
        try:
            self.assertIsNone(pub._pub)
            pub.publish(KVEventBatch([BlockStored([1], [1, 2, 3, 4])]))
            self.assertEqual(pub.dropped, 1)

            # The router creates the segment: a later heartbeat registers.
            format_segment(self.path)
            self.assertTrue(wait_for(lambda: pub._pub is not None), "not registered after the segment appeared")
            slot = pub._pub.slot
            self.assertEqual(slot_state(self.path, slot), (kvfast_publisher.LIVE, 7))

            # Events now reach the ring, and heartbeats keep the slot live
            # under this one registration.
            reg = pub._pub
            pub.publish(KVEventBatch([BlockStored([1, 2], list(range(8)))]))
            self.assertEqual(pub.dropped, 1)
            self.assertEqual(reg.seq, 1)
            time.sleep(0.2)
            self.assertIs(pub._pub, reg)
            self.assertEqual(slot_state(self.path, slot)[0], kvfast_publisher.LIVE)
        finally:
            pub.shutdown()
        self.assertEqual(slot_state(self.path, slot)[0], kvfast_publisher.CLOSED)
        self.assertFalse(pub._beat.is_alive())

    def test_shutdown_before_any_segment(self):
        pub = kvfast_vllm.KvfastEventPublisher(endpoint=self.path)
        pub.publish(KVEventBatch([]))
        pub.shutdown()
        self.assertFalse(pub._beat.is_alive())
        self.assertEqual(pub.dropped, 1)

    def test_misconfiguration_still_raises(self):
        # Waiting for the segment is for the one failure that time fixes:
        # a bad setting raises at once, segment or not.
        os.environ["KVFAST_BLOCK_SIZE"] = "0"
        with self.assertRaises(ValueError):
            kvfast_vllm.KvfastEventPublisher(endpoint=self.path)

    def test_heartbeat_period_is_checked_before_registering(self):
        # A bad period must stop the engine before it registers: a worker
        # registered by a publisher that then fails to start its heartbeat
        # stays listed until the router's grace passes.
        format_segment(self.path)
        for bad in ("1s", "0", "-1", "nan", "inf"):
            os.environ["KVFAST_HEARTBEAT_S"] = bad
            with self.assertRaises(ValueError, msg=bad) as cm:
                kvfast_vllm.KvfastEventPublisher(endpoint=self.path)
            self.assertIn("KVFAST_HEARTBEAT_S", str(cm.exception))
            self.assertEqual(slot_state(self.path, 0)[0], kvfast_publisher.FREE, bad)

    def test_model_is_required(self):
        # Registered without a model name, the worker would be listed under
        # none and the router would answer 404 for the served model.
        format_segment(self.path)
        for unset in ("", None):
            if unset is None:
                os.environ.pop("KVFAST_MODEL")
            else:
                os.environ["KVFAST_MODEL"] = unset
            with self.assertRaises(ValueError) as cm:
                kvfast_vllm.KvfastEventPublisher(endpoint=self.path)
            self.assertIn("KVFAST_MODEL", str(cm.exception))
            self.assertEqual(slot_state(self.path, 0)[0], kvfast_publisher.FREE)


    def test_endpoint_is_required(self):
        # Registered without a usable address, the router refuses the
        # worker and only its own log says so.
        format_segment(self.path)
        for bad in ("", "127.0.0.1", "http://127.0.0.1:0", "http://u:secret@127.0.0.1:8001", "http://127.0.0.1:8001/v1",
                    "https://127.0.0.1:8001", "::1:8001", "http://::1:8001", None):
            if bad is None:
                os.environ.pop("KVFAST_ENDPOINT")
            else:
                os.environ["KVFAST_ENDPOINT"] = bad
            with self.assertRaises(ValueError, msg=repr(bad)) as cm:
                kvfast_vllm.KvfastEventPublisher(endpoint=self.path)
            self.assertIn("KVFAST_ENDPOINT", str(cm.exception))
            self.assertNotIn("secret", str(cm.exception))
            self.assertEqual(slot_state(self.path, 0)[0], kvfast_publisher.FREE)
        for good in ("http://127.0.0.1:8001", "127.0.0.1:8001", "http://[::1]:8001/", "engine-0.local:80"):
            kvfast_publisher.check_endpoint(good)
        # Credentials are named as such, redacted, not mistaken for a
        # scheme or a path; a query is not quoted either.
        for bad, says in (("http://u:secret@127.0.0.1:8001", "holds credentials"), ("http://127.0.0.1:8001?key=secret", "query"),
                          ("http://u:p@127.0.0.1:8001?key=secret", "holds credentials"), ("127.0.0.1:8001?key=secret", "port"),
                          ("http://127.0.0.1:8001/tok-secret", "path"), ("u:secret@127.0.0.1:8001", "port")):
            with self.assertRaises(ValueError) as cm:
                kvfast_publisher.check_endpoint(bad)
            self.assertIn(says, str(cm.exception))
            self.assertNotIn("secret", str(cm.exception))


class AttachTest(unittest.TestCase):
    def test_missing_segment_says_what_to_do(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(FileNotFoundError) as cm:
                kvfast_publisher.KvfastPublisher(os.path.join(d, "seg"), 1, "m", 16, endpoint="127.0.0.1:8001")
            self.assertIn("start the router first", str(cm.exception))


    def test_short_file_is_not_a_segment(self):
        # The magic is checked before the size, as the router does: a
        # short file of data is not called a truncated segment, which would
        # suggest --recreate-segment (the router refuses to replace it).
        with tempfile.TemporaryDirectory() as d:
            for data, want in [(b"hello\n", "not a kvfast segment"), (b"not a segment, data", "not a kvfast segment"),
                               (b"", "truncated?"), (b"KVFASTSG", "truncated?")]:
                path = os.path.join(d, "seg")
                with open(path, "wb") as f:
                    f.write(data)
                with self.assertRaises(kvfast_publisher.SegmentError) as cm:
                    kvfast_publisher.KvfastPublisher(path, 1, "m", 16, endpoint="127.0.0.1:8001")
                self.assertIn(want, str(cm.exception), data)


class RegistrationTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "kvfast")

    def tearDown(self):
        self.dir.cleanup()

    def test_bad_arguments_write_nothing(self):
        # Checked before the registry slot is touched: a value that fails
        # half way would leave the slot claimed, its generation bumped.
        format_segment(self.path)
        good = dict(worker_id=1, model="m", block_size=16, dp_rank=0, kv_capacity_blocks=0, endpoint="127.0.0.1:8001")
        for name, bad in [("block_size", 16.0), ("block_size", True), ("dp_rank", -1), ("dp_rank", 1 << 32),
                          ("dp_rank", 0.5), ("kv_capacity_blocks", -1), ("worker_id", -1), ("worker_id", "1"),
                          ("endpoint", "127.0.0.1:\uff14\uff15")]:
            with self.assertRaises(ValueError, msg="%s=%r" % (name, bad)):
                kvfast_publisher.KvfastPublisher(self.path, **dict(good, **{name: bad}))
            self.assertEqual(slot_state(self.path, 0)[0], kvfast_publisher.FREE, "%s=%r" % (name, bad))

    def test_a_block_that_does_not_fit_the_ring_is_refused_before_registering(self):
        format_segment(self.path, ring_bytes=4096)
        for _ in range(3):
            with self.assertRaises(ValueError) as cm:
                kvfast_publisher.KvfastPublisher(self.path, 1, "m", 4096, endpoint="127.0.0.1:8001")
            self.assertIn("ring", str(cm.exception))
            self.assertEqual(slot_state(self.path, 0)[0], kvfast_publisher.FREE)

    def test_bad_load_writes_nothing(self):
        format_segment(self.path)
        p = kvfast_publisher.KvfastPublisher(self.path, 1, "m", 4, endpoint="127.0.0.1:8001")
        try:
            p.load(1, 2, 3, 4)
            page = kvfast_publisher.LOAD_OFF + p.slot * kvfast_publisher.LOAD_PAGE_SIZE
            before = bytes(p._mm[page:page + 64])
            for args in [(-1, 0, 0, 0), (1.5, 0, 0, 0), (0, 0, 1 << 64, 0), (0, 0, 0, "3")]:
                with self.assertRaises(ValueError, msg=repr(args)):
                    p.load(*args)
            self.assertEqual(bytes(p._mm[page:page + 64]), before)
        finally:
            p.close()


class BadEventTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "kvfast")
        format_segment(self.path)

    def tearDown(self):
        self.dir.cleanup()

    def test_bad_values_spend_no_sequence_number(self):
        # A number spent on no record reads as a gap: the router would drop
        # the worker's whole view for one bad call.
        p = kvfast_publisher.KvfastPublisher(self.path, 1, "m", 4, endpoint="127.0.0.1:8001")
        try:
            self.assertTrue(p.stored([1], [1, 2, 3, 4]))
            for hashes, tokens, parent in [([2], [1, 2, 3, -1], None), ([2], [1, 2, 3, 1 << 32], None),
                                           ([2], [1, 2, 3, 4.0], None), (["2"], [1, 2, 3, 4], None),
                                           ([2], [1, 2, 3, 4], 1.5)]:
                with self.assertRaises(ValueError):
                    p.stored(hashes, tokens, parent)
            with self.assertRaises(ValueError):
                p.removed([None])
            self.assertEqual(p.seq, 1)
            self.assertTrue(p.stored([2], [5, 6, 7, 8], 1))
            self.assertEqual(p.seq, 2)
        finally:
            p.close()

    def test_a_bad_event_costs_only_itself(self):
        os.environ.update(KVFAST_WORKER_ID="8", KVFAST_MODEL="m", KVFAST_BLOCK_SIZE="4",
                          KVFAST_ENDPOINT="http://127.0.0.1:8008")
        try:
            pub = kvfast_vllm.KvfastEventPublisher(endpoint=self.path)
        finally:
            for k in ("KVFAST_WORKER_ID", "KVFAST_MODEL", "KVFAST_BLOCK_SIZE", "KVFAST_ENDPOINT"):
                os.environ.pop(k)
        try:
            self.assertTrue(wait_for(lambda: pub._pub is not None), "not registered")
            reg = pub._pub
            # Token ids over 3 blocks for 2 named ones (vLLM's null blocks
            # of a sliding-window group): skipped, and the removal after it
            # in the batch still published.
            pub.publish(KVEventBatch([BlockStored([1, 2], list(range(12))), BlockRemoved([7])]))
            self.assertEqual((pub.skipped, pub.dropped, reg.seq), (1, 0, 1))
            # A store with a bad token id: dropped, the removal still goes.
            pub.publish(KVEventBatch([BlockStored([3], [1, 2, 3, -1]), BlockRemoved([8])]))
            self.assertEqual((pub.dropped, reg.seq), (1, 2))
            # A store whose blocks the engine hashed with extra keys (an
            # image's hash, a cache salt) or for a LoRA adapter: skipped,
            # never stored as plain tokens another request would match.
            salted = BlockStored([5], [1, 2, 3, 4])
            salted.extra_keys = [("salt-a",)]
            adapter = BlockStored([6], [1, 2, 3, 4])
            adapter.lora_name = "sql"
            plain = BlockStored([7], [1, 2, 3, 4])
            plain.extra_keys = [None]
            pub.publish(KVEventBatch([salted, adapter, plain]))
            self.assertEqual((pub.skipped, pub.dropped, reg.seq), (3, 1, 3))
            # Another block size: skipped, and said once in the log.
            with self.assertLogs("kvfast", "WARNING") as logs:
                pub.publish(KVEventBatch([BlockStored([9], list(range(8)), block_size=8)] * 2))
            self.assertEqual(len(logs.output), 1)
            self.assertIn("KVFAST_BLOCK_SIZE", logs.output[0])
            self.assertEqual((pub.skipped, reg.seq), (5, 3))
            # A removal that cannot be published clears the worker's view
            # instead: the router must not go on claiming what it removed.
            pub.publish(KVEventBatch([BlockRemoved([object()])]))
            self.assertEqual((pub.dropped, reg.seq), (2, 4))
            kind = reg._mm[reg._data + reg._pos - kvfast_publisher.RECORD_HEAD + 4]
            self.assertEqual(kind, kvfast_publisher.CLEARED)
            # A hybrid model's other groups: skipped, and said once. Stored
            # as group 0's, a group-0 removal had left the block claimed.
            window_store = BlockStored([10], [1, 2, 3, 4])
            window_store.group_idx = 1
            window_removal = BlockRemoved([10])
            window_removal.group_idx = 1
            full_store = BlockStored([10], [1, 2, 3, 4])
            full_store.group_idx = 0
            with self.assertLogs("kvfast", "WARNING") as logs:
                pub.publish(KVEventBatch([full_store, window_store, window_removal, window_store]))
            self.assertEqual(len(logs.output), 1)
            self.assertIn("hybrid", logs.output[0])
            self.assertEqual((pub.skipped, reg.seq), (8, 5))
        finally:
            pub.shutdown()


if __name__ == "__main__":
    unittest.main()
