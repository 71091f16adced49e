"""A KV-event publisher built as vLLM's ZmqEventPublisher is, on libzmq
(pyzmq): a PUB socket, and a ROUTER replay socket at libzmq's default send
high-water mark (1,000 messages), which answers a replay request with its
whole buffer in one burst and the end marker, as
vllm/distributed/kv_events.py (_service_replay) does. libzmq's ROUTER
silently drops what exceeds the high-water mark while the reader is
behind, which Go's zmq4 does not do: the subscriber must cope with it.

Usage: py_libzmq_replay.py BATCHES BLOCK_SIZE
Prints "PUB_PORT REPLAY_PORT" once the batches are published (to nobody:
the subscriber comes later), then serves replay requests until stdin
closes.
"""

import struct
import sys
import threading
import time

import msgpack
import zmq

n, bs = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")

buffer = []
for seq in range(n):
    # One root block per batch: engine hash 1+seq, tokens seq*bs ...
    stored = ["BlockStored", [1 + seq], None, list(range(seq * bs, (seq + 1) * bs)), bs, None, "GPU"]
    payload = msgpack.packb([time.time(), [stored], 0])
    buffer.append((seq, payload))
    pub.send_multipart([b"kv", struct.pack(">q", seq), payload])

stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print(pub_port, replay_port, flush=True)
while not stop.is_set():
    if not router.poll(100):
        continue
    frames = router.recv_multipart()
    ident, start = frames[0], struct.unpack(">q", frames[-1])[0]
    for seq, payload in buffer:
        if seq >= start:
            router.send_multipart([ident, b"", struct.pack(">q", seq), payload])
    router.send_multipart([ident, b"", struct.pack(">q", -1), b""])
