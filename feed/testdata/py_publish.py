"""Test driver: publish a JSON-lines ops file through the Python publisher
(mode "direct"), through it across a revival (mode "revive"), or through
the vLLM adapter with stand-in event classes (mode "vllm"). Prints the
slot, generation and sequence number it registered and ended under."""
import json
import os
import sys

sys.path.insert(0, os.environ["KVFAST_PY_DIR"])
import kvfast_publisher  # noqa: E402

seg, ops_path, worker_id, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ops = [json.loads(line) for line in open(ops_path)]



def publish_direct(pub, ops):
    for o in ops:
        if o["op"] == "stored":
            assert pub.stored(o["hashes"], o["tokens"], o.get("parent"))
        elif o["op"] == "removed":
            assert pub.removed(o["hashes"])
        else:
            assert pub.cleared()


if mode == "revive":
    # A third of the ops, then wait (a line on stdin) while the router
    # marks the worker down; a third while down; heartbeat (the revival);
    # the rest.
    pub = kvfast_publisher.KvfastPublisher(seg, worker_id=worker_id, model="test-model", block_size=4,
                                           endpoint="http://127.0.0.1:7779")
    third = len(ops) // 3
    publish_direct(pub, ops[:third])
    print(pub.slot, pub.generation, pub.seq, flush=True)
    sys.stdin.readline()
    publish_direct(pub, ops[third:2 * third])
    pub.heartbeat()
    publish_direct(pub, ops[2 * third:])
    print(pub.slot, pub.generation, pub.seq, flush=True)
    os._exit(0)

if mode == "direct":
    pub = kvfast_publisher.KvfastPublisher(seg, worker_id=worker_id, model="test-model", block_size=4,
                                           dp_rank=3, kv_capacity_blocks=777, endpoint="http://127.0.0.1:7777")
    publish_direct(pub, ops)
    pub.load(running=5, waiting=2, kv_used_blocks=40, kv_total_blocks=777)
    pub.heartbeat()
    print(pub.slot, pub.generation, pub.seq, flush=True)
    # exit without close(): the worker stays live for the router to inspect
    os._exit(0)

# vLLM adapter with stand-ins for vllm.distributed.kv_events types; the
# adapter dispatches on the class name, so these are faithful.
import kvfast_vllm  # noqa: E402


class BlockStored:
    def __init__(self, block_hashes, parent_block_hash, token_ids, block_size, lora_id=None, medium="GPU"):
        self.block_hashes, self.parent_block_hash, self.token_ids = block_hashes, parent_block_hash, token_ids
        self.block_size, self.lora_id, self.medium = block_size, lora_id, medium


class BlockRemoved:
    def __init__(self, block_hashes, medium="GPU"):
        self.block_hashes, self.medium = block_hashes, medium


class AllBlocksCleared:
    pass


class KVEventBatch:
    def __init__(self, ts, events):
        self.ts, self.events = ts, events


os.environ.update(KVFAST_WORKER_ID=str(worker_id), KVFAST_MODEL="test-model", KVFAST_BLOCK_SIZE="4",
                  KVFAST_ENDPOINT="http://127.0.0.1:7778", KVFAST_HEARTBEAT_S="0.05")
pub = kvfast_vllm.KvfastEventPublisher(data_parallel_rank=1, endpoint=seg, enable_kv_cache_events=True)


def as_bytes(h):
    # vLLM's sha256-based hashes arrive as bytes; their low 64 bits,
    # big-endian, are the int vLLM would have sent, and the fold's result.
    return b"\xaa" * 24 + h.to_bytes(8, "big")


batch = []
for o in ops:
    if o["op"] == "stored":
        p = o.get("parent")
        batch.append(BlockStored([as_bytes(h) for h in o["hashes"]], None if p is None else as_bytes(p), o["tokens"], 4))
    elif o["op"] == "removed":
        batch.append(BlockRemoved([as_bytes(h) for h in o["hashes"]]))
    else:
        batch.append(AllBlocksCleared())
    if len(batch) == 7:
        pub.publish(KVEventBatch(0.0, batch))
        batch = []
pub.publish(KVEventBatch(0.0, batch))
# events the adapter must skip
pub.publish(KVEventBatch(0.0, [BlockStored([1], None, [1, 2, 3, 4], 4, medium="CPU"),
                               BlockStored([2], None, [1, 2, 3, 4], 4, lora_id=3)]))
assert pub.skipped == 2, pub.skipped
print(pub._pub.slot, pub._pub.generation, pub._pub.seq, flush=True)
os._exit(0)
