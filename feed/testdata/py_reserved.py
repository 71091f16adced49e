"""Test driver: registers worker argv[2] with the Python publisher and
prints the slot it took, or "full" when no slot was left to it."""
import os
import sys

sys.path.insert(0, os.environ["KVFAST_PY_DIR"])
import kvfast_publisher  # noqa: E402

try:
    pub = kvfast_publisher.KvfastPublisher(sys.argv[1], worker_id=int(sys.argv[2]), model="test-model", block_size=4,
                                           endpoint="127.0.0.1:7790")
    print(pub.slot)
except kvfast_publisher.SegmentError as e:
    print("full" if "every worker slot is taken" in str(e) else "error: %s" % e)
os._exit(0)  # leave the registration live: the test reads the registry after
