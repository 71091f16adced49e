"""Test driver: two publishers of one process, the registry lock held by
the first (its own descriptor) while a thread of the same process asks for
it through the second. POSIX record locks belong to the process, so the
second got it at once and two threads could claim one slot; it must wait.
Prints "waited" when the second got the lock only after the first let go,
"overlapped" when it got it while the first held it."""
import os
import sys
import threading

sys.path.insert(0, os.environ["KVFAST_PY_DIR"])
import kvfast_publisher  # noqa: E402

a = kvfast_publisher.KvfastPublisher(sys.argv[1], worker_id=51, model="test-model", block_size=4, endpoint="127.0.0.1:7791")
b = kvfast_publisher.KvfastPublisher(sys.argv[1], worker_id=52, model="test-model", block_size=4, endpoint="127.0.0.1:7792")
held = threading.Event()
got = threading.Event()
released = threading.Event()
result = []


def second():
    held.wait()
    b._lock_registry()
    result.append("waited" if released.is_set() else "overlapped")
    b._unlock_registry()
    got.set()


t = threading.Thread(target=second)
t.start()
a._lock_registry()
held.set()
# The second thread asks now; it must still be waiting when the first lets
# go (a late start only makes a correct lock look correct).
got.wait(0.3)
released.set()
a._unlock_registry()
got.wait(60)
t.join(60)
print(result[0] if result else "stuck")
a.close()
b.close()
