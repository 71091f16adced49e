"""Test driver: the Python publisher refuses a worker id a live engine
holds (argv[2]) and stops writing a ring once another registration took
its slot. Prints one word per check that held."""
import os
import sys

sys.path.insert(0, os.environ["KVFAST_PY_DIR"])
import kvfast_publisher  # noqa: E402

seg, held_id, free_id, unseen_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fds = len(os.listdir("/proc/self/fd"))
for _ in range(3):
    try:
        kvfast_publisher.KvfastPublisher(seg, worker_id=held_id, model="test-model", block_size=4, endpoint="127.0.0.1:7790")
        print("registered-over-a-live-holder")
    except kvfast_publisher.WorkerLive as e:
        if "give each engine its own worker id" not in str(e):
            print("refused-without-advice:%s" % e)
if len(os.listdir("/proc/self/fd")) != fds:
    print("leaked-descriptors")
print("refused")

# A holder whose process cannot be seen (another PID namespace, as far as
# this process can tell) while it heartbeats: an engine that registers
# again after losing its slot (displaced) watches it and is refused; a
# first registration takes it for dead.
try:
    kvfast_publisher.KvfastPublisher(seg, worker_id=unseen_id, model="test-model", block_size=4, endpoint="127.0.0.1:7790",
                                     displaced=True)
    print("displaced-took-back-its-slot")
except kvfast_publisher.WorkerLive:
    print("displaced-refused")

pub = kvfast_publisher.KvfastPublisher(seg, worker_id=free_id, model="test-model", block_size=4, endpoint="127.0.0.1:7790")
gen_word = (kvfast_publisher.REGISTRY_OFF + pub.slot * kvfast_publisher.SLOT_SIZE + kvfast_publisher.S_GEN) // 4
pub._i[gen_word] = pub.generation + 1  # as another registration's claim does
try:
    pub.stored([1], [1, 2, 3, 4])
    print("wrote-a-lost-slot")
except kvfast_publisher.SlotLost:
    print("lost")
os._exit(0)
